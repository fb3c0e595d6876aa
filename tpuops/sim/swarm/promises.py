"""The invariants of what the user is promised about one run: its checkpoints, what ``runs --json`` tells, that a
poison record stays its own run's, and that a stop is final and quick. Named checkers as in ``invariants`` (which
lists them with the others in ``AFTER_PASS`` and ``AT_END``), kept apart so that neither module grows past its size.

Each reads the same ``Trace``. ``runs --json`` is read as the command reads it: ``tpuops.runs.list_runs`` and each
``Run.to_json``, the rows that the front door's ``list_runs`` (``tpuops.api.runs``) hands to ``tpuops runs --json``
after adding each run's goodput and cost from the ledger (the simulation may not import the front door, which stands
on it; ``tests/sim/test_swarm.py`` shows the front door's rows agree with these on every field checked here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuops import runs
from tpuops.core.errors import TpuopsError
from tpuops.providers.nodes import NodeState
from tpuops.runs import ExitClass
from tpuops.sim.engine import START
from tpuops.sim.swarm.draw import ZONES

if TYPE_CHECKING:
    from tpuops.sim.swarm.trace import Trace

_READS_ROW = ("memory", "status", "run")
"""The documents a row of ``runs --json`` is made of: a run with one of them garbled may be shown damaged."""


def at(seconds: float) -> str:
    """A virtual moment as minutes from the simulation's start (how every violation names a time)."""
    return f"+{(seconds - START) / 60:.1f} min"


def checkpoint_kept(trace: Trace) -> list[str]:
    """truth: a recovered preemption keeps every checkpointed step: each attempt after the first (after a preemption,
    and as well after a crash, a hang, a move or a resume) resumes from a step no lower than the newest checkpoint an
    attempt before it saved; no checkpoint is lost."""
    bad = []
    for run_id, agent in sorted(trace.sim.world.agents.by_run.items()):
        for attempt, started, resumed, saved in agent.starts:
            if resumed < saved:
                bad.append(f"{run_id}: attempt {attempt} at {at(started)} resumed from step {resumed}; step {saved} "
                           "was checkpointed before it")
    return bad


def runs_json_rows(trace: Trace) -> dict[str, dict[str, Any]] | str:
    """``runs --json``'s rows by run, or why the listing failed."""
    try:
        return {row["run_id"]: row for row in (run.to_json() for run in runs.list_runs(trace.sim.store))}
    except (TpuopsError, ValueError, KeyError, TypeError) as err:  # a damaged document must not fail the listing
        return f"runs --json fails: {type(err).__name__}: {err}"


PREEMPTING = ("preempted", "terminated")
"""How a billed node ends when the cloud took it: preempted, or TERMINATED by a maintenance event (a spot node's,
which Compute Engine counts as a preemption)."""


_RESTARTS = ("crash", "hang", "unhealthy", "unbooted", "vanished")
"""The memory events of a restart the controller decided (``tpuops.controller.decide._restart``)."""


def _recovered(trace: Trace, run_id: str) -> int:
    """How many of the run's nodes the cloud preempted while a later node of the run followed (the run recovered),
    but for a node the run had let go before the cloud took it (``_let_go``)."""
    lives = sorted((b.start, b.end, b.reason) for b in trace.intervals() if b.run_id == run_id)
    return sum(1 for start, end, reason in lives[:-1]
               if reason in PREEMPTING and not _let_go(trace, run_id, start, end or trace.now))


def _let_go(trace: Trace, run_id: str, start: float, end: float) -> bool:
    """The run had let its node (READY from ``start``, preempted at ``end``) go before the cloud took it: the node's
    agent had ended its attempt by itself (crashed, say: an exit other than the notice's), or the controller had
    decided a restart in that time (its memory's event; its delete had not got through, or its dead-man's switch was
    waiting for an API that did not answer). That preemption interrupted nothing: the run recovered from the crash or
    restart, which it counts as one (``Memory.crashes``), and nothing the controller could see (an API down until
    the node was gone, a node we were deleting) tells it the cloud took the node first."""
    agent = trace.sim.world.agents.by_run.get(run_id)
    if agent is not None and any(start <= at < end and how is not ExitClass.PREEMPTED for at, how in agent.exits):
        return True
    memory = trace.memory(run_id)
    return memory is not None and any(event["kind"] in _RESTARTS and start <= event["at"] < end
                                      for event in memory.events)


