"""The emulated Cloud TPU: nodes, slices, operations, queued resources, and the billing truth.

``state.EmulatorState`` holds every node and operation under one lock and answers the API's mutations;
``slices.SliceLifecycle`` moves a node's workers through a boot, a preemption and an end (their metadata
servers, runtimes and scripts); ``queued`` provisions queued resources over the state. ``nodes`` are the
records and their v2 JSON, ``operations`` the long-running operations, ``wire`` the proto3 JSON details
both share, ``catalog`` what the service offers and refuses, ``billing`` every interval a node spent
READY, ``scheduler`` the one timer thread. The HTTP surfaces (``tpuops.emulator.api``) stand above it.

May import: ``tpuops.emulator.cloud``, ``tpuops.emulator.vm`` (a worker's machine), the emulator's ground
(``apierror``, ``faults``, ``fsutil``) and the standard-library-only ``tpuops.providers.cloud_tpu.catalog`` and
``tpuops.providers.cloud_tpu.billing_rules``; the standard library only.
"""
