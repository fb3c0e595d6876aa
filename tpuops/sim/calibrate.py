"""Calibration: the simulator, set to timings measured on real runs, forecasts those runs.

The real runs' agents time every attempt (``status.json`` ``attempts``), the controller dates every
create (``memory.json`` events) and the cloud every READY interval (the emulator's billing records).
A ``Session`` gathers, run by run:

- a ``Profile``: the run's last attempt, the one that ran to the job's end, from its READY: its setup
  (to its first completed step: boot, TensorFlow import, restore, the first call), its first look at a
  notice (``loaded_at``: the import before it does not look), its speed (its steps over its first step
  to its end less its final stretch, so that the simulated attempt lasts as long as the real one) and
  its final stretch (evaluation and SavedModel: a notice then no longer stops the job). A first attempt
  (a run that met no preemption) and a replacement are kept apart: the bench starts runs ten at a time,
  so first attempts share the two cores (25-33 s to their first step) while a replacement shares them
  with what still runs when it starts (5-15 s), so a replacement keeps its start's offset from its
  run's first READY;
- the cloud around it: create -> READY (first nodes and replacements apart: a replacement's create
  comes in a busier pass), the agent's exit after a notice heard during its setup, the controller's
  recovery (a preempted node's end to its replacement's create), and the node's self-delete after the
  job's end (``self_delete_of``: READY, billed and preemptible meanwhile; a spot node preempted within
  a minute of its create is free).

``forecast`` simulates worlds of ``runs_per_world`` runs: every measured first attempt sets up the same
number of worlds, and a world's replacements take the pace of a measured replacement that started at
about the same moment (``AgentModel.replacements``). The cloud is the emulator's way
(``CloudModel.ends_with_agent``): the hazard dates the notice and the node ends when its agent has
exited, so a notice during the TensorFlow import waits for it (on the emulator most preemptions of a
first attempt end 22-29 s after READY whatever their notice); the wake-up's hurried passes replace
``watch``'s regular ones until the recovery, as ``watch`` does.

``score`` counts the runs whose measured wall time and cost both fall inside the forecast's p10-p90
band, and the median absolute error of each against the band's p50.

Statistical ceilings, stated: for a forecast that is exactly right, a run falls inside its p10-p90
band with probability 0.8, so "at least 16 of 20 inside" holds with probability 0.63 (binomial); a
test asserting it would fail about one run in three however good the simulator is. ``coverage_p``
says how surprising a count is for such a forecast (P(at most that many inside)). And the median
absolute error against the p50 has a floor set by the spread of the outcome itself:
``Predicted.floor_seconds`` / ``floor_usd`` are the errors the simulated runs score against their own
p50, what an exact forecast would score on average; a goal below the floor is out of reach.

Known limits: a session's preempted runs share its controller passes and its load, so they miss the
band together (a count, at 20 runs, moves by the five or six preempted runs at once), and their cost is
two-valued (a notice during the import waits for it and its replacement starts among the other first
attempts, slow and dear; a later one starts alone, quick and cheap), so a session's few preempted runs
fall on either side of the band's p10 by the luck of which kind they met.
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuops.billing.pricing import Catalog
from tpuops.config import Settings
from tpuops.controller.wake import POLL_S
from tpuops.core.kinds import Capacity
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_model import CloudModel, Latency
from tpuops.runs import AgentStatus, Memory, NodeSpec, RunKind, RunRecord
from tpuops.sim.engine import Simulation, WakeUp
from tpuops.sim.forecast import Band
from tpuops.sim.model import AgentModel, Pace, Segments


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
    """One real run's last attempt, the one that ran to the job's end, as the simulator takes it."""

    attempt: int
    """1: a first attempt (the run met no preemption), else a replacement."""
    pace: Pace
    """From its READY: setup to the first completed step, speed, final stretch, first look at a notice."""
    offset_s: float = 0.0
    """Its READY after the run's first READY (0 for a first attempt)."""


@dataclass(frozen=True)
class Measured:
    """One real run's result."""

    run_id: str
    seconds: float
    """From its first create to its agent's success."""
    usd: float
    """The cloud's billing truth for its nodes."""
    preemptions: int


