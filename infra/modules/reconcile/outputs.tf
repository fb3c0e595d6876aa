output "job" {
  value       = google_cloud_run_v2_job.reconcile.name
  description = "The Cloud Run job that runs `tpuops reconcile`."
}
