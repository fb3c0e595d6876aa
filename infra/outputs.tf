output "store" {
  value       = "gs://${google_storage_bucket.store.name}/${var.store_prefix}"
  description = "The value for `store` in tpuops.toml."
}

output "vm_service_account" {
  value       = google_service_account.vm.email
  description = "Service account the TPU VMs run as."
}

output "operator_role" {
  value       = google_project_iam_custom_role.operator.name
  description = "Custom role with exactly what a tpuops user needs."
}

output "wake_job" {
  value       = try(module.reconcile[0].wake_job, "")
  description = "With a reconcile image: the value for `wake_job` in tpuops.toml (empty without the reconcile job)."
}
