"""Planning before paying, as library calls: ``risk`` (preemption risk learned from the ledger),
``simulate`` (an experiment or a sweep on the virtual-time Cloud TPU, ``tpuops.sim``), and the dry runs
with forecasts: ``forecast_train`` (``train --dry-run``) and ``forecast_sweep`` (``sweep start --dry-run``).

Part of the front door (``tpuops.api`` re-exports every name here). Each call takes ``Settings``
and imports what it computes with lazily; the models (``tpuops.billing.risk``) compute without I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from tpuops.config import Settings
from tpuops.core.clock import UTC
from tpuops.core.kinds import Capacity

if TYPE_CHECKING:
    from tpuops.billing.risk import Risk
    from tpuops.launch.jobs import JobPlan
    from tpuops.runs.models import RunRecord
    from tpuops.sim.engine import SimReport
    from tpuops.sim.forecast import Forecast
    from tpuops.sweeps.start import SweepPlan

PlanT = TypeVar("PlanT")


def risk(settings: Settings, *, now: datetime | None = None) -> list[Risk]:
    """``tpuops risk``: per (zone, accelerator, capacity) of the project's ledger, READY node-hours,
    preemptions, the rate with its 95 % interval, create -> READY latency and stockout episodes."""
    from tpuops.api.history import histories
    from tpuops.billing.risk import Prior, learn

    return learn(histories(settings), now or datetime.now(UTC), Prior.of(settings))


def simulate(settings: Settings, path: Path, *, policy: str = "spot", runs: int = 1, seed: int = 0,
             cron_s: float = 300.0, max_hours: float = 24 * 30, progress: Callable[[str], None] | None = None
             ) -> SimReport:
    """``tpuops simulate SPEC|SWEEP``: ``runs`` runs of the experiment (or the sweep) under ``policy``, with the
    real controller and sweep passes on the virtual-time Cloud TPU, on the risk the ledger learned."""
    from tpuops.api.history import experiment_history
    from tpuops.sim.scenario import CapacityPolicy, Limits, experiment_name
    from tpuops.sim.scenario import simulate as run_simulation

    chosen = CapacityPolicy.parse(policy)
    history = experiment_history(settings, experiment_name(path))
    return run_simulation(settings, path, risk(settings), policy=chosen, count=runs, seed=seed, cron_s=cron_s,
                          limits=Limits(max_hours=max_hours), history=history, progress=progress)


@dataclass(frozen=True)
class Forecasted(Generic[PlanT]):
    """A dry run: the plan (``JobPlan`` for ``train``, ``SweepPlan`` for ``sweep start``; nothing written) and
    what it would cost and take, per policy."""

    plan: PlanT
    forecast: Forecast


def _forecast(settings: Settings, path: Path, experiment: str, record: RunRecord, runs: int, sweeps: int
              ) -> Forecast:
    from tpuops.api.history import experiment_history, learner
    from tpuops.launch.planning import keys_of
    from tpuops.sim.forecast import forecast

    return forecast(settings, path, risk(settings), experiment_history(settings, experiment), runs=runs, sweeps=sweeps,
                    inputs=learner(settings)(keys_of(record)))


def forecast_train(settings: Settings, spec: Path, *, name: str | None = None, accelerator: str | None = None,
                   capacity: Capacity | None = None, keep: bool = False, budget_usd: float | None = None,
                   runs: int = 20) -> Forecasted[JobPlan]:
    """``tpuops train SPEC --dry-run``: the plan, and ``runs`` simulated runs per policy on the learned risk
    and the experiment's own history (steps/s, setup, save cost) or the stated defaults."""
    from tpuops.api import plan_train

    plan = plan_train(settings, spec, name=name, accelerator=accelerator, capacity=capacity, keep=keep,
                      budget_usd=budget_usd)
    return Forecasted(plan, _forecast(settings, spec, plan.experiment.name, plan.record, runs, sweeps=0))


def forecast_sweep(settings: Settings, spec: Path, *, sweeps: int = 3) -> Forecasted[SweepPlan]:
    """``tpuops sweep start SPEC --dry-run``: the sweep's plan, and ``sweeps`` whole simulated sweeps per policy."""
    from tpuops.api.sweeps import sweep_plan

    plan = sweep_plan(settings, spec)
    return Forecasted(plan, _forecast(settings, spec, plan.job.experiment.name, plan.job.record, runs=0,
                                          sweeps=sweeps))
