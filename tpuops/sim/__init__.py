"""A virtual-time Cloud TPU that drives the real controller and sweep passes.

The cloud is a node provider like any other (``tpuops.providers.simulated`` on the assumptions of
``tpuops.providers.cloud_model``); here ``model`` holds the agent's measured segments, ``agent`` the stand-in
that writes ``status.json`` through the store as the agent does, ``world`` the one world object that
holds the cloud and its agents on one virtual clock (the control plane sees only its provider), and
``engine`` the loop that moves the world from one controller pass to the next and reports what happened;
``swarm`` the seeded fault swarm that plays faults through that loop and checks invariants (docs/testing.md).

May import: what it drives and what it models, below it: ``tpuops.core``, ``tpuops.config``,
``tpuops.store``, ``tpuops.runs``, ``tpuops.billing``, ``tpuops.providers`` (the simulated cloud and its
model), ``tpuops.launch`` and ``tpuops.sweeps`` (scenarios from experiment and sweep files), the
``tpuops.controller`` and the ``tpuops.fleet`` (the real passes), the ``tpuops.session`` wiring (a scenario's
settings), the agent's contract (``tpuops.contract``: its checkpoint interval rule) and ``tpuops.notify`` (the
swarm's receivers stand in at its wire, ``tpuops.notify.wire``, and read what it decided). Never the front door,
which stands on it (``simulate``, ``forecast``), the emulator or a UI.
"""
