"""Tests of tpuops/cli (the folder mirrors the wing it tests; docs/testing.md)."""
