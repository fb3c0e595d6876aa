"""Tests of tpuops/emulator (the folder mirrors the wing it tests; docs/testing.md)."""
