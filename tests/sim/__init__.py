"""Tests of tpuops/sim (the folder mirrors the wing it tests; docs/testing.md)."""
