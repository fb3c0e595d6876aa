"""A local emulator of the Cloud TPU v2 REST API (docs/design.md, "The local Cloud TPU emulator").

The official google-cloud-tpu client (REST transport) talks to it on 127.0.0.1. A node is a
sandbox directory plus a process group that runs the node's ``startup-script`` with bash,
next to a GCE-style metadata server. Faults, preemptions and the billing truth are reached
through the admin API under ``/_admin`` on the same port.

Only the standard library is used here, so the emulator starts fast and has no version
coupling with the client it serves. ``control`` starts and stops it as a background process.
"""
