"""Reading and writing runs in the store: declare, open, list, follow, reopen, and the index.

Every function takes the ``Store`` it works on and keys come from ``layout`` only. Reads of
several runs go through a thread pool (``MAX_READERS``) on a remote store (``Store.concurrent_reads``),
so listing N runs costs N/k round trips of wall time rather than N.

A listing reads a run with a damaged document as damaged (``Run.damage``) beside the others whole: the guard
``runs.damage_tolerated`` (``tpuops.core.guards``) at that line is what the fault swarm's tests turn off to show that
its poison checks can fail.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tpuops.core.errors import DamagedDocument, NotFound, PreconditionFailed, TpuopsError, UsageError
from tpuops.core.guards import Guard
from tpuops.core.kinds import Capacity
from tpuops.core.naming import check_node_name
from tpuops.runs import layout
from tpuops.runs.memory import Memory
from tpuops.runs.models import (
    AgentStatus,
    ExitClass,
    Goodput,
    NodeSpec,
    Outcome,
    RunKind,
    RunPhase,
    RunRecord,
    StopRequest,
    parse,
)
from tpuops.store import Store

if TYPE_CHECKING:
    from pydantic import BaseModel


MAX_READERS = 16
T = TypeVar("T")
R = TypeVar("R")
Doc = TypeVar("Doc", bound="BaseModel")


# -- single documents ------------------------------------------------------------------------------


def put_once(store: Store, key: str, data: bytes) -> bool:
    """Write ``key`` only if absent; True if written. An existing key with other bytes is an error."""
    try:
        store.write_if_generation_match(key, data, 0)
        return True
    except PreconditionFailed:
        if store.read_bytes(key) != data:
            raise UsageError(f"{store.uri_of(key)} exists with other content: choose another run name") from None
        return False


def declare(store: Store, record: RunRecord, spec: dict[str, Any]) -> None:
    """Write the run's spec and record (each once), then index it: after this the run exists and is active."""
    run_id = record.run_id
    put_once(store, layout.spec_key(run_id), (json.dumps(spec, indent=2) + "\n").encode())
    put_once(store, layout.record_key(run_id), (record.model_dump_json(indent=2) + "\n").encode())
    index_run(store, run_id)
    store.write_bytes(layout.INDEX_ACTIVE + run_id, b"")


def read_document(store: Store, key: str, model: type[Doc], missing: str) -> Doc:
    """The typed document at ``key`` (a run's or a sweep's record); ``UsageError(missing)`` when it is not there,
    ``DamagedDocument`` naming the object when it does not parse."""
    try:
        data = store.read_bytes(key)
    except NotFound:
        raise UsageError(missing) from None
    return parse(model, data, store.uri_of(key))


def read_record(store: Store, run_id: str) -> RunRecord:
    """The run's record; ``UsageError`` when the store has no such run (or the id could name none),
    ``DamagedDocument`` when its run.json cannot be read."""
    check_node_name(run_id, "run id")
    return read_document(store, layout.record_key(run_id), RunRecord,
                         f"no run {run_id!r} in {store.uri} ('tpuops runs' lists them)")


def read_run_spec(store: Store, run_id: str) -> dict[str, Any]:
    """The agent's run spec as declared (``spec.json``, schema ``tpuops/contract/runspec.py``), as plain JSON."""
    return json.loads(store.read_bytes(layout.spec_key(run_id)))


def run_exists(store: Store, run_id: str) -> bool:
    return store.exists(layout.record_key(run_id))


def read_status_versioned(store: Store, run_id: str) -> tuple[AgentStatus | None, int]:
    """The agent's status and its generation; (None, 0) before the agent wrote one.

    An empty object reads as no status yet, not as a broken document. A CI run once saw a
    zero-byte status (``tpuops train`` stopped with exit 2): fake-gcs-server published an upload's
    bytes so far when TensorFlow asked how far a failed upload had got, where Cloud Storage answers
    308. The emulator's fronts now answer those queries themselves (``tpuops.emulator.gcs.uploads``);
    this reading stays as the safe one, since a whole status is never empty.
    """
    key = layout.status_key(run_id)
    try:
        data, generation = store.read_versioned(key)
    except NotFound:
        return None, 0
    if not data.strip():
        return None, generation
    return parse(AgentStatus, data, store.uri_of(key)), generation


