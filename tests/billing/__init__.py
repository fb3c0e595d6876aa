"""Tests of tpuops/billing (the folder mirrors the wing it tests; docs/testing.md)."""
