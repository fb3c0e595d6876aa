"""A run's life as one picture: bars for its nodes and attempts, marks for what happened to it (pure).

Inputs are what tpuops already keeps, nothing new is recorded for the picture:

- the ledger's node incarnations of the run (``NodeHistory``): one bar lane per incarnation (per worker
  of an incarnation that is a slice: its workers live and die with it, ``w0`` runs the job), one
  bar per observed state (CREATING, READY, PREEMPTED, DELETING, ...), from a transition to the next;
  an open incarnation's last state runs to ``now``;
- the agent's attempt clocks (``AttemptTime``): one lane per attempt, a SETUP bar from its start to
  its first step and a TRAINING bar from there to its last sign of life;
- the controller's memory events: preemptions, restarts (crash, hang, a slice's unhealthy worker),
  creates and the agent's checkpoint on a preemption notice become marks;
- each preemption's recovery: the time from the preemption to the first step of the next attempt
  that started after it, marked where that step happened.

Evals and checkpoints carry steps, not times: they are placed at the time their step was reached,
interpolated over the attempt that trained it (``steps_at``), and say so in their label.

Times are unix seconds throughout. Nothing here reads the store or a clock: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import NamedTuple

from tpuops.billing.ledger import NodeHistory
from tpuops.providers.offers import Offers, hosts_of
from tpuops.runs import AgentStatus, Event


class MarkKind(str, Enum):
    PREEMPTION = "preemption"
    RECOVERY = "recovery"
    RESTART = "restart"
    CREATE = "create"
    CHECKPOINT = "checkpoint"
    MOVE = "move"
    EVAL = "eval"
    FINISHED = "finished"


EVENT_MARKS: dict[str, MarkKind] = {
    "preempted": MarkKind.PREEMPTION,
    "vanished": MarkKind.PREEMPTION,
    "crash": MarkKind.RESTART,
    "hang": MarkKind.RESTART,
    "unhealthy": MarkKind.RESTART,
    "unbooted": MarkKind.RESTART,
    "create": MarkKind.CREATE,
    "notice": MarkKind.CHECKPOINT,
    "moved-up": MarkKind.MOVE,
    "size-down": MarkKind.MOVE,
    "finished": MarkKind.FINISHED,
}
"""Which controller events are drawn, and as what; the others are listed below the picture only."""

PREEMPTIONS = frozenset(kind for kind, mark in EVENT_MARKS.items() if mark is MarkKind.PREEMPTION)


class Bar(NamedTuple):
    """A node incarnation in one state, or an attempt in SETUP or TRAINING, from ``start`` to ``end``."""

    lane: str
    state: str
    start: float
    end: float


class Mark(NamedTuple):
    """Something that happened at one moment; ``label`` is its tooltip."""

    kind: MarkKind
    at: float
    label: str


@dataclass(frozen=True)
class Recovery:
    preempted_at: float
    first_step_at: float

    @property
    def seconds(self) -> float:
        return self.first_step_at - self.preempted_at


@dataclass(frozen=True)
class Timeline:
    start: float
    end: float
    lanes: list[str] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)


def _ts(at: datetime) -> float:
    return at.timestamp()


def node_bars(histories: Sequence[NodeHistory], now: float, offers: Offers) -> list[Bar]:
    """One bar per observed state of each incarnation (of each worker of a slice, as ``offers`` shape it: the
    configured provider's); DELETED draws nothing. The incarnations of an elastic run that ran on several sizes
    name their size in their lane (``node r1 #2 v2-8``)."""
    bars: list[Bar] = []
    sized = len({history.node.accelerator for history in histories}) > 1
    for number, history in enumerate(histories, start=1):
        size = f" {history.node.accelerator}" if sized else ""
        times = [_ts(t.at) for t in history.transitions]
        ends = [*times[1:], _ts(history.node.deleted_at) if history.node.deleted_at else now]
        for lane in _lanes(f"node {history.node.name} #{number}{size}", hosts_of(offers, history.node.accelerator)):
            bars += [Bar(lane, t.state, start, max(start, end))
                     for t, start, end in zip(history.transitions, times, ends, strict=True) if t.state != "DELETED"]
    return bars


def _lanes(lane: str, hosts: int) -> list[str]:
    """The lane of an incarnation, or one per worker when it is a slice (``... w0`` runs the job)."""
    return [lane] if hosts == 1 else [f"{lane} w{worker}" for worker in range(hosts)]


def attempt_bars(status: AgentStatus | None) -> list[Bar]:
    """SETUP (start to first step) and TRAINING (first step to last sign of life) of every attempt."""
    bars: list[Bar] = []
    for attempt in status.attempts if status else []:
        lane = f"attempt {attempt.attempt}"
        end = attempt.last_alive
        if attempt.started_at is not None:
            setup_end = attempt.first_step_at if attempt.first_step_at is not None else end
            if setup_end is not None:
                bars.append(Bar(lane, "SETUP", attempt.started_at, max(attempt.started_at, setup_end)))
        if attempt.first_step_at is not None and end is not None:
            bars.append(Bar(lane, "TRAINING", attempt.first_step_at, max(attempt.first_step_at, end)))
    return bars


def recoveries(events: Sequence[Event], status: AgentStatus | None) -> list[Recovery]:
    """For each preemption, the first step of the first attempt that started after it (if one did yet)."""
    firsts = sorted(a.first_step_at for a in (status.attempts if status else [])
                    if a.first_step_at is not None and a.started_at is not None)
    found: list[Recovery] = []
    for event in events:
        if event["kind"] in PREEMPTIONS:
            after = [t for t in firsts if t > event["at"]]
            if after:
                found.append(Recovery(event["at"], after[0]))
    return found


def steps_at(status: AgentStatus | None, step: int) -> float | None:
    """When ``step`` was reached, interpolated over the last attempt that trained through it."""
    if status is None or not status.attempts or status.step <= 0:
        return None
    last = status.attempts[-1]
    first_step, end = last.first_step_at, last.last_alive
    start_step = status.resumed_from_step or 0
    if first_step is None or end is None or status.step <= start_step:
        return None
    if step < start_step:
        return None
    return first_step + (end - first_step) * (step - start_step) / (status.step - start_step)


def step_marks(status: AgentStatus | None) -> list[Mark]:
    """Evals and the last checkpoint, at the time their step was reached (estimated from steps)."""
    marks: list[Mark] = []
    if status is None:
        return marks
    for point in status.evals:
        at = steps_at(status, point.step)
        if at is not None:
            metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted(point.metrics.items()))
            marks.append(Mark(MarkKind.EVAL, at, f"eval at step {point.step} (time from steps): {metrics}"))
    if status.last_checkpoint_step is not None:
        at = steps_at(status, status.last_checkpoint_step)
        if at is not None:
            marks.append(Mark(MarkKind.CHECKPOINT, at,
                              f"checkpoint at step {status.last_checkpoint_step} (time from steps)"))
    return marks


def build(histories: Sequence[NodeHistory], events: Sequence[Event], status: AgentStatus | None,
          now: float, offers: Offers) -> Timeline:
    """The whole picture of one run; an empty run is a timeline with no lanes. ``offers``: the configured
    provider's, which say how many workers each node has."""
    bars = node_bars(histories, now, offers) + attempt_bars(status)
    found = recoveries(events, status)
    marks = [Mark(EVENT_MARKS[e["kind"]], e["at"], e["message"]) for e in events if e["kind"] in EVENT_MARKS]
    marks += [Mark(MarkKind.RECOVERY, r.first_step_at, f"first new step {r.seconds:.0f} s after the preemption")
              for r in found]
    marks += step_marks(status)
    times = [t for bar in bars for t in (bar.start, bar.end)] + [m.at for m in marks]
    lanes = list(dict.fromkeys(bar.lane for bar in bars))
    return Timeline(start=min(times, default=now), end=max(times, default=now), lanes=lanes, bars=bars,
                    marks=sorted(marks, key=lambda m: m.at), recoveries=found)
