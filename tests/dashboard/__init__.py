"""Tests of tpuops/dashboard (the folder mirrors the wing it tests; docs/testing.md)."""
