"""Tests of tpuops/tfenv (the folder mirrors the wing it tests; docs/testing.md)."""
