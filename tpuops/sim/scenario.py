"""From what a user has (an experiment or sweep file, the ledger's learned risk) to a simulation's inputs.

``simulate`` plans exactly as ``train --dry-run`` and ``sweep start --dry-run`` do (the real
planning: node request, frozen template, Optuna study), then declares into the simulation's own
scratch store, never the user's: ``count`` replicas of a run (independent draws, one world), or
the sweep. The cloud model takes the ledger's learned rates per (zone, capacity) and its create ->
READY latency where the ledger has them, the stated assumptions elsewhere (``tpuops.billing.risk``,
``tpuops.providers.cloud_model``). The agent model takes the experiment's own numbers (steps,
checkpoint interval) and the stated defaults below for what only a run can measure.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tpuops.billing.risk import Prior, Risk, RiskKey, rate_for
from tpuops.config import Settings
from tpuops.contract.interval import young_daly_s
from tpuops.core.clock import UTC
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity, ValueEnum
from tpuops.core.naming import RUN_KEY
from tpuops.launch import jobs
from tpuops.launch.experiment import Experiment, load_experiment
from tpuops.providers.cloud_model import CloudModel, Latency
from tpuops.runs import RunRecord
from tpuops.runs.models import PlanInputs
from tpuops.sim.engine import START, SimReport, Simulation, scratch_parent
from tpuops.sim.history import History
from tpuops.sim.model import AgentModel, Segments
from tpuops.store import Store
from tpuops.sweeps.start import SweepPlan, plan_sweep, start_sweep

DEFAULT_STEPS_PER_S = 10.0
"""ASSUMED training speed where an experiment has no history: stated, and shown as an assumption."""


DEADLINE_SLACK = 1.5
"""ASSUMED deadline of the deadline policy for an experiment that names none: 1.5x its length on-demand."""


class CapacityPolicy(ValueEnum):
    """How a simulated run picks its capacity (``tpuops.billing.deadline`` has the rules of the last two)."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    FALLBACK = "fallback"
    """Spot until the first preemption, on-demand from then on (SkyPilot-like)."""
    DEADLINE = "deadline"
    """Uniform progress against the experiment's deadline (or ``DEADLINE_SLACK`` x its length)."""

    @classmethod
    def parse(cls, text: str) -> CapacityPolicy:
        try:
            return cls(text)
        except ValueError:
            raise UsageError(f"unknown policy {text!r}: expected one of {', '.join(p.value for p in cls)}") from None

    @property
    def capacity(self) -> Capacity:
        return Capacity.ON_DEMAND if self is CapacityPolicy.ON_DEMAND else Capacity.SPOT

    def rule(self, length_s: float, due_s: float | None, start: float = START,
             inputs: PlanInputs | None = None) -> dict[str, Any]:
        """The record fields of a run under this policy, launched at ``start``: its job ``length_s`` long on-demand,
        due ``due_s`` after its launch (None: ``DEADLINE_SLACK`` x its length), its deadline weighing ``inputs``
        (None: the settings' assumptions)."""
        if self is CapacityPolicy.FALLBACK:
            return {"fallback": True}
        if self is CapacityPolicy.DEADLINE:
            return {"deadline_at": start + (due_s if due_s is not None else DEADLINE_SLACK * length_s),
                    "expected_s": length_s, "inputs": inputs}
        return {}


def agent_model(experiment: Experiment, history: History | None, *, lost_work_per_hour: float,
                eval_every_steps: int = 0) -> AgentModel:
    """The experiment's job by its segments: its steps (or ``expected_hours`` of steps) and checkpoint interval
    (``every: auto``: Young/Daly's for the save cost, as the agent picks it once it has measured a save), at the
    speed, setup and save cost earlier runs measured (``history``), else the stated defaults."""
    steps_per_s = history.steps_per_s if history else DEFAULT_STEPS_PER_S
    setup_s = history.setup_s if history and history.setup_s > 0 else None
    save_s = history.save_s if history else None
    steps = experiment.steps or max(1, round(experiment.expected_hours * 3600 * steps_per_s))
    every = [s for s in (experiment.checkpoint.every_seconds,
                         experiment.checkpoint.every_steps / steps_per_s if experiment.checkpoint.every_steps else 0)
             if s > 0]
    if experiment.checkpoint.every == "auto":
        every = [young_daly_s(Segments.save_s if save_s is None else save_s, lost_work_per_hour)]
    measured = {name: value for name, value in (("setup_s", setup_s), ("save_s", save_s)) if value is not None}
    return AgentModel(total_steps=steps, steps_per_s=steps_per_s,
                      segments=Segments(checkpoint_every_s=min(every, default=600.0), **measured),
                      eval_every_steps=eval_every_steps)


