"""Tests of tpuops/house (the folder mirrors the wing it tests; docs/testing.md)."""
