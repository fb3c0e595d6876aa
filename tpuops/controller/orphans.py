"""The orphan reaper: nodes labelled as a run's whose run the store does not know.

A pass that dies between a create and the run's record, a probe left behind, a run deleted from the store by
hand: each leaves a node that bills and that no run's decision will ever delete. A full pass reaps them once they
are older than ``orphan_grace_s`` (a node younger than that may belong to a run being declared right now);
``tpuops down --orphans`` reaps them at once. A node without tpuops' label is never touched.

Imports: ``tpuops.core``, ``tpuops.fleet``, ``tpuops.store`` and ``tpuops.runs``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from tpuops import runs
from tpuops.core.clock import UTC
from tpuops.core.naming import RUN_KEY
from tpuops.fleet import Fleet, Listing
from tpuops.store import Store


def reap(nodes: Fleet, store: Store, listed: Listing, active: set[str], grace_s: float,
         progress: Callable[[str], None], now: float | None = None) -> list[str]:
    """Delete the listed nodes labelled as a run's that is neither ``active`` nor in the store, once past
    ``grace_s``; their names.

    ``now``: the pass's time (epoch seconds; None: the wall clock's), which a node's age is taken at: read on the
    wall clock, a simulated node was years from being old enough, and a probe node left PREEMPTED by a lost memory
    write stayed for ever (the swarm's seed 4300)."""
    at = None if now is None else datetime.fromtimestamp(now, UTC)
    reaped = []
    for zone_nodes in listed.values():
        for node in zone_nodes.values():
            run = node.labels.get(RUN_KEY)
            if not node.managed or run is None or run in active:
                continue
            age = node.age_s(at)
            if (age is not None and age < grace_s) or runs.run_exists(store, run):
                continue
            progress(f"reaping orphan {node.name} in {node.zone} (run {run} is not in the store)")
            nodes.delete(node.zone, node.name)
            reaped.append(node.name)
    return reaped