def slowdowns(settings: Settings, record: RunRecord) -> dict[str, float]:
    """An elastic run's sizes and how many times longer a step takes on each (its largest's replicas over the size's:
    the micro-batches it accumulates to keep the global batch); empty for a run of one size."""
    from tpuops.providers.registry import offers_of

    if not record.smaller:
        return {}
    offers = offers_of(settings.node_provider)
    largest = offers.shape(record.node.accelerator).replicas
    return {node.accelerator: largest / offers.shape(node.accelerator).replicas for node in record.sizes}


def cloud_model(settings: Settings, risks: Sequence[Risk], accelerator: str) -> CloudModel:
    """The ledger's learned hazards per (zone, capacity) of ``accelerator``, and its median create -> READY; without
    history, the assumptions of ``tpuops.billing.risk`` (a slice: its hosts' hazard, a longer boot)."""
    hazards, prior = {}, Prior.of(settings)
    for zone in settings.zones:
        for capacity in Capacity:
            risk = rate_for(risks, RiskKey(zone, accelerator, capacity.value), prior)
            hazards[(zone, capacity.value)] = risk.rate_per_hour
    latencies = [s for risk in risks if risk.key.accelerator == accelerator for s in risk.ready_latency_s]
    median = sorted(latencies)[len(latencies) // 2] if latencies else prior.ready_s(accelerator)
    ready = {accelerator: Latency(median)}
    return CloudModel(ready_latency=ready, hazard_per_hour=hazards,
                      spot_hazard_per_hour=settings.spot_preemptions_per_hour)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Where a simulation stops if its runs have not all ended (``Simulation.run``).

    ``max_hours`` of virtual time, or ``horizon`` times the job's length on-demand (a sweep's: its waves of
    trials) but at least ``floor_hours`` (a short job's time to result is mostly passes and boots, not its
    length), whichever is less; ``max_run_passes`` of simulated work, whatever the job's length;
    ``wall_budget_s`` of real time (a last resort: the only limit that depends on the machine, not the inputs).

    ``quiet_share`` > 0 lets the engine skip quiet passes (``Simulation.run(quiet_skip_s=)``) up to that share
    of the job's length: every cloud event is still seen at the cron pass after it, so a long job costs about
    1 / ``quiet_share`` passes per run while nothing happens, and a job shorter than ``cron_s / quiet_share``
    skips nothing."""

    max_hours: float = 24 * 30
    horizon: float | None = None
    floor_hours: float = 24.0
    max_run_passes: int | None = None
    quiet_share: float = 0.0
    wall_budget_s: float | None = None

    def hours(self, length_s: float) -> float:
        if self.horizon is None:
            return self.max_hours
        return min(self.max_hours, max(self.floor_hours, self.horizon * length_s / 3600))


def is_sweep(path: Path) -> bool:
    """A sweep file names its experiment and its trials; an experiment file does neither."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise UsageError(f"{path}: cannot read it as YAML ({err})") from None
    return isinstance(document, dict) and "experiment" in document and "trials" in document


def experiment_name(path: Path) -> str:
    """The name of the experiment ``path`` runs: the file's own, or a sweep's base experiment's.

    Raises:
        UsageError: the file, or the sweep's experiment, is not valid (one line).
    """
    from tpuops.sweeps.spec import experiment_path, load_sweep

    if is_sweep(path):
        path = experiment_path(path, load_sweep(path))
    return load_experiment(path).name


def _replica(record: RunRecord, spec: dict[str, Any], index: int, capacity: Capacity,
             rule: dict[str, Any]) -> tuple[RunRecord, dict]:
    run_id = f"{record.run_id}-{index:03d}"
    node = record.node.model_copy(update={"name": run_id, "capacity": capacity,
                                          "labels": {**record.node.labels, RUN_KEY: run_id}})
    return record.model_copy(update={"run_id": run_id, "node": node, **rule}), {**spec, "run_id": run_id}


def due_s(experiment: Experiment) -> float | None:
    """The experiment's deadline as seconds from its launch (an absolute one, from now)."""
    now = time.time()
    due = experiment.deadline_at(now)
    return None if due is None else due - now


