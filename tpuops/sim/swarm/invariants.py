"""The invariants the swarm checks: each a named checker whose docstring states it.

A checker reads a ``Trace`` (what the runner saw: the world's billing truth, the ledger, the store, the creates
the cloud took, the user's commands, the faults' windows) and returns one line per violation. ``AFTER_PASS``
checkers run after every pass, ``AT_END`` ones once the seed has drained; each run of a checker counts as one
check in the summary. A run whose memory or record a fault garbled (``Trace.poisoned``) is excused from the
truth and ending checks (nothing can be decided for it until someone repairs it) but never from the money and
node checks: a poison record may cost its own run, never bill unseen.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import datetime

from tpuops.billing.cost import ready_intervals
from tpuops.billing.ledger import DELETED
from tpuops.core.clock import UTC
from tpuops.providers.simulated import Billed
from tpuops.runs import ExitClass, Outcome
from tpuops.sim.engine import START
from tpuops.sim.swarm import faults as f
from tpuops.sim.swarm import notices
from tpuops.sim.swarm import promises as p
from tpuops.sim.swarm import sweep_invariants as sweeps
from tpuops.sim.swarm.draw import ZONES
from tpuops.sim.swarm.faults import STORE_GARBLE
from tpuops.sim.swarm.promises import at as _at
from tpuops.sim.swarm.trace import Trace

LEDGER_SHARE = 0.01
"""The ledger's READY seconds of a node are within 1 % of the cloud's billing..."""
LEDGER_SLACK_S = 2.0
"""...or within this many seconds (a node READY for a minute is dated to the second, not to 0.6 s)."""

# -- after every pass -------------------------------------------------------------------------------


def pass_completes(trace: Trace) -> list[str]:
    """liveness: every pass completes, whatever any run, record, document or answer holds (no exception but the
    injected death of the controller ever escapes a pass)."""
    errors, trace.pass_errors = trace.pass_errors, []
    return errors


def nothing_for_ended_run(trace: Trace) -> list[str]:
    """nodes: nothing is created for a run that has ended (its memory finished before the create, and no
    ``train --resume`` came between)."""
    bad = []
    for at, _zone, name in trace.creates:
        memory = trace.memory(name)
        ended = trace.finished_at(memory) if memory is not None else None
        if ended is not None and ended < at and trace.resumed.get(name, 0.0) < ended:
            bad.append(f"{name}: node created at {_at(at)} after the run ended {memory.outcome} at {_at(ended)}")
    return bad


# -- at the end of the seed -------------------------------------------------------------------------


def _ledger_seconds(trace: Trace) -> dict[tuple[str, str], float]:
    end = datetime.fromtimestamp(trace.now, UTC)
    seen: dict[tuple[str, str], float] = {}
    for history in trace.sim.ledger.histories(trace.sim.settings.project):
        key = (history.node.zone, history.node.name)
        seen[key] = seen.get(key, 0.0) + sum((i.end - i.start).total_seconds()
                                             for i in ready_intervals(history.transitions, end))
    return seen


_UNDATED = {"preempted": 1, "job-ended": 1, "terminated": 1, "maintenance": 2}
"""By the reason a READY interval ended: how many moments of it no call dates (a preemption, a self-delete, a host
maintenance: the ledger dates them between two sightings; a maintenance restart's return to READY too)."""


def _undated_slack(trace: Trace, end: float) -> float:
    """How far the ledger may date an end no call dates (a preemption, a self-delete) from where it was: half a
    pass interval, or more where the passes that framed it were further apart. The observer dates such an end in
    the middle of the gap between the sightings before and after it, but no further back than the gap before
    (``BillingObserver._changed_at``): off by at most half a pass while passes come at their pace, by up to half
    of a longer gap (a pass skipped or late: the swarm's seed 462, a preemption dated 193 s early in a 600-s gap),
    and by the gap less the one before it when that one was shorter than half (a pass come early)."""
    half = trace.scenario.cron_s / 2
    after = bisect.bisect_right(trace.passes, end)
    if after == 0 or after >= len(trace.passes):
        return half
    gap = trace.passes[after] - trace.passes[after - 1]
    before = trace.passes[after - 1] - trace.passes[after - 2] if after >= 2 else gap
    return max(half, gap / 2, gap - before)


def _billed_seconds(trace: Trace) -> dict[tuple[str, str], tuple[float, float, float]]:
    """By node (zone, name): its READY seconds in the cloud's billing, how far the ledger may date its ends that no
    call dates (``_UNDATED``: the ledger dates them between two sightings, ``_undated_slack``), and
    when it was first READY."""
    billed: dict[tuple[str, str], tuple[float, float, float]] = {}
    for interval in trace.intervals():
        key = (interval.zone, interval.name)
        seconds, slack, first = billed.get(key, (0.0, 0.0, interval.start))
        end = interval.end
        if end is not None:
            slack += _UNDATED.get(interval.reason, 0) * _undated_slack(trace, end)
        billed[key] = (seconds + (end or trace.now) - interval.start, slack, min(first, interval.start))
    return billed


def _tolerance(seconds: float, slack_s: float) -> float:
    """How far a node's READY seconds in the ledger may be from the cloud's: 1 % (or ``LEDGER_SLACK_S``), and how
    far its undated ends may be dated (``_undated_slack``; ``tpuops.billing.observer``: within the gap between the
    sightings before and after)."""
    return max(LEDGER_SHARE * seconds, LEDGER_SLACK_S) + slack_s


def billing_never_missed(trace: Trace) -> list[str]:
    """money: every node the cloud billed is in the ledger, with no fewer READY seconds than the cloud billed
    (within 1 %, and half a pass, or half the gap between the passes around it, per end that no call dates): no
    cost goes unseen by ``tpuops cost`` or a budget, whatever the API or the store did meanwhile (issue 38's first
    defect)."""
    ledger = _ledger_seconds(trace)
    bad = []
    for key, (seconds, slack_s, _) in sorted(_billed_seconds(trace).items()):
        held = ledger.get(key)
        if held is None:
            bad.append(f"{key[1]} in {key[0]}: billed {seconds:.1f} s READY, missing from the ledger")
        elif seconds - held > _tolerance(seconds, slack_s):
            bad.append(f"{key[1]} in {key[0]}: the ledger holds {held:.1f} s READY, the cloud billed {seconds:.1f} s")
    return bad


def self_delete_dated(trace: Trace) -> list[str]:
    """money: a node that deleted itself ends in the ledger where its self-delete did (within ``LEDGER_SLACK_S``),
    whenever the ledger ends it at all: its delete operation is the evidence (``ledger.evidence_end``), never the
    middle of the gap between sightings nor its run's end, so a run that ended while the API failed is billed until
    its delete got through (issue 38's first defect). Later is allowed by the time faults kept the controller from
    seeing it, and a pass more (a listing that lags answers what a pass before its window saw: the node READY after
    its delete; the ledger keeps it on the safe side).
    An end some other fact dated first (our own delete, a preemption seen) is not this checker's."""
    ends: dict[tuple[str, str], list[float]] = {}
    for history in trace.sim.ledger.histories(trace.sim.settings.project):
        ended = [t.at.timestamp() for t in history.transitions if t.state in (DELETED, "DELETING")]
        ends.setdefault((history.node.zone, history.node.name), []).extend(ended[:1])
    bad = []
    for interval in trace.intervals():
        if interval.reason != "job-ended" or interval.end is None:
            continue
        held = [at for at in ends.get((interval.zone, interval.name), []) if interval.start <= at]
        nearest = min(held, key=lambda at: abs(at - interval.end), default=None)  # type: ignore[operator]
        if nearest is None:
            continue
        late, busy = nearest - interval.end, trace.busy_s(interval.end, nearest, ledger=True)
        if late < -LEDGER_SLACK_S or late > LEDGER_SLACK_S + (busy + trace.scenario.cron_s if busy else 0.0):
            bad.append(f"{interval.name} in {interval.zone}: deleted itself at +{interval.end - START:.1f} s, "
                       f"the ledger ends it at +{nearest - START:.1f} s")
    return bad


_HIDE_CREATE_END = (f.API_ERRORS, f.API_OUTAGE, f.API_SLOW, f.API_STUCK_CREATE, f.API_OPERATIONS)
"""Fault kinds that can keep every call from dating a node's READY (its GetOperation and the ListOperations fail,
time out, lag, or the create never reports done)."""


def _guessed_boots(trace: Trace) -> dict[tuple[str, str], float]:
    """By node (zone, name): how long its incarnations booted (created to first READY) when a fault of
    ``_HIDE_CREATE_END`` was on between their create and their end: the ledger dates a READY that no call dates at
    the create, on the safe side (``BillingObserver._guessed_ready``), so it may hold that much more."""
    first: dict[tuple[str, str, float], tuple[float, float]] = {}
    for interval in trace.intervals():
        key = (interval.zone, interval.name, interval.created)
        start, end = first.get(key, (interval.start, interval.end or trace.now))
        first[key] = (min(start, interval.start), max(end, interval.end or trace.now))
    boots: dict[tuple[str, str], float] = {}
    for (zone, name, created), (start, end) in first.items():
        lo, hi = created - START, end - START
        if any(x.kind in _HIDE_CREATE_END and x.start < hi and lo < x.end for x in trace.scenario.faults):
            boots[(zone, name)] = boots.get((zone, name), 0.0) + start - created
    return boots


def ledger_matches_billing(trace: Trace) -> list[str]:
    """money: the ledger bills no node for more than the cloud did, beyond the same tolerance plus the time faults
    kept the controller from looking (a failing listing is no evidence either way: the ledger keeps a node
    READY, on the safe side, until a listing without it), plus the boot of each incarnation whose READY no call
    may have dated (``_guessed_boots``: the ledger dates it at the create, on the safe side, so that it never misses
    what the cloud billed, which money.billing_never_missed and issue 38's first defect demand)."""
    ledger = _ledger_seconds(trace)
    boots = _guessed_boots(trace)
    bad = []
    for key, (seconds, slack_s, first) in sorted(_billed_seconds(trace).items()):
        held = ledger.get(key, 0.0)
        allowed = _tolerance(seconds, slack_s) + trace.busy_s(first, trace.now, ledger=True) + boots.get(key, 0.0)
        if held - seconds > allowed:
            bad.append(f"{key[1]} in {key[0]}: the ledger holds {held:.1f} s READY, the cloud billed {seconds:.1f} s")
    return bad


def no_overrun(trace: Trace) -> list[str]:
    """money: no node bills more than one pass and a delete (``2 cron_s + 120 s``) past its run's end, except while
    the API or the store failed or the controller was down (then at most that long more)."""
    bad = []
    bound = 2 * trace.scenario.cron_s + 120.0
    ends = {}
    for plan in trace.scenario.runs:
        memory = trace.memory(plan.run_id)
        if memory is not None and plan.run_id not in trace.poisoned:
            ends[plan.run_id] = trace.finished_at(memory)
    for interval in trace.intervals():
        ended = ends.get(interval.run_id or "")
        stop = interval.end or trace.now
        if ended is None or stop <= ended + bound or interval.start > ended:
            continue
        if stop - ended > bound + trace.busy_s(ended, stop):
            bad.append(f"{interval.name}: billed until {_at(stop)}, {stop - ended:.0f} s after its run ended at "
                       f"{_at(ended)}")
    return bad


def within_budget(trace: Trace) -> list[str]:
    """money: a run with a budget spends at most its budget plus one pass interval's cost of its node (plus what
    the faults' windows kept the controller from stopping), and plus the cost of what the ledger may be short of the
    cloud's billing on its nodes (``billing_never_missed``'s tolerance: 1 %, and the ends no call dates).

    Why the last part: the controller can only stop on what the ledger says was spent (issue 38: "ledger seconds
    within 1 % of simulated billing"), and the ledger dates a preemption or a maintenance between the sightings
    around it (``_undated_slack``), off by up to half a pass each way; a run whose ends were dated early has spent
    that much more than its pass saw (the swarm's seeds 2515, 6309, 6473, 7689: over by 12-141 s of billing, all
    within the ledger's tolerance). A budget that is off by more than the ledger may be is still a violation."""
    sim = trace.sim

    def price(b: Billed) -> float:
        return sim.catalog.price_per_hour(b.accelerator, b.capacity, b.zone)

    spent = sim.world.billed(price)
    billed = _billed_seconds(trace)
    bad = []
    for plan in trace.scenario.runs:
        if plan.budget_usd is None:
            continue
        mine = [b for b in trace.intervals() if b.run_id == plan.run_id]
        rates = {(b.zone, b.name): price(b) for b in mine}
        slack_s = trace.scenario.cron_s + trace.busy_s(START, trace.now)
        short = sum(rate * _tolerance(billed[key][0], billed[key][1]) / 3600 for key, rate in rates.items())
        allowed = plan.budget_usd + max(rates.values(), default=0.0) * slack_s / 3600 + short
        if spent.get(plan.run_id, 0.0) > allowed:
            bad.append(f"{plan.run_id}: spent ${spent[plan.run_id]:.2f} of a ${plan.budget_usd:.2f} budget "
                       f"(allowed ${allowed:.2f})")
    return bad


def none_left(trace: Trace) -> list[str]:
    """nodes: no node is left in the cloud at the end (every run has ended, or is poisoned and its agent gone)."""
    cloud = trace.sim.world.provider
    return [f"{node.name} left {node.state.value} in {zone}" for zone in ZONES for node in cloud.list_nodes(zone)]


def runs_end(trace: Trace) -> list[str]:
    """liveness: every run that no fault poisoned has ended once the faults are over and the world drained."""
    bad = []
    for run_id in trace.judged():
        memory = trace.memory(run_id)
        if memory is None or not memory.finished:
            bad.append(f"{run_id}: not finished at {_at(trace.now)}")
    return bad


def outcome_is_true(trace: Trace) -> list[str]:
    """truth: a run ends ``succeeded`` only with every step done and its model saved; ``user-error`` and
    ``diverged`` only when its agent said so; ``stopped`` only when a user stopped it; ``budget-exhausted`` only
    with a budget; an agent that succeeded before any stop or budget was honoured makes the run ``succeeded``."""
    bad = []
    total = trace.scenario.total_steps
    budgets = {plan.run_id: plan.budget_usd for plan in trace.scenario.runs}
    stopped = {c.run for c in trace.scenario.commands if c.what in ("stop", "down")}
    for run_id in trace.judged():
        memory = trace.memory(run_id)
        agent = trace.sim.world.agents.by_run.get(run_id)
        exits = {how for _, how in agent.exits} if agent else set()
        if memory is None or not memory.finished:
            continue
        outcome = memory.outcome
        if outcome is Outcome.SUCCEEDED and (agent is None or agent.finished_at is None or agent.checkpoint < total):
            bad.append(f"{run_id}: succeeded without its agent finishing all {total} steps and saving")
        wanted = {Outcome.USER_ERROR: ExitClass.USER_ERROR, Outcome.DIVERGED: ExitClass.DIVERGED}.get(outcome)
        if wanted is not None and wanted not in exits:
            bad.append(f"{run_id}: ended {outcome} but its agent never exited {wanted}")
        if outcome is Outcome.STOPPED and run_id not in stopped:
            bad.append(f"{run_id}: ended stopped but nobody stopped it")
        if outcome is Outcome.BUDGET_EXHAUSTED and budgets.get(run_id) is None:
            bad.append(f"{run_id}: ended budget-exhausted without a budget")
        ended = trace.finished_at(memory)
        if (agent is not None and agent.finished_at is not None and outcome is not Outcome.SUCCEEDED
                and ended is not None and ended > agent.finished_at and run_id not in trace.resumed):
            bad.append(f"{run_id}: its agent succeeded at {_at(agent.finished_at)} but the run ended {outcome} "
                       f"at {_at(ended)}")
    return bad


def user_error_costs_one_node(trace: Trace) -> list[str]:
    """truth: a deterministic user error costs one node: nothing is created for the run after its agent reported
    it (the same spec fails the same way).

    Reported means in a status the store kept: a run whose status a fault garbled after the error (its agent, gone,
    writes no other) is excused (``_error_unread``). The agent's status
    is the one evidence of how it ended; without it the controller finds a node gone without a readable status, which
    it restarts as a vanished node, bounded by ``max_restarts`` (the swarm's seeds 3915, 4445: read errors, or a
    killed pass, kept every pass from reading the error until the garble destroyed it)."""
    bad = []
    for run_id in trace.judged():
        agent = trace.sim.world.agents.by_run.get(run_id)
        failed = [at for at, how in agent.exits if how is ExitClass.USER_ERROR] if agent else []
        if not failed or run_id in trace.resumed or _error_unread(trace, run_id, failed[0]):
            continue
        later = [at for at, _zone, name in trace.creates if name == run_id and at > failed[0]]
        if later:
            bad.append(f"{run_id}: {len(later)} node(s) created after its user error at {_at(failed[0])}")
    return bad


def _error_unread(trace: Trace, run_id: str, failed: float) -> bool:
    """Whether a fault garbled the run's status after its agent's error at ``failed`` (a pass that read the error
    before the garble finished the run, and then nothing was created anyway)."""
    return any(x.kind == STORE_GARBLE and x.run == run_id and x.arg.startswith("status:") and START + x.start >= failed
               for x in trace.scenario.faults)


def preemptions_are_real(trace: Trace) -> list[str]:
    """truth: a run counts no more preemptions than the cloud preempted or terminated its nodes (a user's stop, a
    budget stop, a replacement, a crash or a maintenance restart is never a preemption; a spot node a maintenance
    event TERMINATED is one, as Compute Engine counts it)."""
    bad = []
    for run_id in trace.judged():
        memory = trace.memory(run_id)
        real = sum(1 for b in trace.intervals() if b.run_id == run_id and b.reason in p.PREEMPTING)
        if memory is not None and memory.preemptions > real:
            bad.append(f"{run_id}: counts {memory.preemptions} preemptions, the cloud preempted {real}")
    return bad


Checker = Callable[[Trace], list[str]]

AFTER_PASS: dict[str, Checker] = {
    "liveness.pass_completes": pass_completes,
    "nodes.nothing_for_ended_run": nothing_for_ended_run,
    "liveness.stop_takes_effect": p.stop_takes_effect,
    "nodes.stop_never_undone": p.stop_never_undone,
    "liveness.poison_isolated": p.poison_isolated,
    "nodes.one_controller_acts": p.one_controller_acts,
    "sweeps.no_duplicate": sweeps.no_duplicate,
    "sweeps.nothing_after_stop": sweeps.nothing_after_stop,
    "liveness.delivery_bounded": notices.delivery_bounded,
    "notifications.exactly_once": notices.exactly_once,
    "notifications.none_for_recovered": notices.none_for_recovered,
    "notifications.bad_url_held_back": notices.bad_url_held_back,
}
AT_END: dict[str, Checker] = {
    "money.billing_never_missed": billing_never_missed,
    "money.ledger_matches_billing": ledger_matches_billing,
    "money.self_delete_dated": self_delete_dated,
    "money.no_overrun": no_overrun,
    "money.within_budget": within_budget,
    "nodes.none_left": none_left,
    "liveness.runs_end": runs_end,
    "truth.outcome_is_true": outcome_is_true,
    "truth.user_error_costs_one_node": user_error_costs_one_node,
    "truth.preemptions_are_real": preemptions_are_real,
    "truth.checkpoint_kept": p.checkpoint_kept,
    "truth.runs_json": p.runs_json,
    "truth.preemptions_counted": p.preemptions_counted,
    "liveness.poison_isolated": p.poison_isolated_at_end,
    "sweeps.exact_trials": sweeps.exact_trials,
    "sweeps.study_matches_store": sweeps.study_matches_store,
    "notifications.none_lost": notices.none_lost,
}

