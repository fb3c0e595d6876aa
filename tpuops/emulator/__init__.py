"""A local emulator of the Cloud TPU v2 REST API (docs/design.md, "The local Cloud TPU emulator").

The official google-cloud-tpu client (REST transport) talks to it on 127.0.0.1. A node is a
sandbox directory plus a process group that runs the node's ``startup-script`` with bash,
next to a GCE-style metadata server. Faults, preemptions and the billing truth are reached
through the admin API under ``/_admin`` on the same port.

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
"""
