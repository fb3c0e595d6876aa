"""Tests of tpuops/core (the folder mirrors the wing it tests; docs/testing.md)."""
