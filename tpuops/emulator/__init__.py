"""A local emulator of the Cloud TPU v2 REST API (docs/emulator.md; docs/design.md, "The local Cloud TPU emulator").

The official google-cloud-tpu client talks to it on 127.0.0.1. Its wings, from the ground up: ``vm/`` (what
a worker runs on), ``cloud/`` (nodes, slices, operations, billing truth), ``gcs/`` (Cloud Storage for a
``gs://`` store), ``api/`` (the HTTP surfaces); ``server`` wires them into one process and ``control``
starts, finds and stops that process from outside. Every wing stands on the ground beside them
(``apierror``, ``faults``, ``fsutil``, ``background``, ``stats``). Each wing's docstring says what it may import.

This file is the face: the names below are all that the rest of tpuops (``session``, ``doctor``, ``api``,
the CLI), the benchmarks and the Makefile use; ``tests/test_wings.py`` refuses an import past it. It loads
the standard library only: ``gcs`` (``cryptography``) is loaded when a ``gs://`` store is served.
"""

from tpuops.emulator.control import (
    AdminClient,
    EmulatorInfo,
    check_faults,
    ensure_running,
    read_token,
    served_buckets,
    start_background,
    status,
    stop,
    storage_endpoint,
    storage_front,
    storage_problem,
    token_for,
)
from tpuops.emulator.vm.netview import enter_command, unavailable_reason

__all__ = ["AdminClient", "EmulatorInfo", "check_faults", "ensure_running", "enter_command", "read_token",
           "served_buckets", "start_background", "status", "stop", "storage_endpoint", "storage_front",
           "storage_problem", "token_for", "unavailable_reason"]
