output "store" {
  value       = "gs://${google_storage_bucket.store.name}/tpuops"
  description = "The value for `store` in tpuops.toml."
}

output "vm_service_account" {
  value       = google_service_account.vm.email
  description = "Service account the TPU VMs run as."
}
