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
