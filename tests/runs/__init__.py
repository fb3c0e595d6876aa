"""Tests of tpuops/runs (the folder mirrors the wing it tests; docs/testing.md)."""
