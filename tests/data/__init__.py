"""Tests of tpuops/data (the folder mirrors the wing it tests; docs/testing.md)."""
