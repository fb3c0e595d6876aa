"""Goodput: how much of a run's billed TPU time trained it, and where the rest went.

``billed`` is what the cost report bills the run for: the READY intervals of its node
incarnations in the ledger (``tpuops.billing.cost``). The agent reports, per attempt, where its own
seconds went (``AttemptTime``, measured on the VM from the startup script's start); this module
lays the attempts over the billed intervals and names every second:

    boot            READY -> the startup script's start (the VM and its services booting); an
                    interval in which no attempt started is boot as a whole
    setup, productive, recomputed, checkpoint, eval, save   as the agent measured them (the names
                    are the agent's own: ``tpuops.contract.timing.DISJOINT``)
    idle_after_end  the agent's end (or a killed agent's last status write) -> the interval's end,
                    when billing stopped: noticing the end, deleting the node, a preempted VM's
                    last seconds; up to now while a finished agent's node is still READY (its
                    deletes fail: an API outage), so that such an overrun shows in ``tpuops cost``
    unaccounted     billed minus all of the above: work between calls (status, summaries), time
                    after a killed agent's last write, and the ledger's observation lag (its
                    interval edges are seen by polls). Negative when the agent measured more than
                    the ledger billed (the edges were seen late by different amounts).

so the parts sum to ``billed`` exactly (the value: ``tpuops.runs.Goodput``). ``goodput = productive /
billed``. ``lost`` is what the interruptions cost: recomputed steps, the boot and setup of every attempt
after the first, the billed tail of every attempt but the last, and every closed interval in which no attempt
started (a slice that never booted, recreated: paid for, it produced nothing, so it is lost, not boot that led
somewhere); dollars are shared out in proportion to seconds. A stop someone asked for is no interruption: the
stopped attempt is the last, its tail is idle after the end, not lost.

An attempt belongs to the interval it started in (or the nearest one: VM and ledger clocks
differ by the observation lag). A status from an agent older than this accounting has no
attempts: the split is then unknown (``None``), never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime

from tpuops.billing.cost import Interval, node_cost, ready_intervals
from tpuops.billing.ledger import NodeHistory
from tpuops.billing.pricing import Catalog
from tpuops.contract.timing import SEGMENTS
from tpuops.core.clock import UTC
from tpuops.runs.models import AgentStatus, AttemptTime, Goodput


def _owner(attempt: AttemptTime, intervals: Sequence[Interval]) -> int:
    """The index of the interval ``attempt`` started in, else of the one whose start is nearest."""
    started = attempt.started_at or 0.0
    for index, interval in enumerate(intervals):
        if interval.start.timestamp() <= started <= interval.end.timestamp():
            return index
    return min(range(len(intervals)), key=lambda i: abs(intervals[i].start.timestamp() - started))


def split(intervals: Sequence[Interval], attempts: Sequence[AttemptTime], usd: float, *,
          finished: bool = False) -> Goodput | None:
    """Lay ``attempts`` over the billed ``intervals`` (pure; see the module docstring). ``finished``: the agent
    ended, so an interval still open after its last attempt is idle up to now (a live agent's is not)."""
    if not attempts:
        return None
    ordered = sorted(intervals, key=lambda i: i.start)
    billed = sum(interval.seconds for interval in ordered)
    parts: dict[str, float] = defaultdict(float)
    for segment in SEGMENTS:
        parts[f"{segment}_s"] = sum(getattr(a, f"{segment}_s") for a in attempts)
    owned: dict[int, list[AttemptTime]] = defaultdict(list)
    if ordered:
        for attempt in attempts:
            owned[_owner(attempt, ordered)].append(attempt)
    first, last = min(attempts, key=lambda a: a.attempt), max(attempts, key=lambda a: a.attempt)
    lost = parts["recomputed_s"] + sum(a.setup_s for a in attempts if a is not first)
    for index, interval in enumerate(ordered):
        mine = sorted(owned.get(index, []), key=lambda a: a.attempt)
        start, end = interval.start.timestamp(), interval.end.timestamp()
        boot = interval.seconds if not mine else min(max(0.0, (mine[0].started_at or start) - start), interval.seconds)
        ended = mine[-1].last_alive if mine else None
        closed = not interval.open or (finished and last in mine)
        idle = 0.0 if ended is None or not closed else min(max(0.0, end - ended), interval.seconds)
        parts["boot_s"] += boot
        parts["idle_after_end_s"] += idle
        lost += boot if index > 0 or not mine else 0.0  # no attempt started in it: paid for, it produced nothing
        lost += idle if last not in mine else 0.0
    parts["unaccounted_s"] = billed - sum(parts[name] for name in Goodput.PARTS if name != "unaccounted_s")
    return Goodput(billed_s=billed, usd=usd, lost_s=min(lost, billed), attempts=len(attempts), **parts)


def run_goodput(histories: Iterable[NodeHistory], status: AgentStatus | None, catalog: Catalog,
                now: datetime | None = None) -> Goodput | None:
    """The goodput of one run from its nodes' ledger histories and its latest agent status."""
    if status is None or not status.attempts:
        return None
    now = now or datetime.now(UTC)
    intervals: list[Interval] = []
    usd = 0.0
    for history in histories:
        intervals.extend(ready_intervals(history.transitions, now))
        usd += node_cost(history, catalog, now).usd
    return split(intervals, status.attempts, usd, finished=status.exit_class is not None)


def by_run(histories: Iterable[NodeHistory]) -> dict[str, list[NodeHistory]]:
    """Ledger histories grouped by the run their node served (one ledger read for many runs)."""
    grouped: dict[str, list[NodeHistory]] = defaultdict(list)
    for history in histories:
        if history.node.run_id:
            grouped[history.node.run_id].append(history)
    return grouped
