"""tpuops' tests, one folder per wing (docs/testing.md says where a new test file goes).

A package so that two wings may hold test files of the same name: pytest names each module from
here (``tests.runs.test_runs``). The support modules beside this file (helpers, fake_gcs, lanes, ...)
are imported by their bare names (pyproject's ``pythonpath = ["tests"]``); ``tests/agent`` is not part
of the package: it runs in the TF runtime with its own conftest.
"""