def _row_faults(trace: Trace, run_id: str, row: dict[str, Any]) -> list[str]:
    """Where the row of a run no fault garbled differs from what its agent and the cloud did."""
    agent = trace.sim.world.agents.by_run.get(run_id)
    step, exit_class = agent.reported if agent else (0, None)
    real = sum(1 for b in trace.intervals() if b.run_id == run_id and b.reason in PREEMPTING)
    memory = trace.memory(run_id)
    ended = trace.finished_at(memory) if memory is not None else None
    done = agent.finished_at if agent is not None else None
    first = done is not None and ended is not None and done <= ended and run_id not in trace.resumed
    bad = []
    if not row["finished"] or (row["outcome"] == "succeeded" and done is None) or \
            (first and row["outcome"] != "succeeded"):
        bad.append(f"finished {row['finished']}, outcome {row['outcome']}; its agent "
                   f"{'never succeeded' if done is None else 'succeeded at ' + at(done)}")
    if row["exit_class"] != (exit_class.value if exit_class else None) or row["step"] != step:
        bad.append(f"exit {row['exit_class']} at step {row['step']}; its agent last reported "
                   f"{exit_class.value if exit_class else None} at step {step}")
    if row["preemptions"] > real or memory is None or row["preemptions"] != memory.preemptions:
        bad.append(f"{row['preemptions']} preemptions; the cloud preempted {real} of its nodes, its memory counts "
                   f"{memory.preemptions if memory else None}")
    return bad


def _stopped_or_moved(trace: Trace, run_id: str) -> int:
    """How many of the run's preemptions may have met a delete of ours first (a stop, a down): those are no
    preemption to the run."""
    return sum(1 for _, run, what in trace.orders if run == run_id and what in ("stop", "down"))


def preemptions_counted(trace: Trace) -> list[str]:
    """truth: no recovered preemption goes uncounted: a run no fault poisoned counts at least as many preemptions as
    the cloud preempted its nodes while another node of the run followed (less one for each stop or down of the
    user's, which may have met a preempted node first: that is no preemption to the run). A node the run had let go
    before the cloud took it (its agent crashed, or a restart was under way: ``_let_go``) was no preemption to the
    run either: what it recovered from was the crash or the restart."""
    bad = []
    for run_id in trace.judged():
        memory = trace.memory(run_id)
        wanted = _recovered(trace, run_id) - _stopped_or_moved(trace, run_id)
        if memory is not None and memory.preemptions < wanted:
            bad.append(f"{run_id}: counts {memory.preemptions} preemptions; it recovered from "
                       f"{_recovered(trace, run_id)}")
    return bad


def runs_json(trace: Trace) -> list[str]:
    """truth: the outcome ``tpuops runs --json`` shows matches what the world did, for every run: each is listed once;
    one whose memory, status and record no fault garbled is not shown damaged; one no fault poisoned is finished,
    ``succeeded`` only when its agent did every step and saved, and so whenever its agent did that before the run
    ended otherwise (an agent may succeed after a budget stop whose delete the API refused), with the exit class and
    the step its agent last reported, and the preemptions its memory counts, no more than the cloud made of its
    nodes."""
    rows = runs_json_rows(trace)
    if isinstance(rows, str):
        return [rows]
    bad = []
    for plan in trace.scenario.runs:
        run_id, row = plan.run_id, rows.get(plan.run_id)
        garbled = trace.garbled.get(run_id, set()) & set(_READS_ROW)
        if row is None:
            bad.append(f"{run_id}: not listed by runs --json")
        elif row["damaged"] and not garbled:
            bad.append(f"{run_id}: shown damaged ({row['damaged']}) but no fault garbled it")
        elif not garbled and run_id not in trace.poisoned:
            bad += [f"{run_id}: runs --json shows {fault}" for fault in _row_faults(trace, run_id, row)]
    return bad