def profile_of(status: AgentStatus, ready_at: Sequence[float]) -> Profile | None:
    """The run's last attempt (``ready_at``: its nodes' READY times in order, from the cloud's billing records);
    None when the run has not succeeded or its attempts do not line up with its nodes.

    Its speed is what reproduces it: its steps (from the step it resumed from) over its first step to its
    end less its final stretch, so that a simulated attempt that nothing interrupts lasts exactly as long
    as the real one (the agent's bookkeeping and exit are in it). It first looks at a notice once its model
    is built and restored (``loaded_at``): the TensorFlow import before that does not.
    """
    last = status.attempts[-1] if status.attempts else None
    if (status.exit_class != "succeeded" or last is None or last.first_step_at is None or last.ended_at is None
            or len(ready_at) < last.attempt):
        return None
    ready = ready_at[last.attempt - 1]
    final_s = last.eval_s + last.save_s
    steps = status.step - (status.resumed_from_step or 0)
    span = last.ended_at - last.first_step_at - final_s
    if steps <= 0 or span <= 0 or last.first_step_at < ready:
        return None
    listen = None if last.loaded_at is None else min(max(0.0, last.loaded_at - ready), last.first_step_at - ready)
    return Profile(last.attempt, Pace(last.first_step_at - ready, steps / span, final_s, listen), ready - ready_at[0])


def creates_of(memory: Memory) -> list[float]:
    """When the controller created each of the run's nodes, in order (as ``memory.json`` dates them)."""
    return [event["at"] for event in memory.events if event["kind"] == "create"]


def ready_latencies(creates: Sequence[float], ready_at: Sequence[float]) -> list[float]:
    """Each node's create (``creates_of``) to its READY."""
    return [max(0.0, ready - create) for create, ready in zip(creates, ready_at, strict=False)]


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
    creates = creates_of(memory)
    ended = status.attempts[-1].ended_at if status.attempts else None
    if status.exit_class != "succeeded" or not creates or ended is None:
        return None
    return Measured(run_id, ended - creates[0], billed_usd, memory.preemptions)


@dataclass(frozen=True)
class ReadyInterval:
    """One READY interval of a run's node, as the cloud billed it (the emulator's billing records)."""

    ready_at: float
    end_at: float
    end_reason: str
    """``preempted``, ``deleted``, ..."""


@dataclass
class Session:
    """What a session of real runs measured, in the simulator's terms (``add`` one run at a time)."""

    measured: list[Measured] = field(default_factory=list)
    profiles: list[Profile] = field(default_factory=list)
    ready_s: list[float] = field(default_factory=list)
    """Create (the controller's) to READY, every first node."""
    replacement_ready_s: list[float] = field(default_factory=list)
    """The same, every replacement."""
    exit_s: list[float] = field(default_factory=list)
    """From a first attempt's first look at a notice that came during its setup (``loaded_at``) to its node's
    end: where the agent's exit matters (a notice then waits for it); a replacement that runs alone exits faster."""
    recovery_s: list[float] = field(default_factory=list)
    """From a preempted node's end to the create of its replacement (the controller's reaction: the bench
    reports it beside the simulated wake-up's, which ``wake`` models rather than replays)."""
    self_delete_s: list[float] = field(default_factory=list)

    def add(self, run_id: str, status: AgentStatus, memory: Memory, nodes: Sequence[ReadyInterval], usd: float) -> None:
        ready_at = [node.ready_at for node in nodes]
        creates = creates_of(memory)
        for result, kept in ((measured_of(run_id, status, memory, usd), self.measured),
                             (profile_of(status, ready_at), self.profiles),
                             (self_delete_of(status, nodes[-1].end_at, nodes[-1].end_reason) if nodes else None,
                              self.self_delete_s)):
            if result is not None:
                kept.append(result)  # type: ignore[arg-type]
        latencies = ready_latencies(creates, ready_at)
        self.ready_s.extend(latencies[:1])
        self.replacement_ready_s.extend(latencies[1:])
        for index, (attempt, node) in enumerate(zip(status.attempts, nodes, strict=False)):
            if node.end_reason != "preempted":
                continue
            if (index == 0 and attempt.first_step_at is None and attempt.loaded_at is not None
                    and node.end_at >= attempt.loaded_at):
                self.exit_s.append(node.end_at - attempt.loaded_at)
            if index + 1 < len(creates) and creates[index + 1] >= node.end_at:
                self.recovery_s.append(creates[index + 1] - node.end_at)

    def add_emulated(self, run_id: str, status: AgentStatus, memory: Memory, billing: Sequence[Mapping[str, Any]],
                     catalog: Catalog) -> list[Mapping[str, Any]]:
        """``add`` a run of the local emulator, its nodes and cost from the emulator's billing records
        (``AdminClient.billing``: every node's READY intervals, named after its run); its intervals, in order."""
        intervals = sorted((i for i in billing if i["node"].endswith(f"/nodes/{run_id}")),
                           key=lambda interval: interval["start_epoch"])
        usd = sum((i["billed_seconds"] or 0.0) / 3600 * catalog.price_per_hour(i["accelerator_type"], i["capacity"],
                                                                               i["zone"]) for i in intervals)
        if intervals:  # none: the run never had a READY node, nothing to learn from
            ready = [ReadyInterval(i["start_epoch"], i["end_epoch"] or 0.0, i["end_reason"] or "") for i in intervals]
            self.add(run_id, status, memory, ready, usd)
        return intervals

    def cloud(self, per_minute: float, grace_s: float) -> CloudModel:
        """The emulator as this session met it: its hazard and grace, its create -> READY and self-delete."""
        return CloudModel(default_ready=fit(self.ready_s),
                          replacement_ready=fit(self.replacement_ready_s) if self.replacement_ready_s else None,
                          delete_latency=Latency(0.0, 0.0),
                          spot_hazard_per_hour=per_minute * 60, notice_s=grace_s, ends_with_agent=True,
                          self_delete=fit(self.self_delete_s))

    @property
    def agent_exit_s(self) -> float:
        """The agent's exit after a heard notice (median; the agent model's assumed ``Segments.exit_s`` when no
        notice came during a setup)."""
        return statistics.median(self.exit_s) if self.exit_s else Segments.exit_s

    def wake(self, pace_s: float) -> WakeUp:
        """The wake-up as ``watch`` runs it: ``Waker`` lists the markers every second (its first hurried pass
        half a second after the marker, on average), then hurries every ``pace_s``."""
        return WakeUp(delay_s=POLL_S / 2, pace_s=pace_s)


