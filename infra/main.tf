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
  for_each = toset(["tpu.googleapis.com", "storage.googleapis.com", "iam.googleapis.com",
  "run.googleapis.com", "cloudscheduler.googleapis.com"])
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

# TPU VMs run as this account, with least privilege: a custom role that can only read and
# delete Cloud TPU nodes and read operations (the dead-man's switch deletes the VM's own node;
# Cloud TPU has no per-node IAM policy, so "its own node" is enforced by the startup script and,
# where the organisation allows IAM conditions on Cloud TPU, by tpu_node_condition), and object
# access limited to the store prefix of the bucket. No roles/tpu.admin.
resource "google_service_account" "vm" {
  account_id   = "tpuops-vm"
  display_name = "tpuops TPU VMs"
}

resource "google_project_iam_custom_role" "vm" {
  role_id     = "tpuopsVm"
  title       = "tpuops TPU VM"
  description = "What a tpuops TPU VM needs: get and delete its own node, read operations."
  permissions = ["tpu.nodes.get", "tpu.nodes.delete", "tpu.operations.get"]
}

resource "google_project_iam_member" "vm_tpu" {
  project = var.project
  role    = google_project_iam_custom_role.vm.name
  member  = "serviceAccount:${google_service_account.vm.email}"

  dynamic "condition" {
    for_each = var.tpu_node_condition ? [1] : []
    content {
      title      = "tpuops nodes only"
      expression = "resource.name.extract(\"/nodes/{name}\").startsWith(\"${var.node_prefix}\")"
    }
  }
}

# Objects under the store prefix only (uniform bucket-level access makes the condition hold).
resource "google_project_iam_custom_role" "vm_objects" {
  role_id     = "tpuopsVmObjects"
  title       = "tpuops TPU VM store objects"
  description = "Read and write objects of the tpuops store."
  permissions = ["storage.objects.create", "storage.objects.delete", "storage.objects.get"]
}

resource "google_storage_bucket_iam_member" "vm_objects" {
  bucket = google_storage_bucket.store.name
  role   = google_project_iam_custom_role.vm_objects.name
  member = "serviceAccount:${google_service_account.vm.email}"
  condition {
    title      = "store prefix only"
    expression = "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.store.name}/objects/${var.store_prefix}/\")"
  }
}

# Listing is checked on the bucket, not on objects, so it cannot carry the prefix condition.
resource "google_project_iam_custom_role" "vm_list" {
  role_id     = "tpuopsVmList"
  title       = "tpuops TPU VM store listing"
  description = "List objects of the tpuops store bucket."
  permissions = ["storage.objects.list"]
}

resource "google_storage_bucket_iam_member" "vm_list" {
  bucket = google_storage_bucket.store.name
  role   = google_project_iam_custom_role.vm_list.name
  member = "serviceAccount:${google_service_account.vm.email}"
}

resource "google_project_iam_member" "vm_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.vm.email}"
}

# The people (or CI) who run tpuops from a laptop: exactly the permissions its calls need
# (tpuops doctor checks these with testIamPermissions), plus acting as the VM account.
resource "google_project_iam_custom_role" "operator" {
  role_id     = "tpuopsOperator"
  title       = "tpuops operator"
  description = "Create, watch, stop, start and delete Cloud TPU nodes and queued resources for tpuops."
  permissions = [
    "tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.nodes.list", "tpu.nodes.start",
    "tpu.nodes.stop", "tpu.operations.get", "tpu.queuedResources.create", "tpu.queuedResources.delete",
    "tpu.queuedResources.get", "tpu.queuedResources.list", "tpu.acceleratortypes.list",
    "tpu.runtimeversions.list", "tpu.locations.list", "serviceusage.services.get",
  ]
}

resource "google_project_iam_member" "operators" {
  for_each = toset(var.operators)
  project  = var.project
  role     = google_project_iam_custom_role.operator.name
  member   = each.key
}

resource "google_service_account_iam_member" "operators_act_as_vm" {
  for_each           = toset(var.operators)
  service_account_id = google_service_account.vm.name
  role               = "roles/iam.serviceAccountUser"
  member             = each.key
}

resource "google_storage_bucket_iam_member" "operators_objects" {
  for_each = toset(var.operators)
  bucket   = google_storage_bucket.store.name
  role     = "roles/storage.objectAdmin"
  member   = each.key
}

# Optional: `tpuops reconcile` every few minutes from Cloud Scheduler on Cloud Run Jobs, so that
# recovery and sweeps need neither a laptop nor an always-on VM.
module "reconcile" {
  source           = "./modules/reconcile"
  count            = var.reconcile_image == "" ? 0 : 1
  project          = var.project
  region           = var.region
  image            = var.reconcile_image
  schedule         = var.reconcile_schedule
  store            = "gs://${google_storage_bucket.store.name}/${var.store_prefix}"
  zones            = var.zones
  operator_role    = google_project_iam_custom_role.operator.name
  vm_account_name  = google_service_account.vm.name
  vm_account_email = google_service_account.vm.email
  bucket           = google_storage_bucket.store.name
}
