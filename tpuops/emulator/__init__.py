"""A local emulator of the Cloud TPU v2 REST API (docs/emulator.md; docs/design.md, "The local Cloud TPU emulator").

The official google-cloud-tpu client talks to it on 127.0.0.1. Its wings, from the ground up: ``vm/`` (what
a worker runs on), ``cloud/`` (nodes, slices, operations, billing truth), ``gcs/`` (Cloud Storage for a
``gs://`` store), ``api/`` (the HTTP surfaces); ``server`` wires them into one process and ``control``
starts, finds and stops that process from outside. Every wing stands on the ground beside them
(``apierror``, ``faults``, ``fsutil``, ``background``, ``stats``). Each wing's docstring says what it may import.

The Cloud TPU API, the nodes and the metadata servers use the standard library only, so the
emulator starts fast and has no version coupling with the client it serves. Serving a ``gs://``
store adds two dependencies, loaded only then: ``cryptography`` (``tls``: the CA and the storage
hosts' certificate) and the fake-gcs-server binary (``storage``). ``control`` starts and stops it
as a background process and imports ``storage`` lazily.

May import: the standard library, ``cryptography`` and the fake-gcs-server binary (a ``gs://`` store
only), and from tpuops only ``tpuops.emulator`` itself, ``tpuops.core`` and what it serves from the seam
(``tpuops.providers``: the Cloud TPU catalog, the first-minute billing rule). The rule holds for the whole
wing, every module under ``tpuops/emulator/`` in whatever sub-wing it sits. Nothing it stands in for is
imported: the emulator is a cloud, so the control plane reaches it over HTTP only, and the wiring
(``tpuops.session``), ``tpuops doctor`` and the front door start and stop it (``control``).

This file is the face: the names below are all that the rest of tpuops (``session``, ``doctor``, ``api``,
the CLI), the benchmarks and the Makefile use; ``tests/house/test_wings.py`` refuses an import past it. It loads
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