def read_status(store: Store, run_id: str) -> AgentStatus | None:
    return read_status_versioned(store, run_id)[0]


def write_status(store: Store, run_id: str, status: AgentStatus) -> None:
    """Write the agent's status whole, as the agent does (it uses ``tf.io.gfile``): for an agent that is
    not the TF one, the simulated agent of ``tpuops.sim``. The control plane itself never writes it."""
    store.write_bytes(layout.status_key(run_id), status.model_dump_json().encode())


def load_memory(store: Store, run_id: str) -> tuple[Memory, int]:
    """The controller's memory of the run and its generation (a fresh memory and 0 when there is none).

    A memory still in its legacy file (``layout.LEGACY_MEMORY``) comes with generation 0: the next
    save creates memory.json, with compare-and-swap like any other.
    """
    key = layout.memory_key(run_id)
    try:
        data, generation = store.read_versioned(key)
    except NotFound:
        legacy = layout.run_key(run_id, layout.LEGACY_MEMORY)
        try:
            return parse(Memory, store.read_bytes(legacy), store.uri_of(legacy)), 0
        except NotFound:
            return Memory(), 0
    return parse(Memory, data, store.uri_of(key)), generation


def save_memory(store: Store, run_id: str, memory: Memory, generation: int) -> int:
    """Write if nobody else did since ``generation``; raises PreconditionFailed otherwise."""
    return store.write_if_generation_match(layout.memory_key(run_id), memory.to_bytes(), generation)


def request_stop(store: Store, run_id: str, reason: str, now: float) -> None:
    """Ask whoever drives the run to stop it (``layout``: ``stop.json``), then rewrite its index marker so that
    a controller's cached copy of the run is read again, the request with it. Needs no lease."""
    store.write_bytes(layout.stop_key(run_id), StopRequest(reason=reason, at=now).model_dump_json().encode())
    mark_active(store, run_id)


def read_stop(store: Store, run_id: str) -> StopRequest | None:
    """The run's stop request, None without one. A request that does not parse is still a request to stop."""
    key = layout.stop_key(run_id)
    try:
        data = store.read_bytes(key)
    except NotFound:
        return None
    try:
        return parse(StopRequest, data, store.uri_of(key))
    except DamagedDocument as err:
        return StopRequest(reason=f"stop requested ({err})", at=0.0)


# -- a run as a whole ------------------------------------------------------------------------------


def is_finished(memory: Memory, status: AgentStatus | None) -> bool:
    """Whether the run is over: the controller finished it, or the agent ended it for good.

    A preempted or crashed agent is not the end (the controller recreates or restarts it).
    """
    return memory.finished or (status is not None and status.final)


DAMAGED = "damaged"
"""A run's phase when one of its documents cannot be read (``Run.damage`` says which, and what is wrong)."""