def poison_isolated(trace: Trace) -> list[str]:
    """liveness: a poison record (a garbled memory, status, record, stop request or lease of one run) affects only its
    own run: after a pass that met no other fault no other run has an error in it, and ``runs --json`` lists every
    other run whole (``poison_isolated_at_end``: every other run still ends)."""
    if not trace.garbled:
        return []
    bad = []
    if trace.clean_pass:
        bad += [f"{run_id}: the pass at {at(trace.now)} failed it ({error}) beside the poison of "
                f"{', '.join(sorted(trace.garbled))}" for run_id, error in sorted(trace.errors.items())
                if run_id not in trace.garbled]
    rows = runs_json_rows(trace)
    if isinstance(rows, str):
        return [*bad, f"{rows} (poison of {', '.join(sorted(trace.garbled))})"]
    bad += [f"{plan.run_id}: runs --json shows it damaged ({rows[plan.run_id]['damaged']}) beside the poison of "
            f"{', '.join(sorted(trace.garbled))}" for plan in trace.scenario.runs
            if plan.run_id not in trace.garbled and (rows.get(plan.run_id) or {}).get("damaged")]
    return bad


def poison_isolated_at_end(trace: Trace) -> list[str]:
    """liveness: a poison record affects only its own run: every run whose documents no fault garbled has ended."""
    if not trace.garbled:
        return []
    bad = []
    for plan in trace.scenario.runs:
        memory = trace.memory(plan.run_id) if plan.run_id not in trace.garbled else None
        if plan.run_id not in trace.garbled and (memory is None or not memory.finished):
            bad.append(f"{plan.run_id}: never ended beside the poison of {', '.join(sorted(trace.garbled))}")
    return bad


def stop_takes_effect(trace: Trace) -> list[str]:
    """liveness: a stop takes effect within one pass once the API answers: after a pass that met no fault at all,
    every run whose stop or down was recorded before it is finished and its node is going (none of it READY)."""
    if not trace.clean_pass:
        return []
    bad = []
    cloud = trace.sim.world.provider
    for run_id, stopped in trace.stops.items():
        if run_id in trace.poisoned or stopped > trace.now:
            continue
        memory = trace.memory(run_id)
        ready = [zone for zone in ZONES if (node := cloud.find_node(zone, run_id)) and node.state is NodeState.READY]
        if memory is not None and not memory.finished:
            bad.append(f"{run_id}: stop recorded at {at(stopped)}, still {memory.phase} after a fault-free pass at "
                       f"{at(trace.now)}")
        elif ready:
            bad.append(f"{run_id}: stop recorded at {at(stopped)}, its node still READY in {ready[0]} after a "
                       f"fault-free pass at {at(trace.now)}")
    return bad


def stop_never_undone(trace: Trace) -> list[str]:
    """nodes: a stop or down is never undone: no node is created for a run once the store took its user's stop or
    down, unless a ``train --resume`` of the run came after that (whether or not the controller had read it yet), or
    the create was in flight: a pass slowed by the API or the store (``Trace.stalls``) read the run before the stop
    came and sent the create after it; the next pass honours the stop (``liveness.stop_takes_effect``)."""
    bad = []
    for created, _zone, name in trace.creates:
        before = [(when, what) for when, run, what in trace.orders if run == name and when <= created]
        if before and max(before)[1] in ("stop", "down"):
            when, what = max(before)
            if any(start < when and created <= end for start, end in trace.stalls):
                continue
            bad.append(f"{name}: node created at {at(created)} after its {what} at {at(when)}")
    return bad


def one_controller_acts(trace: Trace) -> list[str]:
    """nodes: two controllers at once (a cron ``reconcile`` passing in the middle of the ``watch``'s pass, or while
    that pass is stalled) never both act on a run: every create or delete of a run's node (its probe's too) reaches
    the cloud while the run's lease names its sender, live (``tpuops.store.lease``, ``tpuops.core.acting``).

    The lease's promise is one holder at a time, not one per pass: a watch whose pass stalls past its lease's
    expiry hands the run over, and a cron may then take the lease and act, then the watch take it back and act
    again, all within what the runner plays as one pass. So the check is made as each call goes, against the
    lease in the store then, not "at most one holder acted in the pass" (which took such a handover for two
    controllers at once: seed 8147's watch, stalled 4 passes in a listing, acted after the cron had released)."""
    return [f"{send.node}: {send.sender}'s {send.verb} reached the cloud at {at(send.at)} while its run's lease "
            + ("was damaged (nobody's)" if send.holder is None else f"named {send.holder}"
               if send.holder != send.sender else f"had run out at {at(send.expires)}")
            for send in trace.sends if send.holder != send.sender or send.expires <= send.at]