def _on(plan: SweepPlan, capacity: Capacity, rule: dict[str, Any]) -> SweepPlan:
    """The sweep with every trial on ``capacity`` under ``rule`` (its frozen template's record changed, nothing
    else): under the deadline policy, every trial is due by the sweep's deadline."""
    record = plan.template.record
    node = record.node.model_copy(update={"capacity": capacity})
    template = plan.template.model_copy(update={"record": record.model_copy(update={"node": node, **rule})})
    return dataclasses.replace(plan, template=template)


def simulate(settings: Settings, path: Path, risks: Sequence[Risk], *, policy: CapacityPolicy = CapacityPolicy.SPOT,
             count: int = 1, seed: int = 0, cron_s: float = 300.0, limits: Limits = Limits(),
             history: History | None = None, workdir: Path | None = None,
             cloud: CloudModel | None = None, inputs: PlanInputs | None = None,
             progress: Callable[[str], None] | None = None) -> SimReport:
    """Simulate ``count`` runs of an experiment (or one sweep) under ``policy`` on the learned risk (or on
    ``cloud``, a model given whole: a benchmark's stockout episode), the runs planning on ``inputs``
    (``tpuops.launch.planning``; None: the settings' assumptions).

    Raises:
        UsageError: a bad file, count or interval (one line each).
    """
    from tpuops.session import store

    if count < 1:
        raise UsageError(f"runs = {count} is not allowed: expected at least 1")
    if cron_s <= 0:
        raise UsageError(f"the pass interval = {cron_s} s is not allowed: expected > 0")
    say = progress or (lambda _text: None)
    user_store = store(settings)
    if workdir is not None:
        return _run(settings, path, risks, user_store, workdir, policy, count, seed, cron_s, limits, history,
                    cloud, inputs, say)
    with tempfile.TemporaryDirectory(prefix="tpuops-sim-", dir=scratch_parent()) as scratch:  # leaves nothing behind
        return _run(settings, path, risks, user_store, Path(scratch), policy, count, seed, cron_s, limits,
                    history, cloud, inputs, say)


def _run(settings: Settings, path: Path, risks: Sequence[Risk], user_store: Store, scratch: Path,
         policy: CapacityPolicy, count: int, seed: int, cron_s: float, limits: Limits, history: History | None,
         cloud: CloudModel | None, inputs: PlanInputs | None, say: Callable[[str], None]) -> SimReport:
    lost_rate = inputs.lost_work_per_hour.value if inputs else settings.lost_work_per_hour
    if is_sweep(path):
        plan = plan_sweep(settings, path, user_store)
        train = plan.job.spec.train
        model = dataclasses.replace(agent_model(plan.job.experiment, history, lost_work_per_hour=lost_rate,
                                                eval_every_steps=(train.eval_every_steps if train else 0) or 100),
                                    slowdown=slowdowns(settings, plan.job.record))
        length_s = -(-plan.spec.trials // plan.spec.parallel) * model.length_s  # its waves of trials
        plan = _on(plan, policy.capacity, policy.rule(length_s, due_s(plan.job.experiment), inputs=inputs))
        accelerator = plan.job.record.node.accelerator
        sim = Simulation(settings, scratch, cloud or cloud_model(settings, risks, accelerator), model, cron_s=cron_s,
                         seed=seed, progress=say)
        start_sweep(plan, sim.store, say, upload=False)
    else:
        # Launched at the simulation's START, not now: the run ids (and so every node's draws) are the same
        # on every call.
        launched = jobs.new_run_id(load_experiment(path).name, datetime.fromtimestamp(START, UTC))
        job = jobs.plan_train(settings, path, user_store, run_id=launched, capacity=policy.capacity)
        model = dataclasses.replace(agent_model(job.experiment, history, lost_work_per_hour=lost_rate),
                                    slowdown=slowdowns(settings, job.record))
        sim = Simulation(settings, scratch, cloud or cloud_model(settings, risks, job.record.node.accelerator),
                         model, cron_s=cron_s, seed=seed, progress=say)
        length_s = model.length_s
        rule = policy.rule(length_s, due_s(job.experiment), inputs=inputs)
        sim.declare(_replica(job.record, job.spec_json(), index, policy.capacity, rule) for index in range(count))
    return sim.run(max_hours=limits.hours(length_s), max_run_passes=limits.max_run_passes,
                   wall_budget_s=limits.wall_budget_s, quiet_skip_s=limits.quiet_share * length_s)