@dataclass(frozen=True)
class Run:
    """One run as stored: its record, the agent's latest status and the controller's memory.

    A document that cannot be read (``DamagedDocument``) makes the run damaged instead of failing the read:
    ``damage`` holds one line per damaged document, its place is taken by what a missing one reads as (no
    status, a fresh memory; for run.json a stand-in record that names only the run, ``record_known`` False),
    and ``phase`` says ``damaged``. A command that acts on a run it names reads it with ``whole_run``, which
    refuses a damaged one (``train --resume``).
    """

    record: RunRecord
    status: AgentStatus | None
    memory: Memory
    goodput: Goodput | None = None
    """Where its billed seconds went (``tpuops.api.accounting.attach_goodput`` fills it in from the ledger, which
    runs never reads: ``tpuops.accounting`` joins the two)."""
    usd: float = 0.0
    """What the ledger bills it (filled in with ``goodput``), also when its agent reported no attempt clocks (a
    script-mode run, an older agent), whose goodput is then unknown."""
    hosts: int | None = None
    """How many hosts (workers) its node is: 4 on a v3-32 slice, as the configured provider's offers say (filled in
    with ``goodput``: runs asks no provider); None when unknown."""
    damage: tuple[str, ...] = ()
    record_known: bool = True

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def finished(self) -> bool:
        return is_finished(self.memory, self.status)

    @property
    def accelerator(self) -> str:
        """The size its nodes are created at: the record's node, or an elastic run's current size."""
        sizes = self.record.sizes
        return sizes[min(self.memory.size, len(sizes) - 1)].accelerator

    @property
    def outcome(self) -> Outcome | None:
        """How it ended: the controller's outcome, else a final exit the agent reported."""
        if self.memory.outcome is not None:
            return Outcome(self.memory.outcome)
        if self.status is not None and self.status.final and self.status.exit_class is not None:
            return Outcome.of_exit(self.status.exit_class)
        return None

    @property
    def phase(self) -> str:
        """What to show: damaged, finished, pending (no agent yet) or the agent's phase."""
        if self.damage:
            return DAMAGED
        if self.finished:
            return RunPhase.FINISHED.value
        return str(getattr(self.status.phase, "value", self.status.phase)) if self.status else "pending"

    def damage_note(self) -> str:
        """What is damaged and what to do about it, in one line ("" for a whole run)."""
        return f"damaged: {'; '.join(self.damage)} ({repair_hint(self.run_id)})" if self.damage else ""

    def to_json(self) -> dict[str, Any]:
        status = self.status or AgentStatus()
        record = (self.record.model_dump(mode="json", exclude={"node": {"metadata"},
                                                               "smaller": {"__all__": {"metadata"}}})
                  if self.record_known
                  else {**dict.fromkeys(RunRecord.model_fields), "run_id": self.run_id})
        return {
            **record,
            "phase": self.phase, "damaged": "; ".join(self.damage) or None,
            "outcome": self.outcome.value if self.outcome else None,
            "finished": self.finished, "hosts": self.hosts, "step": status.step, "total_steps": status.total_steps,
            "exit_class": status.exit_class.value if status.exit_class else None,
            "heartbeat": status.heartbeat, "metrics": status.metrics,
            "examples_per_sec": status.examples_per_sec, "last_checkpoint_step": status.last_checkpoint_step,
            "checkpoint_in_flight": status.checkpoint_in_flight, "checkpoint_every_s": status.checkpoint_every_s,
            "last_save_s": status.last_save_s,
            "attempts": self.memory.attempts, "preemptions": self.memory.preemptions,
            "restarts": self.memory.crashes, "moves": self.memory.moves, "size": self.accelerator,
            "input_wait_ms": status.input_wait_ms,
            "deterministic": status.deterministic,
            "goodput": self.goodput.to_json() if self.goodput else None, "usd": round(self.usd, 6),
        }


def _stand_in(run_id: str) -> RunRecord:
    """What a run whose run.json is damaged shows as its record: its id, nothing else known (``record_known``)."""
    return RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=NodeSpec(
        name=run_id, accelerator="unknown", runtime="unknown", capacity=Capacity.ON_DEMAND, zones=["unknown"]))


DAMAGE_TOLERATED = Guard("runs.damage_tolerated", "a listing of runs (runs --json, a pass's reads) shows a run with a "
                         "damaged document as damaged, whole beside it, instead of failing for every run")


def _tolerant(read: Callable[[], T], stand_in: T, damage: list[str]) -> T:
    """``read()``, or ``stand_in`` when the document it reads is damaged (the damage goes to ``damage``)."""
    try:
        return read()
    except DamagedDocument as err:
        if not DAMAGE_TOLERATED.on:
            raise
        damage.append(str(err))
        return stand_in


def read_state(store: Store, run_id: str) -> tuple[AgentStatus | None, Memory, tuple[str, ...]]:
    """The agent's status and the controller's memory as far as they can be read, and what is damaged of them
    (a damaged status reads as none, a damaged memory as a fresh one): for readers that must go on past one
    damaged run (listings, a sweep's trials)."""
    damage: list[str] = []
    status = _tolerant(lambda: read_status(store, run_id), None, damage)
    memory = _tolerant(lambda: load_memory(store, run_id)[0], Memory(), damage)
    return status, memory, tuple(damage)


