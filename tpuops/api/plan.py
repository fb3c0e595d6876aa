"""Planning before paying, as library calls: ``risk`` (preemption risk learned from the ledger) and
``simulate`` (an experiment or a sweep on the virtual-time Cloud TPU, ``tpuops.sim``).

Part of the front door (``tpuops.api`` re-exports every name here). Each call takes ``Settings``
and imports what it computes with lazily; the models (``tpuops.risk``) compute without I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops.config import Settings

if TYPE_CHECKING:
    from tpuops.risk import Risk
    from tpuops.sim.engine import SimReport

UTC = timezone.utc  # datetime.UTC exists from Python 3.11 only


def risk(settings: Settings, *, now: datetime | None = None) -> list[Risk]:
    """``tpuops risk``: per (zone, accelerator, capacity) of the project's ledger, READY node-hours,
    preemptions, the rate with its 95 % interval, create -> READY latency and stockout episodes."""
    from tpuops.risk import learn
    from tpuops.session import open_ledger

    histories = open_ledger(settings).histories(settings.project)
    return learn(histories, now or datetime.now(UTC), settings.spot_preemptions_per_hour)


def simulate(settings: Settings, path: Path, *, policy: str = "spot", runs: int = 1, seed: int = 0,
             cron_s: float = 300.0, max_hours: float = 24 * 30, progress: Callable[[str], None] | None = None
             ) -> SimReport:
    """``tpuops simulate SPEC|SWEEP``: ``runs`` runs of the experiment (or the sweep) under ``policy``, with the
    real controller and sweep passes on the virtual-time Cloud TPU, on the risk the ledger learned."""
    from tpuops.sim.scenario import Policy
    from tpuops.sim.scenario import simulate as run_simulation

    chosen = Policy.parse(policy)
    return run_simulation(settings, path, risk(settings), policy=chosen, count=runs, seed=seed, cron_s=cron_s,
                          max_hours=max_hours, progress=progress)
