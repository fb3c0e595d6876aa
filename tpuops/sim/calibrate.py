"""Calibration: the simulator, set to timings measured on real runs, forecasts those runs.

The real runs' agents time every attempt (``status.json`` ``attempts``); the controller dates every
create (``memory.json`` events). From them, each run gives a ``Profile``: its setup (the create of an
attempt to that attempt's first completed step: boot, TensorFlow import, restore, the first call) and
its speed (steps trained, redone ones included, per second of the stepping after the first step,
checkpoints included), and its final stretch (the last attempt's final evaluation and SavedModel: a
notice then no longer stops the job, ``Workload.final_s``; the final checkpoint before them is
counted with the speed, not here, so the stretch is a little short). The forecast resamples those
profiles (one per simulated world, ``worlds`` of them, ``runs_per_world`` runs each; 40 of 5 by default, so that the
draws cover 20 measured profiles: with 10 the band's edges were the two extreme draws, and runs that
met no preemption, all within 2 % of each other, fell just outside): what load did to a run's segments
in the session is in the band, not only what preemptions do. The cloud (hazard, create -> READY,
notice) and the controller's pace are given as the real runs had them. The node's self-delete after
the job's end (``self_delete_of``: the agent's end to the end of the node's last billed interval, as
the emulator's billing records it) is fitted over the session's runs (``fit``): the node is READY,
billed and preemptible in it, and a spot node preempted there within a minute of its create is free.

``score`` counts the runs whose measured wall time and cost both fall inside the forecast's p10-p90
band, and the median absolute error of each against the band's p50.

Known limits, seen on this machine: within one world every run has the same setup and speed, so the
costs of the runs a world does not preempt are one value, and the band's edges sit among real runs
that differ by 1-2 %; a spot node preempted within a minute of its create is free, so runs shorter
than a minute cost only their last attempt; and a run's attempts do not all meet the same load: the
bench starts runs ten at a time, so first attempts share the two cores (22-29 s to their first step)
while a replacement often runs alone (6-15 s), which a profile (one setup, one speed) averages.

Statistical ceilings, stated: for a forecast that is exactly right, a run falls inside its p10-p90
band with probability 0.8, so "at least 16 of 20 inside" holds with probability 0.63 (binomial); a
test asserting it would fail about one run in three however good the simulator is. ``coverage_p``
says how surprising a count is for such a forecast (P(at most that many inside)). And the median
absolute error against the p50 has a floor set by the spread of the outcome itself:
``Forecast.floor_seconds`` / ``floor_usd`` are the errors the simulated runs score against their own
p50, what an exact forecast would score on average; a goal below the floor is out of reach.
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuops.config import Settings
from tpuops.kinds import Capacity
from tpuops.providers.cloud_model import CloudModel, Latency
from tpuops.provision import plan_up
from tpuops.runs import AgentStatus, Memory, NodeSpec, RunKind, RunRecord
from tpuops.sim.engine import Simulation, WakeUp
from tpuops.sim.forecast import Band
from tpuops.sim.model import AgentModel, Segments


def replicas(settings: Settings, count: int, *, prefix: str = "run", accelerator: str = "v3-8",
             capacity: Capacity = Capacity.SPOT) -> list[tuple[RunRecord, dict[str, Any]]]:
    """``count`` runs of one node each, declared as ``train --detach`` would (no bundle: a simulated agent)."""
    declared = []
    for index in range(count):
        run_id = f"{prefix}-{index:04d}"
        up = plan_up(settings, run_id, accelerator=accelerator, capacity=capacity, zone=None, run_id=run_id)
        declared.append((RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=NodeSpec.of(up.request, up.zones)),
                         {"run_id": run_id}))
    return declared


@dataclass(frozen=True)
class Profile:
    """One real run's timings, as the simulator takes them."""

    setup_s: float
    steps_per_s: float
    final_s: float = 0.0


@dataclass(frozen=True)
class Measured:
    """One real run's result."""

    run_id: str
    seconds: float
    """From its first create to its agent's success."""
    usd: float
    """The cloud's billing truth for its nodes."""
    preemptions: int


def profile_of(status: AgentStatus, memory: Memory) -> Profile | None:
    """The run's profile; None when it has not succeeded or its attempts do not line up with its creates."""
    creates = [event["at"] for event in memory.events if event["kind"] == "create"]
    attempts = [a for a in status.attempts if a.first_step_at is not None]
    if status.exit_class != "succeeded" or not attempts or len(creates) < len(status.attempts):
        return None
    setups = [a.first_step_at - creates[a.attempt - 1] for a in attempts if a.first_step_at is not None]
    working = sum(a.productive_s + a.recomputed_s + a.checkpoint_s for a in attempts)
    if working <= 0:
        return None
    last = status.attempts[-1]
    return Profile(statistics.median(setups), (status.step + status.recomputed_steps) / working,
                   last.eval_s + last.save_s)


