"""Tests of tpuops/accounting (the folder mirrors the wing it tests; docs/testing.md)."""
