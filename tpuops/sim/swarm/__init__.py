"""The fault swarm: seeded scenarios and fault schedules played through the real controller in virtual time, with
invariants checked after every pass and at the end (docs/testing.md, "The fault swarm").

``draw`` turns a seed into a scenario (runs, the user's commands, faults), ``faults`` holds the fault kinds and the
faulty views of the cloud and the store the controller sees, ``receivers`` the notification targets, their faults
and the simulated receivers, ``invariants`` the named checkers (``promises`` those of what the user is promised
about one run, ``notices`` those of notifications), ``runner`` plays a seed and many, ``shrink`` drops parts of a
failing scenario while it still fails, and ``__main__`` is the developer's command (``python -m tpuops.sim.swarm``,
``make swarm``): not a user-facing ``tpuops`` command, since it tests tpuops itself and spends nothing.

May import: ``tpuops.sim`` and what it may (the control plane, the providers, the store, ``tpuops.notify``),
``tpuops.core.guards``.
"""
