"""From what a user has (an experiment or sweep file, the ledger's learned risk) to a simulation's inputs.

``simulate`` plans exactly as ``train --dry-run`` and ``sweep start --dry-run`` do (the real
planning: node request, frozen template, Optuna study), then declares into the simulation's own
scratch store, never the user's: ``count`` replicas of a run (independent draws, one world), or
the sweep. The cloud model takes the ledger's learned rates per (zone, capacity) and its create ->
READY latency where the ledger has them, the stated assumptions elsewhere (``tpuops.risk``,
``tpuops.providers.cloud_model``). The agent model takes the experiment's own numbers (steps,
checkpoint interval) and the stated defaults below for what only a run can measure.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tpuops.config import Settings
from tpuops.errors import UsageError
from tpuops.experiment import Experiment
from tpuops.kinds import Capacity, ValueEnum
from tpuops.naming import RUN_KEY
from tpuops.providers.cloud_model import CloudModel, Latency
from tpuops.risk import Risk, RiskKey, rate_for
from tpuops.runs import RunRecord
from tpuops.sim.engine import SimReport, Simulation
from tpuops.sim.model import AgentModel

DEFAULT_STEPS_PER_S = 10.0
"""ASSUMED training speed where an experiment has no history: stated, and shown as an assumption."""


class Policy(ValueEnum):
    """How a simulated run picks its capacity."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"

    @classmethod
    def parse(cls, text: str) -> Policy:
        try:
            return cls(text)
        except ValueError:
            raise UsageError(f"unknown policy {text!r}: expected one of {', '.join(p.value for p in cls)}") from None

    @property
    def capacity(self) -> Capacity:
        return Capacity.SPOT if self is Policy.SPOT else Capacity.ON_DEMAND


def agent_model(experiment: Experiment, *, steps_per_s: float = DEFAULT_STEPS_PER_S,
                eval_every_steps: int = 0) -> AgentModel:
    """The experiment's job by its segments: its steps (or ``expected_hours`` of steps) and checkpoint interval."""
    steps = experiment.steps or max(1, round(experiment.expected_hours * 3600 * steps_per_s))
    every = [s for s in (experiment.checkpoint.every_seconds,
                         experiment.checkpoint.every_steps / steps_per_s if experiment.checkpoint.every_steps else 0)
             if s > 0]
    return AgentModel(total_steps=steps, steps_per_s=steps_per_s, checkpoint_every_s=min(every, default=600.0),
                      eval_every_steps=eval_every_steps)


def cloud_model(settings: Settings, risks: Sequence[Risk], accelerator: str) -> CloudModel:
    """The ledger's learned hazards per (zone, capacity) of ``accelerator``, and its median create -> READY."""
    hazards = {}
    for zone in settings.zones:
        for capacity in Capacity:
            risk = rate_for(risks, RiskKey(zone, accelerator, capacity.value), settings.spot_preemptions_per_hour)
            hazards[(zone, capacity.value)] = risk.rate_per_hour
    latencies = [s for risk in risks if risk.key.accelerator == accelerator for s in risk.ready_latency_s]
    ready = {accelerator: Latency(sorted(latencies)[len(latencies) // 2])} if latencies else {}
    return CloudModel(ready_latency=ready, hazard_per_hour=hazards,
                      spot_hazard_per_hour=settings.spot_preemptions_per_hour)


def is_sweep(path: Path) -> bool:
    """A sweep file names its experiment and its trials; an experiment file does neither."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise UsageError(f"{path}: cannot read it as YAML ({err})") from None
    return isinstance(document, dict) and "experiment" in document and "trials" in document


def _replica(record: RunRecord, spec: dict[str, Any], index: int, capacity: Capacity) -> tuple[RunRecord, dict]:
    run_id = f"{record.run_id}-{index:03d}"
    node = record.node.model_copy(update={"name": run_id, "capacity": capacity,
                                          "labels": {**record.node.labels, RUN_KEY: run_id}})
    return record.model_copy(update={"run_id": run_id, "node": node}), {**spec, "run_id": run_id}


def simulate(settings: Settings, path: Path, risks: Sequence[Risk], *, policy: Policy = Policy.SPOT, count: int = 1,
             seed: int = 0, cron_s: float = 300.0, max_hours: float = 24 * 30,
             steps_per_s: float = DEFAULT_STEPS_PER_S, workdir: Path | None = None,
             progress: Callable[[str], None] | None = None) -> SimReport:
    """Simulate ``count`` runs of an experiment (or one sweep) under ``policy`` on the learned risk.

    Raises:
        UsageError: a bad file, count or interval (one line each).
    """
    from tpuops import jobs
    from tpuops.session import store
    from tpuops.sweeps.start import plan_sweep, start_sweep

    if count < 1:
        raise UsageError(f"runs = {count} is not allowed: expected at least 1")
    if cron_s <= 0:
        raise UsageError(f"the pass interval = {cron_s} s is not allowed: expected > 0")
    say = progress or (lambda _text: None)
    user_store = store(settings)
    scratch = Path(workdir or tempfile.mkdtemp(prefix="tpuops-sim-"))
    if is_sweep(path):
        plan = plan_sweep(settings, path, user_store)
        train = plan.job.spec.train
        model = agent_model(plan.job.experiment, steps_per_s=steps_per_s,
                            eval_every_steps=(train.eval_every_steps if train else 0) or 100)
        accelerator = plan.job.record.node.accelerator
        sim = Simulation(settings, scratch, cloud_model(settings, risks, accelerator), model, cron_s=cron_s,
                         seed=seed, progress=say)
        start_sweep(plan, sim.store, say, upload=False)
    else:
        job = jobs.plan_train(settings, path, user_store, capacity=policy.capacity)
        sim = Simulation(settings, scratch, cloud_model(settings, risks, job.record.node.accelerator),
                         agent_model(job.experiment, steps_per_s=steps_per_s), cron_s=cron_s, seed=seed, progress=say)
        sim.declare(_replica(job.record, job.spec_json(), index, policy.capacity) for index in range(count))
    return sim.run(max_hours=max_hours)
