"""Tests of tpuops/sweeps (the folder mirrors the wing it tests; docs/testing.md)."""
