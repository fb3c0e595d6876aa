"""The reconcile controller (docs/design.md, "Control flow: declare, then reconcile").

What the controller remembers of each run is ``tpuops.runs.Memory`` (in the store, so any
controller can pick it up); ``decide`` turns one run's desired and observed state into actions
without any I/O, ``reconcile`` runs a pass (read, decide, apply) under the store's leases
(``tpuops.store.lease``: two controllers never act on one run) and ``drive`` runs passes for one
run until it ends. A pass may be killed at any line; the next one finishes the job.
"""