def open_run(store: Store, run_id: str) -> Run:
    """Record, status and memory of one run, as far as they can be read (a damaged document makes the run
    damaged, see ``Run``); ``UsageError`` if there is no such run."""
    damage: list[str] = []
    record = _tolerant(lambda: read_record(store, run_id), None, damage)
    status, memory, more = read_state(store, run_id)
    return Run(record or _stand_in(run_id), status, memory, damage=(*damage, *more),
               record_known=record is not None)


def whole_run(store: Store, run_id: str) -> Run:
    """``open_run`` for a command that acts on the run: a damaged one is refused (``DamagedDocument``, exit 1)
    with the commands that deal with it."""
    run = open_run(store, run_id)
    if run.damage:
        raise DamagedDocument(f"run {run_id} is damaged: {'; '.join(run.damage)}. {repair_hint(run_id)}",
                              where=store.uri_of(layout.record_key(run_id)))
    return run


def repair_hint(run_id: str) -> str:
    """What to do about a damaged run, as every message about one says it."""
    return (f"'tpuops runs repair {run_id}' rebuilds what can be rebuilt; 'tpuops runs forget {run_id}' "
            "deletes its node and removes it from the index")


def parallel_map(fn: Callable[[T], R], items: Iterable[T], workers: int = MAX_READERS) -> list[R]:
    """``[fn(x) for x in items]`` over a thread pool (store round trips overlap), in order.

    Interrupted (Ctrl-C) or failed, it starts no item not started yet and returns at once: the
    items under way finish in their workers, nobody waits for them.
    """
    items = list(items)
    if len(items) <= 1:
        return [fn(item) for item in items]
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)))
    try:
        done = list(pool.map(fn, items))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return done


def _read_each(store: Store, read: Callable[[str], R], run_ids: list[str]) -> list[R]:
    """``read`` of each run, in order: through ``parallel_map`` where the store's round trips overlap
    (``Store.concurrent_reads``), else one after another in this thread (threads would only contend for the CPU)."""
    return parallel_map(read, run_ids) if store.concurrent_reads else [read(run_id) for run_id in run_ids]


def list_runs(store: Store, *, active_only: bool = False) -> list[Run]:
    """Every run (or only the indexed unfinished ones), oldest first, read in parallel where that helps
    (``Store.concurrent_reads``)."""
    ids = active_run_ids(store) if active_only else all_run_ids(store)
    runs = [run for run in _read_each(store, lambda run_id: _open_if_there(store, run_id), ids) if run is not None]
    if active_only:
        runs = [run for run in runs if not run.finished]
    return sorted(runs, key=lambda run: (run.record.created, run.run_id))


def _open_if_there(store: Store, run_id: str) -> Run | None:
    """A run named by the index whose record is gone (deleted by hand) is skipped; a damaged one is listed so."""
    try:
        return open_run(store, run_id)
    except UsageError:
        return None


def _stopped_attempt(store: Store, run_id: str) -> int:
    """The attempt whose agent ended ``stopped`` (it read the run's stop request), 0 when the last did not."""
    try:
        status = read_status(store, run_id)
    except TpuopsError:  # a status that cannot be read is no stop: the next pass reads it as it reads any
        return 0
    return status.attempt if status is not None and status.exit_class is ExitClass.STOPPED else 0


def reopen(store: Store, run_id: str, reason: str) -> bool:
    """Make a finished run active again (``train --resume``): its checkpoints stay, a stop request it had goes;
    True if it was finished."""
    store.delete(layout.stop_key(run_id))
    memory, generation = load_memory(store, run_id)
    reopened = memory.reopen(time.time(), reason)
    stopped = _stopped_attempt(store, run_id)
    handled = max(memory.handled_agent_attempt, stopped)  # its agent's 'stopped' exit is the stop, not news
    if reopened or handled != memory.handled_agent_attempt:
        memory.handled_agent_attempt = handled
        save_memory(store, run_id, memory, generation)
    mark_active(store, run_id)
    return reopened


# -- logs ------------------------------------------------------------------------------------------


