"""The orphan reaper: nodes labelled as a run's that no run claims.

A pass that dies between a create and the run's record, a probe left behind, a run deleted from the store by
hand: each leaves a node that bills and that no run's decision will ever delete. A full pass reaps them once they
are older than ``orphan_grace_s`` (a node younger than that may belong to a run being declared right now);
``tpuops down --orphans`` reaps them at once. A node without tpuops' label is never touched.

A probe (``tpuops.controller.probes``) is labelled as a run of its own name, which the store does not know, but it
belongs to the run ``PROBE_KEY`` names (a run's node is named after its id): it is reaped only when that run is
not in the store, or its memory no longer claims a probe in the node's zone (finished, or a memory write lost
after the create: the swarm's seed 4300). Taken for an orphan by its own name, a live probe of a run the watch
held was deleted by a cron pass (seed 3937). Every delete goes out under the lease of the run the node belongs
to (``Leases.acting``), taken like a pass takes it: a node of a run whose lease another controller holds is never
touched, and one whose lease ran out mid-pass is not deleted on a stale belief (seed 4300).

Imports: ``tpuops.core``, ``tpuops.fleet``, ``tpuops.store``, and ``tpuops.runs``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from tpuops import runs
from tpuops.core.clock import UTC
from tpuops.core.errors import LeaseLost, TpuopsError
from tpuops.core.naming import PROBE_KEY, run_of
from tpuops.fleet import Fleet, Listing
from tpuops.providers.nodes import NodeInfo
from tpuops.store import Store
from tpuops.store.lease import Leases


def _claimed(store: Store, run: str, node: NodeInfo) -> bool:
    """Whether ``run``'s memory (read under its lease) still claims the probe ``node``: then its decision deletes
    it. A memory that cannot be read claims it (the run is damaged: ``tpuops down`` is the user's to make)."""
    try:
        memory, _ = runs.load_memory(store, run)
    except TpuopsError:
        return True
    return not memory.finished and memory.probe is not None and memory.probe.zone == node.zone


def reap(nodes: Fleet, store: Store, leases: Leases, held: set[str], listed: Listing, active: set[str],
         grace_s: float, progress: Callable[[str], None], now: float | None = None) -> list[str]:
    """Delete the listed nodes labelled as a run's that no run claims, once past ``grace_s``; their names.

    ``active``: the runs this pass read (their nodes are theirs to delete). ``held``: the runs whose leases this
    controller holds, to which a lease taken here is added (so that the controller releases it on its way out).
    ``now``: the pass's time (epoch seconds; None: the wall clock's), which a node's age is taken at: read on the
    wall clock, a simulated node was years from being old enough, and a probe node left PREEMPTED by a lost memory
    write stayed for ever (the swarm's seed 4300)."""
    at = None if now is None else datetime.fromtimestamp(now, UTC)
    reaped = []
    for zone_nodes in listed.values():
        for node in zone_nodes.values():
            run, probe = run_of(node.labels), PROBE_KEY in node.labels
            if not node.managed or run is None or (run in active and not probe):
                continue
            age = node.age_s(at)
            if age is not None and age < grace_s:
                continue
            known = runs.run_exists(store, run)
            if (known and not probe) or not leases.acquire(run):
                continue  # a run's own node, or one of a run another controller holds: not the reaper's
            held.add(run)
            if known and _claimed(store, run, node):
                continue
            why = "its run's memory no longer claims it" if known else f"run {run} is not in the store"
            progress(f"reaping orphan {node.name} in {node.zone} ({why})")
            try:
                with leases.acting(run):
                    nodes.delete(node.zone, node.name)
            except LeaseLost as err:  # another controller took the run over meanwhile: it judges the node
                progress(f"not reaping {node.name}: {err}")
                continue
            reaped.append(node.name)
    return reaped
