"""The notifications invariants: what the receivers took against what the runs' memories decided.

Each checker reads the ``Trace`` (``tpuops.sim.swarm.invariants``) and its ``receivers`` (the simulated
receivers' log, ``tpuops.sim.swarm.receivers``); a seed without a target checks nothing here. A run a fault
garbled (``Trace.poisoned``) is left out: its memory, the record of what was decided, is what was damaged.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tpuops import runs
from tpuops.core.errors import TpuopsError
from tpuops.core.notices import Kind, Notice, State
from tpuops.notify.outbox import LATE_S
from tpuops.notify.rules import KIND_OF_OUTCOME
from tpuops.runs import Memory, layout
from tpuops.sim.engine import START

if TYPE_CHECKING:
    from tpuops.sim.swarm.receivers import Receivers
    from tpuops.sim.swarm.trace import Trace

ENDINGS = frozenset({Kind.SUCCEEDED, Kind.FAILED, Kind.RESTARTS_EXHAUSTED, Kind.BUDGET})
"""The kinds a run's ending is told by (one per ending)."""


def _memories(trace: Trace) -> dict[str, Memory]:
    """By run (every run no fault garbled, whose memory reads): its memory as the store holds it now.

    Read again only when its generation moved (a stat, not a parse: these checkers run after every pass, and
    most passes write no memory); the copies are read, never changed, here."""
    assert trace.receivers is not None
    held, store, out = trace.receivers.memories, trace.sim.store, {}
    for run_id in trace.judged():
        try:
            generation = store.stat(layout.memory_key(run_id)).generation
            if run_id not in held or held[run_id][0] != generation:
                memory, generation = runs.load_memory(store, run_id)
                held[run_id] = (generation, memory)
        except TpuopsError:
            continue
        out[run_id] = held[run_id][1]
    return out


def _decided(trace: Trace) -> dict[str, list[Notice]]:
    """By run: the notices its memory holds (``_memories``)."""
    return {run_id: memory.notices for run_id, memory in _memories(trace).items()}


def _resumes(trace: Trace, run_id: str, after: float) -> int:
    """The user's ``train --resume`` of the run applied after ``after`` and by now."""
    return sum(1 for c in trace.scenario.commands
               if c.what == "resume" and c.run == run_id and after < START + c.at <= trace.now)


def _receivers(trace: Trace) -> Receivers | None:
    receivers = trace.receivers
    return receivers if receivers is not None and receivers.plan.targets else None


def exactly_once(trace: Trace) -> list[str]:
    """notifications: each decided notice reaches each of its targets exactly once, or again with the same
    idempotency key (the one allowed duplicate): every message a receiver took carries one key in its header and
    its body, the key of a notice its run's memory holds (nothing is sent before its write-ahead); a delivery
    marked sent was taken; a memory holds each key once; and a run's endings reach a target under no more keys
    than it ended (an ending decided again under a new key is a duplicate no receiver can drop)."""
    receivers = _receivers(trace)
    if receivers is None:
        return []
    decided = _decided(trace)
    keys = {run_id: Counter(n.key for n in notices) for run_id, notices in decided.items()}
    bad = [f"{a.target} took a message whose header key {a.key!r} is not its body's {a.body_key!r}"
           for a in receivers.arrivals if a.key != a.body_key]
    taken = {(a.target, a.key) for a in receivers.arrivals if a.taken}
    for target, key in sorted(taken):
        run_id = key.split("/")[0]
        if run_id in keys and key not in keys[run_id]:
            bad.append(f"{target} took {key}, which no memory of {run_id} holds (sent before its write-ahead)")
    for run_id, notices in decided.items():
        bad += [f"{run_id}: its memory holds {key} {n} times" for key, n in keys[run_id].items() if n > 1]
        for notice in notices:
            bad += [f"{run_id}: {notice.key} marked sent to {d.target}, which never took it"
                    for d in notice.deliveries if d.state is State.SENT and (d.target, notice.key) not in taken]
        endings = {(target, key) for target, key in taken if key.split("/")[0] == run_id
                   and key.split("/")[1] in {k.value for k in ENDINGS}}
        for target in {target for target, _ in endings}:
            told = sorted(key for t, key in endings if t == target)
            if len(told) > 1 + _resumes(trace, run_id, 0.0):
                bad.append(f"{run_id}: {target} was told its ending under {len(told)} keys ({', '.join(told)})")
    return bad


