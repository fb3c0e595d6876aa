"""Tests of tpuops/controller (the folder mirrors the wing it tests; docs/testing.md)."""
