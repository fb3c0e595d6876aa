"""What earlier runs of an experiment measured, for the simulator's agent model (``tpuops.sim.scenario``).

Forecasts (``tpuops train --dry-run``, ``tpuops sweep start --dry-run``) and ``tpuops simulate`` read the same
history, so the two agree for the same experiment and ledger. Everything here is the agents' own clocks from
their ``status.json``; an experiment that never ran has no history (None), and what is missing from one that
did (a save, before any checkpoint) falls back to the agent model's stated default, named in the forecast.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import NamedTuple

from tpuops.runs import Run


class History(NamedTuple):
    """What earlier runs of the experiment measured (their agents' clocks)."""

    runs: int
    steps_per_s: float
    """Steps done (not redone) per second of productive time, over every attempt of those runs."""
    setup_s: float
    """The median attempt's setup (creates to first step); 0 when none was measured."""
    save_s: float | None = None
    """The median of those runs' last measured checkpoint costs (``AgentStatus.last_save_s``); None when none
    saved, or from agents older than that measure."""


def history_of(found: Sequence[Run], experiment: str) -> History | None:
    """Steps per second of stepping, the median setup and the median save cost over earlier runs of
    ``experiment``; None without any."""
    steps = productive = 0.0
    setups: list[float] = []
    saves: list[float] = []
    count = 0
    for run in found:
        status = run.status
        if run.record.experiment != experiment or status is None or not status.attempts:
            continue
        seconds = sum(a.productive_s for a in status.attempts)
        if seconds <= 0 or status.step <= 0:
            continue
        count += 1
        steps += status.step - status.recomputed_steps
        productive += seconds
        setups.extend(a.setup_s for a in status.attempts if a.setup_s > 0)
        if status.last_save_s is not None:
            saves.append(status.last_save_s)
    if count == 0 or productive <= 0 or steps <= 0:
        return None
    return History(count, steps / productive, statistics.median(setups) if setups else 0.0,
                    statistics.median(saves) if saves else None)

