variable "project" {
  type        = string
  description = "GCP project id."
}

variable "region" {
  type        = string
  description = "Region of the Cloud Run job and the scheduler."
}

variable "image" {
  type        = string
  description = "tpuops container image (built from infra/reconcile/Dockerfile)."
}

variable "schedule" {
  type        = string
  description = "Cron schedule (UTC)."
}

variable "store" {
  type        = string
  description = "The store URI (gs://BUCKET/PREFIX)."
}

variable "zones" {
  type        = list(string)
  description = "Zones tpuops uses."
}

variable "operator_role" {
  type        = string
  description = "The tpuops operator custom role (projects/P/roles/tpuopsOperator)."
}

variable "vm_account_name" {
  type        = string
  description = "Resource name of the TPU VMs' service account."
}

variable "bucket" {
  type        = string
  description = "Store bucket name."
}

variable "vm_account_email" {
  type        = string
  description = "Email of the TPU VMs' service account: it may run this job (the wake-up), nothing else."
}
