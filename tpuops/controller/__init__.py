"""The reconcile controller (docs/design.md, "Control flow: declare, then reconcile").

What the controller remembers of each run is ``tpuops.runs.Memory`` (in the store, so any
controller can pick it up); ``decide`` turns one run's desired and observed state into actions
without any I/O, ``reconcile`` runs a pass (read, decide, apply) under the store's leases
(``tpuops.store.lease``: two controllers never act on one run) and ``drive`` runs passes for one
run until it ends. A pass may be killed at any line; the next one finishes the job.

May import: ``tpuops.core``, ``tpuops.config``, ``tpuops.store``, ``tpuops.runs``, ``tpuops.billing``,
``tpuops.accounting`` (a driven run's goodput), ``tpuops.providers`` (the neutral node vocabulary),
``tpuops.notify``, the ``tpuops.fleet`` and the agent's contract (``tpuops.contract``: the wake marker);
never the sweeps, the launch planning, the simulator or the front door, which stand above it. The sweeps ride
on its passes all the same: the controller defines what a pass runs besides its runs (``reconcile.PassStep``),
and whoever builds a controller hands it the sweeps' step (``tpuops.api.controller`` and the simulator give
``tpuops.sweeps.advance.SweepStep``).
"""
