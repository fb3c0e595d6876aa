"""What is worth a message: a pure function of a run's memory, the events a pass just added, and the time.

No I/O, no clock, no settings object: the caller passes what the rules read (``RunFacts``), so every rule is
tested without a server (tests/notify/test_notify_rules.py). A notice's key is derived from what was decided (the
subject, the kind, the deciding event's time or the progress it is about), so deciding again from the same
memory gives the same key, and a key already in the memory is never decided twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

from tpuops.billing.deadline import LATE_EVEN_ON_DEMAND
from tpuops.core.guards import Guard
from tpuops.core.kinds import Capacity
from tpuops.core.notices import Delivery, Kind, Notice
from tpuops.runs.memory import Event, Memory
from tpuops.runs.models import AgentStatus
from tpuops.runs.outcome import Outcome

NONE_FOR_STOP = Guard("notify.none_for_stop", "a run the user stopped (or a pruned trial) is told nothing: its ending "
                      "is worth no notice")

LOG_LINES = 10
"""The last lines of a failed run's error that its message carries."""

KIND_OF_OUTCOME = MappingProxyType({
    Outcome.SUCCEEDED: Kind.SUCCEEDED,
    Outcome.USER_ERROR: Kind.FAILED,
    Outcome.CRASHED: Kind.RESTARTS_EXHAUSTED,  # a run ends crashed only once its restarts are used up
    Outcome.DIVERGED: Kind.FAILED,
    Outcome.BUDGET_EXHAUSTED: Kind.BUDGET,
    Outcome.FAILED: Kind.FAILED,
    Outcome.PRUNED: None,  # the sweep's business: its own message says how it ended
    Outcome.STOPPED: None,  # the user asked for it
    Outcome.PREEMPTED_OUT: Kind.FAILED,
})
"""Which notice a run's ending is worth (None: none)."""

TRIAL_KINDS = frozenset({Kind.STALLED})
"""A sweep's trial is told about only when it burns money for nothing; its ending is the sweep's message."""


@dataclass(frozen=True)
class RunFacts:
    """What the rules read besides the memory: the run, its ``notify:`` choice resolved, its last status."""

    run_id: str
    targets: tuple[str, ...]
    kinds: frozenset[Kind]
    stalled_after_s: float
    sweep: str | None = None
    deadline_at: float | None = None
    status: AgentStatus | None = None


def key(subject: str, kind: Kind, at: float) -> str:
    """The idempotency key, ``<subject>/<kind>/<when, in ms>``: stable across passes and controllers for one
    decision (``at`` is the deciding event's time, or for a stall when it began, for a deadline the deadline)."""
    return f"{subject}/{kind}/{round(at * 1000)}"


def run_notices(facts: RunFacts, memory: Memory, new: Sequence[Event], now: float) -> list[Notice]:
    """The notices the events ``new`` (just added to ``memory`` by a pass) and the time ``now`` are worth.

    Only kinds in ``facts.kinds`` and only keys the memory does not hold yet; nothing when there is no target.
    """
    if not facts.targets:
        return []
    kinds = facts.kinds & TRIAL_KINDS if facts.sweep else facts.kinds
    found = [*_from_events(facts, memory, new), *_stalled(facts, memory, now), *_past_deadline(facts, memory, now)]
    held = {notice.key for notice in memory.notices}
    chosen: list[Notice] = []
    for notice in found:
        if notice.kind in kinds and notice.key not in held:
            held.add(notice.key)
            notice.deliveries = [Delivery(target=name) for name in facts.targets]
            chosen.append(notice)
    return chosen


