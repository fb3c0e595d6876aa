"""Tests of tpuops/store (the folder mirrors the wing it tests; docs/testing.md)."""
