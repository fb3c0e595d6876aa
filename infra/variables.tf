variable "project" {
  type        = string
  description = "GCP project id."
}

variable "region" {
  type        = string
  default     = "us-central1"
  description = "Region of the TPU zones you use (v3-8: us-central1-a/b)."
}

variable "bucket" {
  type        = string
  description = "Name of the store bucket (globally unique)."
}

variable "bundle_retention_days" {
  type        = number
  default     = 30
  description = "Days to keep content-addressed job bundles."
}

variable "store_prefix" {
  type        = string
  default     = "tpuops"
  description = "Object prefix of the store in the bucket (store = gs://BUCKET/PREFIX); the VMs may touch nothing else."
}

variable "node_prefix" {
  type        = string
  default     = "tpuops-"
  description = "Name prefix of the nodes tpuops creates (used by the optional IAM condition)."
}

variable "tpu_node_condition" {
  type        = bool
  default     = false
  description = "Restrict the VM role to nodes named node_prefix* with an IAM condition (where Cloud TPU honours it)."
}

variable "operators" {
  type        = list(string)
  default     = []
  description = "Members who run tpuops (\"user:me@example.com\", \"group:...\"): granted the tpuopsOperator role."
}

variable "zones" {
  type        = list(string)
  default     = ["us-central1-a", "us-central1-b"]
  description = "Zones tpuops uses (given to the scheduled reconcile job)."
}

variable "reconcile_image" {
  type        = string
  default     = ""
  description = "Container image of tpuops (infra/reconcile/Dockerfile); empty: no scheduled reconcile."
}

variable "reconcile_schedule" {
  type        = string
  default     = "*/5 * * * *"
  description = "Cron schedule of the reconcile job (Cloud Scheduler syntax, UTC)."
}
