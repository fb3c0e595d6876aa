"""Tests of tpuops/notify (the folder mirrors the wing it tests; docs/testing.md)."""
