"""One seed's scenario: the runs, the user's commands and the fault schedule, all drawn from the seed.

A scenario is plain data (``Scenario``): the runner plays it, the shrinker drops parts of it and plays it again,
and its JSON is what a failing seed's report shows. ``draw(seed)`` is a pure function of the seed.

What a seed draws: one job (its steps, speed and checkpoint interval, shared by the seed's runs), the pass
interval (cron every 60 or 300 s), one to four runs (single hosts and four-host v2-32 slices, spot and on-demand, some
with a budget), the user's ``stop``, ``down`` and ``train --resume`` at drawn moments, and a fault schedule of a
few to a dozen faults (``tpuops.sim.swarm.faults``) inside the first ``FAULT_HOURS`` hours; after those the
faults end and the runner drains the world to the end. Some seeds also draw a sweep (``tpuops.sim.swarm.sweeps``),
from a stream of its own: a seed draws the same runs, commands and faults with or without one. Notification targets
and their receivers' faults come from another stream of the seed's own (``tpuops.sim.swarm.receivers``).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from tpuops.sim.agent import Fate, FateKind
from tpuops.sim.model import AgentModel, Segments
from tpuops.sim.swarm import extra
from tpuops.sim.swarm import faults as f
from tpuops.sim.swarm.receivers import NotifyPlan, draw_notify
from tpuops.sim.swarm.sweeps import STOP_SWEEP, SwarmSweep, draw_sweep

ZONES = ("us-central1-a", "europe-west4-a")
FAULT_HOURS = 6.0
"""Faults fall inside the first six virtual hours; the drain after them has none."""
RIVAL_S = 3600.0
"""How long a rival controller (``controller.rival``) passes beside the watch: an hour of cron beside it."""

_FATES = {f.AGENT_CRASH: FateKind.CRASH, f.AGENT_USER_ERROR: FateKind.USER_ERROR, f.AGENT_NAN: FateKind.NAN,
          f.AGENT_HANG: FateKind.HANG, f.AGENT_SAVE_FAILS: FateKind.SAVE_FAILS}


@dataclass(frozen=True)
class RunPlan:
    """One run the seed declares at the start."""

    run_id: str
    accelerator: str
    spot: bool
    budget_usd: float | None = None


@dataclass(frozen=True)
class Command:
    """A user's command at ``at`` virtual seconds: ``stop``, ``down`` (of the run's node) or ``resume``."""

    what: str
    run: str
    at: float


@dataclass(frozen=True)
class Scenario:
    """Everything one seed plays (module docstring)."""

    seed: int
    cron_s: float
    total_steps: int
    steps_per_s: float
    checkpoint_every_s: float
    runs: tuple[RunPlan, ...]
    commands: tuple[Command, ...]
    faults: tuple[f.Fault, ...]
    sweep: SwarmSweep | None = None
    """The seed's sweep, drawn apart (``tpuops.sim.swarm.sweeps``); None: the seed has none."""
    notify: NotifyPlan = field(default_factory=NotifyPlan)
    """The notification targets and the receivers' faults, drawn from a stream of their own
    (``tpuops.sim.swarm.receivers``): adding them changed nothing else any seed draws."""

    @property
    def job(self) -> AgentModel:
        """The seed's job; with a sweep, its trials (and runs) evaluate eight times along it."""
        return AgentModel(total_steps=self.total_steps, steps_per_s=self.steps_per_s,
                          segments=Segments(setup_s=60.0, checkpoint_every_s=self.checkpoint_every_s, save_s=10.0,
                                            restore_s=10.0),
                          eval_every_steps=max(1, self.total_steps // 8) if self.sweep else 0)

    def played(self) -> Scenario:
        """What the runner plays: the seed's faults and commands with its sweep's faults and ``stop --sweep`` after
        them (the scenario itself keeps them apart, so that its own stay what the seed drew)."""
        if self.sweep is None:
            return self
        stop = (Command(STOP_SWEEP, "", self.sweep.stop_at),) if self.sweep.stop_at is not None else ()
        return dataclasses.replace(self, commands=self.commands + stop, faults=self.faults + self.sweep.faults)

    def fates(self) -> dict[str, dict[int, Fate]]:
        """The agent faults by run and attempt."""
        out: dict[str, dict[int, Fate]] = {}
        for fault in self.faults:
            if fault.kind in _FATES:
                out.setdefault(fault.run, {})[fault.count] = Fate(_FATES[fault.kind], fault.rate)
        return out

    def parts(self) -> int:
        """How many droppable parts it has (runs, commands, faults, the sweep's, the receivers' faults and targets):
        what the shrinker works through."""
        return (len(self.runs) + len(self.commands) + len(self.faults) + (self.sweep.parts() if self.sweep else 0)
                + self.notify.parts())

    def without(self, index: int) -> Scenario:
        """The scenario without its ``index``-th part (runs first, then commands, faults, the sweep's parts, the
        receivers' faults and targets); a dropped run takes its commands and faults with it, a dropped target its
        receiver's faults."""
        if index < len(self.runs):
            gone = self.runs[index].run_id
            return dataclasses.replace(
                self, runs=tuple(r for r in self.runs if r.run_id != gone),
                commands=tuple(c for c in self.commands if c.run != gone),
                faults=tuple(x for x in self.faults if x.run != gone))
        index -= len(self.runs)
        if index < len(self.commands):
            return dataclasses.replace(self, commands=self.commands[:index] + self.commands[index + 1:])
        index -= len(self.commands)
        if index < len(self.faults):
            return dataclasses.replace(self, faults=self.faults[:index] + self.faults[index + 1:])
        index -= len(self.faults)
        if self.sweep is not None and index < self.sweep.parts():
            return dataclasses.replace(self, sweep=self.sweep.without(index))
        return dataclasses.replace(self, notify=self.notify.without(index - (self.sweep.parts() if self.sweep else 0)))

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "cron_s": self.cron_s, "total_steps": self.total_steps,
                "steps_per_s": self.steps_per_s, "checkpoint_every_s": self.checkpoint_every_s,
                "runs": [dataclasses.asdict(r) for r in self.runs],
                "commands": [dataclasses.asdict(c) for c in self.commands],
                "faults": [x.to_json() for x in self.faults], "notify": self.notify.to_json(),
                **({"sweep": self.sweep.to_json()} if self.sweep else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scenario:
        """A scenario as ``to_json`` wrote it (a shrunk seed kept in the tree replays from this)."""
        return cls(seed=data["seed"], cron_s=data["cron_s"], total_steps=data["total_steps"],
                   steps_per_s=data["steps_per_s"], checkpoint_every_s=data["checkpoint_every_s"],
                   runs=tuple(RunPlan(**r) for r in data["runs"]),
                   commands=tuple(Command(**c) for c in data["commands"]),
                   faults=tuple(f.Fault(**x) for x in data["faults"]),
                   sweep=SwarmSweep.from_json(data["sweep"]) if data.get("sweep") else None,
                   notify=NotifyPlan.from_json(data.get("notify")))


def _window(rng: random.Random, shortest_s: float, longest_s: float) -> tuple[float, float]:
    start = rng.uniform(0, FAULT_HOURS * 3600)
    return start, start + rng.uniform(shortest_s, longest_s)


def _fault(rng: random.Random, kind: str, runs: tuple[RunPlan, ...]) -> f.Fault:
    """One fault of ``kind`` at a drawn moment, rate and duration."""
    run = rng.choice(runs).run_id
    if kind == f.API_ERRORS:
        return f.Fault(kind, *_window(rng, 60, 4 * 3600), rate=rng.choice([0.05, 0.2, 0.5, 0.9, 1.0]))
    if kind == f.API_OUTAGE:
        return f.Fault(kind, *_window(rng, 120, rng.choice([900, 3 * 3600])))
    if kind == f.API_LOST_ANSWER:  # creates are few and early: a long window from early on meets some
        start, end = _window(rng, 2 * 3600, 6 * 3600)
        return f.Fault(kind, start / 4, end, rate=rng.choice([0.3, 0.5, 0.7, 1.0]))
    if kind in (f.STORE_WRITE_ERRORS, f.STORE_READ_ERRORS, f.STORE_CAS_CONFLICT):
        return f.Fault(kind, *_window(rng, 300, 3 * 3600), rate=rng.choice([0.1, 0.3, 0.7, 1.0]))
    if kind in (f.API_LAGGING_LIST, f.API_STUCK_CREATE):
        return f.Fault(kind, *_window(rng, 60, 1800))
    if kind == f.API_UNHEALTHY_WORKER:
        return f.Fault(kind, *_window(rng, 60, 2 * 3600), run=run)
    if kind == f.API_STOCKOUT:
        return f.Fault(kind, *_window(rng, 600, 4 * 3600), arg=rng.choice(ZONES))
    if kind == f.API_PREEMPTION:
        return f.Fault(kind, 0.0, FAULT_HOURS * 3600, rate=rng.choice([0.5, 1.0, 3.0]))
    if kind == f.STORE_GARBLE:
        at = rng.uniform(0, FAULT_HOURS * 3600)
        return f.Fault(kind, at, at, run=run, arg=f"{rng.choice(('memory', 'status', 'stop', 'lease', 'run'))}:"
                                                  f"{rng.choice(f.GARBLES)}")
    if kind == f.CONTROLLER_KILL:
        at = rng.uniform(0, FAULT_HOURS * 3600)
        return f.Fault(kind, at, at, run=run, count=rng.randint(1, 4))
    if kind == f.CONTROLLER_RIVAL:  # its window's length is no draw: the seeds' other draws stay as they were
        at = rng.uniform(0, FAULT_HOURS * 3600)
        return f.Fault(kind, at, at + RIVAL_S)
    if kind == f.CLOCK_SKIPPED:
        at = rng.uniform(0, FAULT_HOURS * 3600)
        return f.Fault(kind, at, at)
    if kind in (f.CLOCK_LATE, f.CLOCK_EARLY):
        at = rng.uniform(0, FAULT_HOURS * 3600)
        return f.Fault(kind, at, at, rate=rng.choice([0.1, 0.5, 0.9, 3.0 if kind == f.CLOCK_LATE else 0.2]))
    # an agent fate: attempt ``count`` of the run, ``rate`` seconds of stepping into it
    attempt = 1 if kind == f.AGENT_USER_ERROR else rng.randint(1, 3)
    return f.Fault(kind, 0.0, 0.0, rate=rng.uniform(0, 1800), run=run, count=attempt)


def draw(seed: int, *, sweeps: bool = True) -> Scenario:
    """The scenario of ``seed`` (module docstring); ``sweeps=False``: without its sweep (what it draws besides is the
    same either way: the sweep has a stream of its own)."""
    rng = random.Random(f"swarm/{seed}")
    steps_per_s = 10.0
    hours = rng.choice([0.25, 0.5, 1.0, 2.0, 4.0])
    plans = []
    for index in range(rng.choice([1, 1, 2, 2, 3, 4])):
        slice_ = rng.random() < 0.3
        budget = rng.choice([None, None, None, 1.0, 5.0, 20.0])
        plans.append(RunPlan(f"run-{index}", "v2-32" if slice_ else "v3-8", rng.random() < 0.7, budget))
    runs = tuple(plans)
    commands = []
    for run in runs:
        if rng.random() < 0.25:
            stop_at = rng.uniform(0, hours * 3600 * 1.5)
            commands.append(Command(rng.choice(("stop", "down")), run.run_id, stop_at))
            if rng.random() < 0.4:
                commands.append(Command("resume", run.run_id, stop_at + rng.uniform(300, 3 * 3600)))
    faults = [_fault(rng, rng.choice(f.FIRST_KINDS), runs) for _ in range(rng.randint(2, 12))]
    faults += extra.draw(seed, runs, hours)  # from a stream of their own: the draws above stay the seed's
    return Scenario(seed=seed, cron_s=rng.choice([60.0, 300.0, 300.0]),
                    total_steps=int(hours * 3600 * steps_per_s), steps_per_s=steps_per_s,
                    checkpoint_every_s=rng.choice([120.0, 600.0, 1800.0]), runs=runs,
                    commands=tuple(commands), faults=tuple(faults),
                    sweep=draw_sweep(seed, hours, ZONES, FAULT_HOURS) if sweeps else None,
                    notify=draw_notify(seed, FAULT_HOURS))