def _from_events(facts: RunFacts, memory: Memory, new: Sequence[Event]) -> list[Notice]:
    run = facts.run_id
    found = []
    for event in new:
        if event["kind"] == "finished" and memory.outcome is not None:
            kind = KIND_OF_OUTCOME[memory.outcome]
            if kind is None and not NONE_FOR_STOP.on:
                kind = Kind.FAILED
            if kind is None:
                continue
            failed = kind is not Kind.SUCCEEDED
            found.append(Notice(
                key=key(run, kind, event["at"]), kind=kind, at=event["at"], subject=run,
                title=f"run {run} {_TITLES[kind]}", details=[event["message"]],
                metric=_metrics(facts.status), log_tail=_log_tail(facts.status) if failed else []))
        elif (event["kind"] == "capacity" and facts.deadline_at is not None
              and memory.capacity is Capacity.ON_DEMAND):
            late = LATE_EVEN_ON_DEMAND in event["message"]
            kind = Kind.DEADLINE_AT_RISK if late else Kind.DEADLINE_ON_DEMAND
            found.append(Notice(key=key(run, kind, event["at"]), kind=kind, at=event["at"], subject=run,
                                title=f"run {run} {_TITLES[kind]}", details=[event["message"]]))
    return found


def _stalled(facts: RunFacts, memory: Memory, now: float) -> list[Notice]:
    """No step progress for ``stalled_after_s`` while a node is READY (billed): once per stall."""
    since = memory.progress_at or memory.ready_since
    if memory.finished or memory.ready_since is None or since is None or now - since < facts.stalled_after_s:
        return []
    minutes = (now - since) / 60  # keyed by when the stall began: one stall, one key, however long it lasts
    return [Notice(key=key(facts.run_id, Kind.STALLED, since), kind=Kind.STALLED, at=now, subject=facts.run_id,
                   title=f"run {facts.run_id} {_TITLES[Kind.STALLED]}",
                   details=[f"no step progress for {minutes:.0f} min (last step {max(memory.progress_step, 0)}) "
                            "while its node is READY and billed"])]


def _past_deadline(facts: RunFacts, memory: Memory, now: float) -> list[Notice]:
    """A deadline passed with the run still going: it can no longer be met (once)."""
    if facts.deadline_at is None or memory.finished or now < facts.deadline_at:
        return []
    return [Notice(key=key(facts.run_id, Kind.DEADLINE_AT_RISK, facts.deadline_at), kind=Kind.DEADLINE_AT_RISK,
                   at=now, subject=facts.run_id, title=f"run {facts.run_id} {_TITLES[Kind.DEADLINE_AT_RISK]}",
                   details=["its deadline has passed and the run is still going"])]


def sweep_notice(name: str, targets: tuple[str, ...], kinds: frozenset[Kind], ended: tuple[str, str],
                 best: tuple[int, float] | None, metric: str, cost_usd: float, now: float) -> Notice | None:
    """The message a sweep's ending (``ended``: its outcome and why) is worth, with its best trial; None if
    turned off or nobody listens."""
    if not targets or Kind.SWEEP_FINISHED not in kinds:
        return None
    outcome, reason = ended
    details = [f"{outcome}: {reason}"]
    if best is not None:
        details.append(f"best trial {best[0]}: {metric} {best[1]:.6g}")
    return Notice(key=key(name, Kind.SWEEP_FINISHED, now), kind=Kind.SWEEP_FINISHED, at=now, scope="sweep",
                  subject=name, title=f"sweep {name} {outcome}", details=details, cost_usd=round(cost_usd, 2),
                  metric={metric: best[1]} if best is not None and math.isfinite(best[1]) else {},
                  deliveries=[Delivery(target=target) for target in targets])


_TITLES = {
    Kind.SUCCEEDED: "succeeded",
    Kind.FAILED: "failed",
    Kind.RESTARTS_EXHAUSTED: "failed: its restarts are used up",
    Kind.BUDGET: "stopped: its budget is spent",
    Kind.DEADLINE_ON_DEMAND: "moves to on-demand to meet its deadline",
    Kind.DEADLINE_AT_RISK: "cannot meet its deadline",
    Kind.STALLED: "makes no progress while billed",
}


def _metrics(status: AgentStatus | None) -> dict[str, float]:
    """The run's last evaluation (finite values only: the message is strict JSON)."""
    if status is None:
        return {}
    last = status.evals[-1].metrics if status.evals else status.metrics
    return {name: float(value) for name, value in last.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)}


def _log_tail(status: AgentStatus | None) -> list[str]:
    if status is None:
        return []
    text = status.traceback or status.message or ""
    return text.splitlines()[-LOG_LINES:]