def self_delete_of(status: AgentStatus, last_interval_end_s: float, last_interval_reason: str) -> float | None:
    """From the agent's end to its node's self-delete (the node's last READY interval closed by a delete);
    None for a run that did not succeed or whose node was preempted or stopped first (no delete to time)."""
    ended = status.attempts[-1].ended_at if status.attempts else None
    if status.exit_class != "succeeded" or ended is None or last_interval_reason != "deleted":
        return None
    return max(0.0, last_interval_end_s - ended)


def fit(samples: Sequence[float]) -> Latency:
    """A log-normal through ``samples`` (seconds > 0): their median and the spread of their logarithms."""
    positive = [sample for sample in samples if sample > 0]
    if not positive:
        return Latency(0.0, 0.0)
    logs = [math.log(sample) for sample in positive]
    return Latency(statistics.median(positive), statistics.stdev(logs) if len(logs) > 1 else 0.0)


def measured_of(run_id: str, status: AgentStatus, memory: Memory, billed_usd: float) -> Measured | None:
    creates = [event["at"] for event in memory.events if event["kind"] == "create"]
    ended = status.attempts[-1].ended_at if status.attempts else None
    if status.exit_class != "succeeded" or not creates or ended is None:
        return None
    return Measured(run_id, ended - creates[0], billed_usd, memory.preemptions)


@dataclass(frozen=True)
class Forecast:
    seconds: Band
    usd: Band
    preemptions: float
    simulated: int
    floor_seconds: float = 0.0
    """The median absolute error of the simulated runs' wall times against their own p50 (see the module)."""
    floor_usd: float = 0.0


def forecast(settings: Settings, profiles: Sequence[Profile], total_steps: int, cloud: CloudModel, *,
             pass_every_s: float, wake: WakeUp | None, worlds: int = 40, runs_per_world: int = 5,
             seed: int = 0) -> Forecast:
    """The bands of wall time and cost over ``worlds`` x ``runs_per_world`` simulated runs (profiles resampled)."""
    if not profiles:
        raise ValueError("a calibration needs at least one measured profile")
    rng = random.Random(seed)
    seconds: list[float] = []
    usd: list[float] = []
    preemptions: list[int] = []
    for world in range(worlds):
        profile = profiles[rng.randrange(len(profiles))]
        job = AgentModel(total_steps=total_steps, steps_per_s=profile.steps_per_s,
                         segments=Segments(setup_s=profile.setup_s, checkpoint_every_s=1e9, save_s=0.0,
                                           restore_s=0.0, final_s=profile.final_s))
        with tempfile.TemporaryDirectory(prefix="tpuops-calibrate-") as scratch:
            sim = Simulation(settings, Path(scratch), cloud, job, cron_s=pass_every_s, seed=seed * 1000 + world,
                             wake=wake)
            sim.declare(replicas(settings, runs_per_world, prefix=f"w{world}"))
            report = sim.run(max_hours=24)
        for run in report.runs:
            if run.hours_to_result is not None:
                seconds.append(run.hours_to_result * 3600)
                usd.append(run.usd)
                preemptions.append(run.preemptions)
    seconds_band, usd_band = Band.of(seconds), Band.of(usd)
    if seconds_band is None or usd_band is None:
        raise ValueError("no simulated run finished: the hazard is too high for the job")
    return Forecast(seconds_band, usd_band, statistics.fmean(preemptions), len(seconds),
                    statistics.median(_error(value, seconds_band) for value in seconds),
                    statistics.median(_error(value, usd_band) for value in usd))


@dataclass(frozen=True)
class Score:
    runs: int
    inside: int
    """Runs whose wall time and cost both fall inside p10-p90."""
    seconds_inside: int
    usd_inside: int
    median_abs_error_seconds: float
    """Relative to the measured value, against the forecast's p50."""
    median_abs_error_usd: float

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "inside_both": self.inside, "seconds_inside": self.seconds_inside,
                "usd_inside": self.usd_inside,
                "median_abs_error_seconds": round(self.median_abs_error_seconds, 4),
                "median_abs_error_usd": round(self.median_abs_error_usd, 4)}


def coverage_p(inside: int, runs: int, chance: float = 0.8) -> float:
    """P(at most ``inside`` of ``runs`` inside), each inside with probability ``chance`` (binomial)."""
    return sum(math.comb(runs, k) * chance ** k * (1 - chance) ** (runs - k) for k in range(inside + 1))


def _inside(value: float, band: Band) -> bool:
    return band.p10 <= value <= band.p90


def _error(value: float, band: Band) -> float:
    """Relative to the measured value; a measured 0 (a free run) counts in full against a p50 above it."""
    if value:
        return abs(value - band.p50) / value
    return 1.0 if band.p50 else 0.0


def score(runs: Iterable[Measured], predicted: Forecast) -> Score:
    done = list(runs)
    if not done:
        raise ValueError("nothing to score: no measured run")
    seconds = [_inside(r.seconds, predicted.seconds) for r in done]
    usd = [_inside(r.usd, predicted.usd) for r in done]
    return Score(len(done), sum(s and u for s, u in zip(seconds, usd, strict=True)), sum(seconds), sum(usd),
                 statistics.median(_error(r.seconds, predicted.seconds) for r in done),
                 statistics.median(_error(r.usd, predicted.usd) for r in done))
