output "job" {
  value       = google_cloud_run_v2_job.reconcile.name
  description = "The Cloud Run job that runs `tpuops reconcile`."
}

output "wake_job" {
  value       = "projects/${var.project}/locations/${var.region}/jobs/${google_cloud_run_v2_job.reconcile.name}"
  description = "The job's full name: `wake_job` in tpuops.toml, so that a preempted node's agent starts it."
}
