"""The parts of a reconcile pass (``tpuops.controller.reconcile``): the step a pass runs besides its runs, what it
reports, what it read and decided of one run, what a controller remembers of a run between passes, and the
small helpers its phases share (a pool for the reads and the actions, a listing lookup, a status read, a run's
spending).

Concurrency is the pass's (``reconcile``'s docstring): a worker touches only its own run's ``_Seen`` entry and
reports through its own ``_Outcome``, which the pass's thread merges into the ``PassReport`` in index order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, TypeVar

from tpuops import runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.decide import Decision
from tpuops.core.clock import Clock, utc_now
from tpuops.core.errors import DamagedDocument, Interrupted, PreconditionFailed, TpuopsError
from tpuops.core.notices import Notice
from tpuops.fleet import Fleet, Listing
from tpuops.notify import outbox
from tpuops.providers.nodes import NodeInfo, NodeState
from tpuops.runs import AgentStatus, Memory, RunRecord
from tpuops.store import Store
from tpuops.store.lease import Leases

T = TypeVar("T")


class PassStep(Protocol):
    """Work a full pass does besides its runs, handed to the ``Controller`` by whoever builds it.

    The sweeps' advancing is one (``tpuops.sweeps.advance.SweepStep``): composed from above, so that the
    controller imports no sweep, and the sweeps, no controller. Its order in a pass is the contract:

    - ``run``: once per full pass (never in a targeted one, ``run_pass(only=...)``), before the runs are read,
      so that the runs it declares get their nodes, and those it finishes lose theirs, in this same pass. It
      is given what the pass holds: the settings, the store, the Fleet, the pass's ``Leases`` and the names
      of the leases it holds (a lease the step takes is added to ``held``, so that ``release`` drops it too),
      and the pass's ``progress``. It returns what it did, JSON-able: the pass report's ``sweeps``. One
      sweep's failure is that sweep's error in what it returns, never the pass's.
    - ``tell``: after the runs' actions of the same pass, its messages (``tpuops.notify``), so that no
      receiver holds up the runs' teardown.
    """

    def run(self, now: float, *, settings: Settings, store: Store, fleet: Fleet, leases: Leases,
            held: set[str], progress: Callable[[str], None]) -> dict[str, Any]: ...

    def tell(self, now: float, round_: outbox.Round | None = None) -> None: ...


@dataclass
class PassReport:
    runs: int = 0
    acted: list[tuple[str, str, str]] = field(default_factory=list)  # (run, action, zone)
    skipped_leased: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # another controller acted on it during this pass
    errors: dict[str, str] = field(default_factory=dict)  # run -> why this pass could not finish it
    reaped: list[str] = field(default_factory=list)
    unlisted_zones: list[str] = field(default_factory=list)
    finished: dict[str, str] = field(default_factory=dict)
    sweeps: dict[str, Any] = field(default_factory=dict)  # what the sweep step did (PassStep.run)
    passes: int = 1

    def add(self, later: PassReport) -> None:
        """Fold a later pass's report into this one (a reconcile that hurried for a wake marker)."""
        self.runs = max(self.runs, later.runs)
        self.acted.extend(later.acted)
        self.reaped.extend(later.reaped)
        self.finished.update(later.finished)
        self.errors.update(later.errors)
        self.sweeps = later.sweeps or self.sweeps
        self.passes += later.passes


@dataclass
class _Decided:
    """One run's decision, taken before any of its actions ran, and what applying it needs."""

    decision: Decision
    before: int  # how many events the memory had before the decision
    unchanged: bytes  # the memory's bytes before the decision
    notices: list[Notice] = field(default_factory=list)  # what the decision is worth telling (tpuops.notify)

    def quiet(self, memory: Memory) -> bool:
        """Nothing to do: no action, and no memory to save (the steady state of a run)."""
        return not self.decision.actions and memory.to_bytes() == self.unchanged

    def write_ahead(self, store: Store, seen: dict[str, _Seen], run_id: str, generation: int) -> int | None:
        """Write what the decision must have written before its actions (``Decision.ahead``: a preemption it
        counted); the generation to save the memory at after them, or None when another controller wrote it since
        (the pass drops the run, as a failed save does: the next pass redoes it). A failed write raises: nothing is
        deleted."""
        if self.decision.ahead is None:
            return generation
        try:
            return runs.save_memory(store, run_id, self.decision.ahead, generation)
        except PreconditionFailed:
            seen.pop(run_id, None)
            return None


@dataclass(frozen=True)
class _Outcome:
    """What a pass did with one run, merged into its ``PassReport`` by the pass's own thread, in index order."""

    acted: tuple[tuple[str, str], ...] = ()  # (action, zone)
    finished: str | None = None
    error: str | None = None


_NOTHING = _Outcome()
"""The outcome of most runs in most passes: one object, not one per run."""


@dataclass
class _Run:
    """What a pass read of one run before it listed the nodes."""

    record: RunRecord
    memory: Memory
    generation: int


