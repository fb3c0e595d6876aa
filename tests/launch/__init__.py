"""Tests of tpuops/launch (the folder mirrors the wing it tests; docs/testing.md)."""
