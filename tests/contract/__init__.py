"""Tests of tpuops/contract (the folder mirrors the wing it tests; docs/testing.md)."""
