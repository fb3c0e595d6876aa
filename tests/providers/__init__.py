"""Tests of tpuops/providers (the folder mirrors the wing it tests; docs/testing.md)."""
