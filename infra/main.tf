# What tpuops needs in a GCP project: the APIs, one bucket for the store (data, bundles,
# runs, leases), and a service account for the TPU VMs. Apply once per project:
#   terraform init && terraform apply -var project=my-project -var bucket=my-project-tpuops
# then: tpuops init --provider gcp --project my-project --zone us-central1-a \
#         --store gs://my-project-tpuops/tpuops

terraform {
  required_version = ">= 1.3"
  required_providers {
    google = { source = "hashicorp/google", version = ">= 5.0" }
  }
}

provider "google" {
  project = var.project
  region  = var.region
}

resource "google_project_service" "apis" {
  for_each           = toset(["tpu.googleapis.com", "storage.googleapis.com", "iam.googleapis.com"])
  service            = each.key
  disable_on_destroy = false
}

# The store lives in the TPU's region: cross-region reads are slower and billed as egress.
resource "google_storage_bucket" "store" {
  name                        = var.bucket
  location                    = upper(var.region)
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  versioning { enabled = false }
  lifecycle_rule {
    condition {
      age            = var.bundle_retention_days
      matches_prefix = ["tpuops/bundles/"]
    }
    action { type = "Delete" }
  }
  depends_on = [google_project_service.apis]
}

# TPU VMs run as this account: they read data and bundles, write runs/, and may delete
# their own node when the job ends (the dead-man's switch).
resource "google_service_account" "vm" {
  account_id   = "tpuops-vm"
  display_name = "tpuops TPU VMs"
}

resource "google_storage_bucket_iam_member" "vm_objects" {
  bucket = google_storage_bucket.store.name
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.vm.email}"
}

resource "google_project_iam_member" "vm_tpu" {
  project = var.project
  role    = "roles/tpu.admin"
  member  = "serviceAccount:${google_service_account.vm.email}"
}

resource "google_project_iam_member" "vm_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.vm.email}"
}