@dataclass
class _Pass:
    """What one pass has learned so far, handed from phase to phase (``Controller.run_pass``)."""

    now: float
    only: str | Collection[str] | None
    """The runs a targeted pass is about (read afresh); None: a full pass over the index."""
    stepping: PassStep | None
    """The step a full pass runs besides its runs (the sweeps'); None in a targeted pass, or for a controller
    handed none."""
    report: PassReport = field(default_factory=PassReport)
    states: dict[str, _Run] = field(default_factory=dict)  # read: the runs read, by id
    damaged: list[str] = field(default_factory=list)  # read: the runs whose record or memory is damaged
    listed: Listing = field(default_factory=dict)  # observe: the nodes listed, by zone and name
    failed: dict[str, TpuopsError] = field(default_factory=dict)  # observe: the zones that could not be listed
    nodes: dict[str, NodeInfo | None] = field(default_factory=dict)  # observe: each run's node, None when unlisted
    live: list[str] = field(default_factory=list)  # decide: the runs still to reconcile, in index order
    held: dict[str, tuple[Memory, int]] = field(default_factory=dict)  # decide: memory and generation under lease
    decided: dict[str, _Decided] = field(default_factory=dict)  # decide: the runs decided without I/O
    outcomes: dict[str, _Outcome] = field(default_factory=dict)  # decide and act: what was done with each run


class _Skip(Enum):
    LEASED = "leased elsewhere"
    DEFERRED = "acted on by another controller during this pass"


_LEASED, _DEFERRED = _Skip.LEASED, _Skip.DEFERRED


@dataclass
class _Seen:
    """The controller's copies of one run's memory and status, and what they are good for."""

    marker: int  # the index marker's generation when the memory was read
    tenure: int | None  # the lease tenure it was read under (None: read without the lease)
    memory: Memory  # as read or last saved; a pass decides on this very object
    saved: bytes  # its bytes as read or last saved
    generation: int
    status: AgentStatus | None = None
    status_state: NodeState | None = None
    status_due: float = 0.0  # monotonic time after which the status is read again
    stop: str | None = None  # why a stop was requested, as read with the memory (a request rewrites the marker)
    status_damage: str | None = None  # why the last read of status.json failed (damaged); None: it was read


def _inline_or_pooled(ids: list[str], inline: Callable[[str], T | None], pooled: Callable[[str], T], *,
                      workers: int = runs.MAX_READERS, threads: bool = True) -> dict[str, T]:
    """``inline`` for each id (no I/O: what is cached, or needs nothing done), then ``pooled`` in a
    thread pool of ``workers`` (without ``threads``: in this thread) for the ids it left (None); in the order
    of ``ids``."""
    done = {run_id: inline(run_id) for run_id in ids}
    rest = [run_id for run_id, value in done.items() if value is None]
    done.update(zip(rest, runs.parallel_map(pooled, rest, workers) if threads else map(pooled, rest), strict=True))
    return done  # type: ignore[return-value]  # every None was replaced by pooled's value


def _unless(stop: threading.Event) -> Callable[[], None]:
    """Between two polls of a wait: end it (``Interrupted``) once ``stop`` is set."""

    def check() -> None:
        if stop.is_set():
            raise Interrupted("the pass was interrupted; the next one creates the replacement")

    return check


def _one_at_a_time(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say`` behind a lock: the runs a pass acts on concurrently report from their workers."""
    lock = threading.Lock()

    def locked(text: str) -> None:
        with lock:
            say(text)

    return locked


def _status_or_damage(store: Store, run_id: str) -> AgentStatus | DamagedDocument | None:
    """The agent's status, or why it cannot be read: a damaged status is this pass's news, never its failure."""
    try:
        return runs.read_status(store, run_id)
    except DamagedDocument as err:
        return err


def _memory_at(store: Store, run_id: str, generation: int) -> Callable[[], bool]:
    """Whether the run's memory is still at ``generation`` (the one its action was decided on, or written ahead
    at): ``Leases.acting`` asks before it takes back a lease it finds damaged."""
    return lambda: runs.load_memory(store, run_id)[1] == generation


def _asks(memory: Memory, node: NodeInfo | None) -> bool:
    """Whether the pass asks the API where the run's create stands: it is in flight, its node not listed yet."""
    pending = memory.pending_create
    return node is None and pending is not None and pending.error is None and bool(pending.operation)


def _find(listed: Listing, name: str) -> NodeInfo | None:
    for nodes in listed.values():
        if name in nodes:
            return nodes[name]
    return None


def _spent(ledger: Ledger, settings: Settings, run_id: str, clock: Clock) -> float:
    """What the run's nodes cost so far, from the ledger, at the controller's clock (a simulation's is virtual): what
    its budget is held to (a damaged run's too) and its notices are priced at."""
    from tpuops.billing.cost import catalog_for, spent

    return spent(ledger, catalog_for(settings), project=settings.project, run_id=run_id, now=utc_now(clock))