class LogTail:
    """Reads one worker's log chunks in order, each once (contract in ``tpuops/agent/logs.py``).

    Worker 0's chunks are the ones directly under the run's ``logs/``; the other workers' folders inside it
    (``layout.logs_prefix``) are theirs, not worker 0's.
    """

    def __init__(self, store: Store, run_id: str, worker: int = 0) -> None:
        self.store = store
        self.prefix = layout.logs_prefix(run_id, worker)
        self.seen: set[str] = set()
        """Every chunk read: an earlier attempt's last chunk may be listed after a later one's first."""

    def new_lines(self) -> list[str]:
        names = sorted(o.key for o in self.store.list(self.prefix)
                       if o.key.endswith(".log") and "/" not in o.key[len(self.prefix):] and o.key not in self.seen)
        lines: list[str] = []
        for key in names:
            try:
                lines.extend(self.store.read_bytes(key).decode(errors="replace").splitlines())
            except NotFound:
                break
            self.seen.add(key)
        return lines


def follow_logs(store: Store, run_id: str, *, follow: bool, poll_s: float, workers: Sequence[int] = (0,),
                sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """The run's log lines (of ``workers``); with ``follow``, keep yielding new ones until the run is finished.

    A preemption or a crash is not the end: the controller brings the run back and its next
    attempt appends to the same log. The run ends when ``is_finished`` says so; the lines
    written before that are all yielded. A damaged status or memory is no end either (``read_state``):
    the agent rewrites its status, and ``tpuops runs repair`` the memory. With more than one worker,
    each line starts with its worker (``[w2] ...``), so that the slice's logs read as one.
    """
    read_record(store, run_id)
    tails = [LogTail(store, run_id, worker) for worker in workers]

    def fresh() -> Iterator[str]:
        for worker, tail in zip(workers, tails, strict=True):
            for line in tail.new_lines():
                yield line if len(tails) == 1 else f"[w{worker}] {line}"

    while True:
        yield from fresh()
        status, memory, _ = read_state(store, run_id)
        if not follow or is_finished(memory, status):
            yield from fresh()
            return
        sleep(poll_s)


# -- the index -------------------------------------------------------------------------------------


def index_run(store: Store, run_id: str) -> None:
    """Put a declared run in the index of all runs (idempotent: ``declare`` does, and whoever finishes a declare)."""
    store.write_bytes(layout.INDEX_RUNS + run_id, b"")


def mark_active(store: Store, run_id: str) -> None:
    store.write_bytes(layout.INDEX_ACTIVE + run_id, b"")


def drop_active(store: Store, run_id: str) -> None:
    """Take the finished run out of the active index, with the wake marker its last notice may have left."""
    store.delete(layout.INDEX_ACTIVE + run_id)
    store.delete(layout.wake_key(run_id))


def _indexed(store: Store, prefix: str) -> dict[str, int]:
    ensure_index(store)
    return {layout.run_of(obj.key, prefix): obj.generation for obj in store.list(prefix)}


def active_index(store: Store) -> dict[str, int]:
    """The runs still indexed as unfinished, with their marker's generation (one listing of ``index/active/``).

    ``declare`` and ``reopen`` rewrite the marker, so a generation that changed since the last look
    means the run was declared or reopened since: what a reader cached of it is stale.
    """
    return _indexed(store, layout.INDEX_ACTIVE)


def active_run_ids(store: Store) -> list[str]:
    """The runs still indexed as unfinished."""
    return list(active_index(store))


def all_run_ids(store: Store) -> list[str]:
    return list(_indexed(store, layout.INDEX_RUNS))


def ensure_index(store: Store) -> None:
    if not store.exists(layout.INDEX_BUILT):
        rebuild_index(store)


def rebuild_index(store: Store) -> int:
    """Index every run under ``runs/`` (one full listing); returns how many runs are active."""
    ids = [obj.key.split("/")[1] for obj in store.list(layout.RUNS)
           if obj.key.count("/") == 2 and obj.key.endswith("/" + layout.RECORD)]

    def index(run_id: str) -> bool:
        index_run(store, run_id)
        try:
            active = not load_memory(store, run_id)[0].finished
        except DamagedDocument:
            active = True  # in view of the passes, which report it damaged
        if active:
            mark_active(store, run_id)
        return active

    active = sum(_read_each(store, index, ids))
    store.write_bytes(layout.INDEX_BUILT, b"")
    return active
