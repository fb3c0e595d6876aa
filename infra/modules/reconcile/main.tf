# `tpuops reconcile` as a Cloud Run Job, started by Cloud Scheduler: recovery of preempted runs
# and sweeps go on with no laptop and no always-on VM. The job runs as its own service account
# with the tpuops operator role, may act as the VMs' account (to create nodes that run as it),
# and reads and writes the store.

resource "google_service_account" "reconcile" {
  project      = var.project
  account_id   = "tpuops-reconcile"
  display_name = "tpuops scheduled reconcile"
}

resource "google_project_iam_member" "operator" {
  project = var.project
  role    = var.operator_role
  member  = "serviceAccount:${google_service_account.reconcile.email}"
}

resource "google_service_account_iam_member" "act_as_vm" {
  service_account_id = var.vm_account_name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.reconcile.email}"
}

resource "google_storage_bucket_iam_member" "store" {
  bucket = var.bucket
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.reconcile.email}"
}

resource "google_cloud_run_v2_job" "reconcile" {
  project  = var.project
  name     = "tpuops-reconcile"
  location = var.region

  template {
    task_count = 1
    template {
      service_account = google_service_account.reconcile.email
      max_retries     = 0
      timeout         = "600s"
      containers {
        image = var.image
        args  = ["reconcile", "--json"]
        env {
          name  = "TPUOPS_PROVIDER"
          value = "gcp"
        }
        env {
          name  = "TPUOPS_PROJECT"
          value = var.project
        }
        env {
          name  = "TPUOPS_ZONES"
          value = join(",", var.zones)
        }
        env {
          name  = "TPUOPS_STORE"
          value = var.store
        }
        env {
          name  = "TPUOPS_HOME"
          value = "/tmp/tpuops"
        }
      }
    }
  }
}

# The wake-up: after its save on a preemption notice, a TPU VM's agent starts this job at once
# (Cloud Run Admin API jobs.run with the VM's metadata token) instead of leaving the recovery to the
# next scheduled run. Least privilege: the VMs' account may run this one job and nothing else
# (roles/run.invoker on the job resource, no project-level Cloud Run role, no overrides).
resource "google_cloud_run_v2_job_iam_member" "vm_wakes_job" {
  project  = var.project
  location = var.region
  name     = google_cloud_run_v2_job.reconcile.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${var.vm_account_email}"
}

# Cloud Scheduler calls the Cloud Run Admin API's jobs.run with an OAuth token of this account.
resource "google_service_account" "scheduler" {
  project      = var.project
  account_id   = "tpuops-reconcile-scheduler"
  display_name = "tpuops reconcile scheduler"
}

resource "google_cloud_run_v2_job_iam_member" "scheduler_runs_job" {
  project  = var.project
  location = var.region
  name     = google_cloud_run_v2_job.reconcile.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.scheduler.email}"
}

resource "google_cloud_scheduler_job" "reconcile" {
  project   = var.project
  region    = var.region
  name      = "tpuops-reconcile"
  schedule  = var.schedule
  time_zone = "Etc/UTC"

  http_target {
    http_method = "POST"
    uri         = "https://run.googleapis.com/v2/projects/${var.project}/locations/${var.region}/jobs/${google_cloud_run_v2_job.reconcile.name}:run"
    oauth_token {
      service_account_email = google_service_account.scheduler.email
    }
  }
}