@dataclass(frozen=True)
class Predicted:
    seconds: Band
    usd: Band
    preemptions: float
    simulated: int
    floor_seconds: float = 0.0
    """The median absolute error of the simulated runs' wall times against their own p50 (see the module)."""
    floor_usd: float = 0.0
    both_chance: float = 0.8
    """The share of the simulated runs inside both bands: the chance that an exact forecast puts a run
    inside both. Below 0.8: a run's misses of the two bands are not the same runs (a fast run that met no
    preemption falls below the wall band, a slow one above the cost band)."""


def forecast(settings: Settings, profiles: Sequence[Profile], total_steps: int, cloud: CloudModel, *,
             pass_every_s: float, wake: WakeUp | None, exit_s: float = Segments.exit_s, worlds: int = 40,
             runs_per_world: int = 5, seed: int = 0) -> Predicted:
    """The bands of wall time and cost over at least ``worlds`` x ``runs_per_world`` simulated runs.

    A world's runs start with one measured first attempt's timings and replace a preempted node with one
    measured replacement's, one (a seeded draw) of those that started at about the same moment after their
    run's first READY (what else the machine ran then). Every first attempt sets up the same number of
    worlds (``worlds`` rounded up to a multiple of their count, in a seeded order), so every profile weighs
    the same in the band instead of as often as a draw happens to pick it."""
    firsts = [profile.pace for profile in profiles if profile.attempt == 1]
    if not firsts:
        raise ValueError("a calibration needs at least one run that met no preemption (a whole first attempt)")
    rng = random.Random(seed)
    rng.shuffle(firsts)
    replacements = tuple((profile.offset_s, profile.pace) for profile in profiles if profile.attempt > 1)
    seconds: list[float] = []
    usd: list[float] = []
    preemptions: list[int] = []
    for world in range(math.ceil(worlds / len(firsts)) * len(firsts)):
        first = firsts[world % len(firsts)]
        job = AgentModel(total_steps=total_steps, steps_per_s=first.steps_per_s,
                         segments=Segments(setup_s=first.setup_s, checkpoint_every_s=1e9, save_s=0.0, restore_s=0.0,
                                           final_s=first.final_s, listen_s=first.listen_s, exit_s=exit_s),
                         replacements=replacements)
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
    both = statistics.fmean(_inside(wall, seconds_band) and _inside(cost, usd_band)
                            for wall, cost in zip(seconds, usd, strict=True))
    return Predicted(seconds_band, usd_band, statistics.fmean(preemptions), len(seconds),
                    statistics.median(_error(value, seconds_band) for value in seconds),
                    statistics.median(_error(value, usd_band) for value in usd), both)


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


def score(runs: Iterable[Measured], predicted: Predicted) -> Score:
    done = list(runs)
    if not done:
        raise ValueError("nothing to score: no measured run")
    seconds = [_inside(r.seconds, predicted.seconds) for r in done]
    usd = [_inside(r.usd, predicted.usd) for r in done]
    return Score(len(done), sum(s and u for s, u in zip(seconds, usd, strict=True)), sum(seconds), sum(usd),
                 statistics.median(_error(r.seconds, predicted.seconds) for r in done),
                 statistics.median(_error(r.usd, predicted.usd) for r in done))