def none_lost(trace: Trace) -> list[str]:
    """notifications: no decided delivery is silently lost: at the end each one is ``sent`` or ``gave-up``, never
    left pending, and one gives up only after its receiver failed it (a 4xx, or failures past
    ``give_up_after_s``): a target that keeps failing ends in ``gave-up``, a healthy one is never given up on."""
    receivers = _receivers(trace)
    if receivers is None:
        return []
    failed = {(a.target, a.key) for a in receivers.arrivals if a.answer not in ("ok",)}
    bad = []
    for run_id, notices in _decided(trace).items():
        for notice in notices:
            for d in notice.deliveries:
                if d.state is State.PENDING:
                    bad.append(f"{run_id}: {notice.key} to {d.target} still pending at the end ({d.attempts} tries)")
                elif d.state is State.GAVE_UP and (d.target, notice.key) not in failed:
                    bad.append(f"{run_id}: {notice.key} to {d.target} given up, but its receiver never failed it "
                               f"({d.error or 'no error'})")
    return bad


def none_for_recovered(trace: Trace) -> list[str]:
    """notifications: no failure notice for a preemption the run recovered from, nor any ending notice for a
    user's stop: a run's ending is told only once it has ended, by the kind its outcome is worth
    (``notify.rules.KIND_OF_OUTCOME``: none for ``stopped``), unless the user resumed it since."""
    if _receivers(trace) is None:
        return []
    bad = []
    for run_id, memory in _memories(trace).items():
        for notice in memory.notices:
            if notice.kind not in ENDINGS or _resumes(trace, run_id, notice.at):
                continue
            if not memory.finished:
                bad.append(f"{run_id}: told {notice.kind} ({notice.key}) while it goes on ({memory.phase})")
            elif KIND_OF_OUTCOME[memory.outcome] is not notice.kind:  # type: ignore[index]
                bad.append(f"{run_id}: told {notice.kind} ({notice.key}) but it ended {memory.outcome}")
    return bad


def bad_url_held_back(trace: Trace) -> list[str]:
    """notifications: a webhook URL the HTTP client would refuse (a space, CR, LF, control or non-ASCII
    character, no host, port 0, plain http to a remote host) in a target's ``url_env`` is refused in one line
    naming the target and the variable, never the value (a secret), by a command that starts work (``train``,
    ``notify test``: issue 38's second defect); every controller process that reads it starts and passes with that
    target held back, saying so in such a line, so that nothing a target holds stops a pass (the quality bar);
    nothing is sent to it, and its deliveries wait until it is fixed (``none_lost`` holds them to their end)."""
    receivers = _receivers(trace)
    if receivers is None:
        return []
    loads, receivers.loads = receivers.loads, []
    return [f"a process started at +{(x.at - START) / 60:.1f} min with {x.target}'s url_env malformed: {x.verdict}"
            for x in loads if x.verdict not in ("refused", "held back")]


def delivery_bounded(trace: Trace) -> list[str]:
    """liveness: a pass's deliveries end within ``deliver_budget_s`` (+ 0.5 s) of virtual time from the first,
    whatever the targets hold (a dead receiver costs a pass one ``timeout_s``, not one per delivery), and no
    receiver's answer escapes the pass: a delivery's failure is that delivery's alone, so a dead or garbling
    receiver never stops another run's recovery (``notify.isolated_delivery``)."""
    receivers = _receivers(trace)
    if receivers is None:
        return []
    bound = receivers.plan.deliver_budget_s + LATE_S + 1e-6
    spans, receivers.spans = receivers.spans, []
    escaped, receivers.escaped = receivers.escaped, []
    return ([f"a pass's deliveries took {span:.1f} s of its {bound:.1f} s bound" for span in spans if span > bound]
            + [f"a receiver's answer stopped a pass: {what}" for what in escaped])
