"""The swarm's faults: what each one is, and the faulty views of the cloud and the store that inject them.

A seed's fault schedule is a tuple of ``Fault`` items, each of one ``kind`` (the names below) over a window of
virtual time (seconds from the simulation's start), some with a rate or a target run. The controller sees the
world only through ``FaultyCloud`` (the node provider) and ``FaultyStore`` (the store), which consult the
schedule on every call; the agents and the user's commands go to the clean store underneath, as they would
on a VM and a laptop. Faults that are not calls (a garbled document, an agent's fate, a stockout, a slipped
pass) are applied by the runner (``tpuops.sim.swarm.runner``) at their moment.

Determinism: the controller acts on runs from a thread pool, so the order of its calls varies between two
replays of a seed. No fault is drawn from a shared stream: whether a call fails is a hash of the seed, the
call (method, zone, node or key) and how many such calls came before it, so the same seed fails the same
calls whatever the order. One exception is stated: a controller killed in one run's worker stops the others
where they are, which a replay reproduces only as closely as the threads interleave alike.

Every injection is counted by kind (``Injected``): a fault whose window saw no call injected nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tpuops.core.errors import PreconditionFailed, TransientError
from tpuops.providers.base import NodeProvider
from tpuops.providers.nodes import NodeInfo, NodeRequest, Operation
from tpuops.store import Store
from tpuops.store.base import ObjectInfo, ProgressFn

API_ERRORS = "api.errors"
"""A share (``rate``) of Cloud TPU API calls fail with a 503 over the window."""
API_OUTAGE = "api.outage"
"""Every API call fails over the window (minutes to hours)."""
API_LOST_ANSWER = "api.lost_answer"
"""A create goes through but its answer is lost (the caller sees a 503 for a node that now exists)."""
API_LAGGING_LIST = "api.lagging_list"
"""Listings answer what they answered before the window began (a stale cache in front of the API)."""
API_STUCK_CREATE = "api.stuck_create"
"""A create operation started in the window never reports done (its node still boots)."""
API_UNHEALTHY_WORKER = "api.unhealthy_worker"
"""A worker of the run's slice stops answering (its TPU runtime died) over the window."""
API_STOCKOUT = "api.stockout"
"""No capacity in a zone over the window (the simulated cloud's ``ScriptedStockout``)."""
API_PREEMPTION = "api.preemption"
"""Spot nodes are preempted at ``rate`` per READY hour (the simulated cloud's hazard); counted per preemption."""
STORE_WRITE_ERRORS = "store.write_errors"
"""A share of the controller's store writes fail (a 503) over the window."""
STORE_READ_ERRORS = "store.read_errors"
"""A share of the controller's store reads and listings fail over the window."""
STORE_CAS_CONFLICT = "store.cas_conflict"
"""A share of the controller's compare-and-swap writes meet a generation that just changed."""
STORE_GARBLE = "store.garble"
"""One document of the target run (``doc``) is overwritten with garbage, truncated, or emptied at ``start``."""
CONTROLLER_KILL = "controller.kill"
"""The controller process dies at the ``count``-th store write for the target run from ``start`` on (between two
of its writes); a fresh process (same holder, as a restarted ``watch``) takes over at the next pass."""
CONTROLLER_RIVAL = "controller.rival"
"""A second controller (a cron ``reconcile`` beside the ``watch``) runs a whole pass at every pass from ``start`` to
``end`` (one at least) in the middle of the watch's pass (just before the watch's first create or delete in it:
after it decided, while it holds its leases; after its pass when it makes none), then exits."""
CLOCK_LATE = "clock.late"
"""The pass due at ``start`` comes ``rate`` x the pass interval late."""
CLOCK_EARLY = "clock.early"
"""An extra pass comes ``rate`` x the pass interval before the one due (a pass overrunning into the next)."""
CLOCK_SKIPPED = "clock.skipped"
"""The pass due at ``start`` does not happen."""
AGENT_CRASH = "agent.crash"
AGENT_USER_ERROR = "agent.user_error"
AGENT_NAN = "agent.nan"
AGENT_HANG = "agent.hang"
AGENT_SAVE_FAILS = "agent.save_fails"

# The kinds below are drawn from a stream of their own and played by ``tpuops.sim.swarm.extra``.
API_SLOW = "api.slow"
"""A share (``rate``) of API calls answer up to ``count`` virtual seconds late; past the client's call timeout
(30 s) the call fails there (a 503 to the caller). The pass takes that long: it may overrun the next."""
API_MAINTENANCE = "api.maintenance"
"""A host maintenance event on the run's READY node in the window: on-demand, REPAIRING for ``count`` s then READY
again (its job killed, a new attempt); spot, TERMINATED (``SimulatedCloud.maintenance``)."""
API_NEVER_BOOTS = "api.never_boots"
"""The run's creates in the window (up to ``count`` of them) get a worker that never boots: a single host stays
CREATING for ever, a slice turns READY with that worker unhealthy and its job never steps."""
API_WORKER_DIES = "api.worker_dies"
"""The TPU runtime of one worker (``count``) of the run's READY slice dies in the window: one host of the slice,
not the whole slice; the node stays READY with the worker listed unhealthy, and its job hangs."""
API_OPERATIONS = "api.operations"
"""The node_operations listings fail (``arg`` = ``errors``, a share ``rate`` of them) or answer what they
answered before the window (``lag``) over the window."""
STORE_SLOW = "store.slow"
"""A share (``rate``) of the controller's store reads and writes take up to ``count`` virtual seconds."""
AGENT_LATE_NOTICE = "agent.late_notice"
"""A notice (preemption, or the delete of a READY node) in the window reaches the run's agent ``rate`` s late:
later than its save fits, or after its node is gone, so that save is missed."""
CONTROLLER_OVERRUN = "controller.overrun"
"""The pass at ``start`` stalls ``rate`` pass intervals in its ``count``-th API call, and the next passes (a cron
``reconcile`` beside the ``watch``) run meanwhile: two passes at once, the stalled one acting on what it read."""

KINDS = (API_ERRORS, API_OUTAGE, API_LOST_ANSWER, API_LAGGING_LIST, API_STUCK_CREATE, API_UNHEALTHY_WORKER,
         API_STOCKOUT, API_PREEMPTION, STORE_WRITE_ERRORS, STORE_READ_ERRORS, STORE_CAS_CONFLICT, STORE_GARBLE,
         CONTROLLER_KILL, CONTROLLER_RIVAL, CLOCK_LATE, CLOCK_EARLY, CLOCK_SKIPPED, AGENT_CRASH, AGENT_USER_ERROR,
         AGENT_NAN, AGENT_HANG, AGENT_SAVE_FAILS,
         API_SLOW, API_MAINTENANCE, API_NEVER_BOOTS, API_WORKER_DIES, API_OPERATIONS, STORE_SLOW, AGENT_LATE_NOTICE,
         CONTROLLER_OVERRUN)
"""Every fault kind the swarm draws, in the order its summary lists them."""
FIRST_KINDS = KINDS[:22]
"""The kinds ``draw`` picks from the seed's first stream (a seed draws the same scenario as before the others)."""



class Killed(BaseException):
    """The controller process died here: raised by every call it makes from then on."""


@dataclass(frozen=True)
class Fault:
    """One scheduled fault (see the kind constants): a window of virtual seconds from the start, a rate or
    share, a target run, and what the kind needs besides (a zone, a document, a write count)."""

    kind: str
    start: float
    end: float
    rate: float = 1.0
    run: str = ""
    arg: str = ""
    count: int = 0

    def covers(self, offset: float) -> bool:
        return self.start <= offset < self.end

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def chance(*parts: object) -> float:
    """A number in [0, 1) that depends on ``parts`` alone (the same call fails the same way on a replay)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class Injected:
    """What the faults did: injections by kind, and each call's fault as a hash of what it is (module docstring)."""

    def __init__(self, seed: int, faults: tuple[Fault, ...], offset: Callable[[], float]) -> None:
        self.seed = seed
        self.faults = faults
        self.offset = offset
        self.counts: Counter[str] = Counter()
        self._calls: Counter[tuple[str, ...]] = Counter()
        self._lock = threading.Lock()

    def count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.counts[kind] += n

    def active(self, *kinds: str) -> Iterator[Fault]:
        now = self.offset()
        return (f for f in self.faults if f.kind in kinds and f.covers(now))

    def hits(self, kinds: tuple[str, ...], *call: str) -> str | None:
        """The kind of the fault that fails this call (``call``: its method and target), or None."""
        active = list(self.active(*kinds))
        if not active:
            return None
        with self._lock:
            self._calls[call] += 1
            nth = self._calls[call]
        draw = chance(self.seed, *call, nth)
        for fault in active:
            if draw < fault.rate:
                self.count(fault.kind)
                return fault.kind
        return None


class Death:
    """Whether the controller process is dead (``Killed``), shared by its faulty cloud and store."""

    def __init__(self) -> None:
        self.dead = False

    def check(self) -> None:
        if self.dead:
            raise Killed("the controller process is dead")

    def die(self) -> None:
        self.dead = True
        raise Killed("the controller process was killed between two store writes")


class FaultyCloud:
    """The simulated cloud as the controller sees it, with the schedule's API faults (a ``NodeProvider``)."""

    def __init__(self, inner: NodeProvider, injected: Injected, death: Death, now: Callable[[], float]) -> None:
        self.inner = inner
        self.injected = injected
        self.death = death
        self.now = now
        self.creates: list[tuple[float, str, str]] = []
        """(virtual time, zone, node name) of every create the cloud took."""
        self._listed: dict[str, list[NodeInfo]] = {}
        self._stuck: set[str] = set()
        self.before_acting: Callable[[], None] = lambda: None
        """Called before every create and delete (the runner hands it ``FaultyStore.run_meanwhile``)."""
        self.sent: Callable[[str, str], None] = lambda _verb, _name: None
        """Called with the verb and the node's name once the cloud took a create or delete (the runner notes whose
        lease the run had then: ``nodes.one_controller_acts``)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # poll_interval_s: the cloud's own

    # A capability is a method of the class itself: Python 3.12's isinstance() of a runtime-checkable protocol reads
    # the class statically (inspect.getattr_static), so one only __getattr__ passes through is not seen there.

    def node_operations(self, zone: str, name: str) -> list[Operation]:
        """The cloud's own operations on the node (``ListsOperations``), as the observer dates ends from them."""
        return self.inner.node_operations(zone, name)  # type: ignore[attr-defined,no-any-return]

    def _fail(self, *call: str) -> None:
        self.death.check()
        if self.injected.hits((API_OUTAGE, API_ERRORS), *call):
            raise TransientError(f"simulated: the Cloud TPU API answered 503 to {call[0]}")

    def _sick(self, node: NodeInfo | None) -> NodeInfo | None:
        if node is None:
            return None
        for fault in self.injected.active(API_UNHEALTHY_WORKER):
            if node.name == fault.run and node.hosts > 1:
                self.injected.count(API_UNHEALTHY_WORKER)
                return dataclasses.replace(node, unhealthy_workers=(node.hosts - 1,))
        return node

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        self._fail("list", zone)
        if any(self.injected.active(API_LAGGING_LIST)) and zone in self._listed:
            self.injected.count(API_LAGGING_LIST)
            return list(self._listed[zone])
        found = self.inner.list_nodes(zone)
        self._listed[zone] = found
        return [node for node in map(self._sick, found) if node is not None]

    def find_node(self, zone: str, name: str) -> NodeInfo | None:
        self._fail("get", zone, name)
        return self._sick(self.inner.find_node(zone, name))

    def create_node(self, zone: str, request: NodeRequest) -> Operation:
        self.before_acting()
        self._fail("create", zone, request.name)
        operation = self.inner.create_node(zone, request)
        self.sent("create", request.name)
        if operation.error is not None:  # refused: the zone is out of capacity
            self.injected.count(API_STOCKOUT)
            return operation
        self.creates.append((self.now(), zone, request.name))
        if any(self.injected.active(API_STUCK_CREATE)):
            self.injected.count(API_STUCK_CREATE)
            self._stuck.add(operation.name)
        if self.injected.hits((API_LOST_ANSWER,), "created", zone, request.name):
            raise TransientError("simulated: the create's answer was lost (503)")
        return operation

    def delete_node(self, zone: str, name: str) -> Operation | None:
        self.before_acting()
        self._fail("delete", zone, name)
        operation = self.inner.delete_node(zone, name)
        self.sent("delete", name)
        return operation

    def operation(self, zone: str, name: str) -> Operation:
        self._fail("operation", zone, name)
        operation = self.inner.operation(zone, name)
        if name in self._stuck:
            return dataclasses.replace(operation, done=False, ended=None, error=None)
        return operation


def _run_of(key: str) -> str:
    """The run a store key belongs to (``runs/R/...``, ``leases/R``, ``index/active/R``), or ''."""
    parts = key.split("/")
    if parts[0] in ("runs", "leases") and len(parts) > 1:
        return parts[1]
    return parts[-1] if parts[0] == "index" else ""


class FaultyStore(Store):
    """The store as the controller sees it, with the schedule's store faults and its death (module docstring)."""

    concurrent_reads: ClassVar[bool] = False
    """One thread, as the simulation's own store (``LocalStore``): the reads of several runs (``runs.rebuild_index``)
    went through a thread pool, the one place left where a play's calls could go out in a varying order."""

    def __init__(self, inner: Store, injected: Injected, death: Death) -> None:
        self.inner = inner
        self.injected = injected
        self.death = death
        self.kill: Fault | None = None
        """The kill armed (the runner arms each at its moment): death at the ``count``-th write for its run."""
        self.meanwhile: Callable[[], None] | None = None
        """A rival's pass armed (the runner arms it): it runs just before the next create or delete
        (``FaultyCloud.before_acting``)."""
        self._writes = 0
        self._lock = threading.Lock()

    def run_meanwhile(self) -> None:
        """Run the rival's pass armed, if any (once), then go on as this controller unless it died meanwhile."""
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
            self.death.check()

    def arm(self, kill: Fault) -> None:
        self.kill = kill
        self._writes = 0

    @property
    def uri(self) -> str:
        return self.inner.uri

    def _read(self, method: str, key: str) -> None:
        self.death.check()
        if self.injected.hits((STORE_READ_ERRORS,), method, key):
            raise TransientError(f"simulated: the store answered 503 to a {method} of {key}")

    def _write(self, method: str, key: str) -> None:
        self.death.check()
        kill = self.kill
        if kill is not None and _run_of(key) == kill.run:
            with self._lock:
                self._writes += 1
                due = self._writes >= kill.count
            if due:
                self.kill = None
                self.injected.count(CONTROLLER_KILL)
                self.death.die()
        if self.injected.hits((STORE_WRITE_ERRORS,), method, key):
            raise TransientError(f"simulated: the store answered 503 to a {method} of {key}")

    def stat(self, key: str) -> ObjectInfo:
        self._read("stat", key)
        return self.inner.stat(key)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        self._read("read", key)
        return self.inner.read_versioned(key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._read("list", prefix)
        return self.inner.list(prefix)

    def write_bytes(self, key: str, data: bytes) -> int:
        self._write("write", key)
        return self.inner.write_bytes(key, data)

    def write_if_generation_match(self, key: str, data: bytes, generation: int) -> int:
        self._write("cas", key)
        if self.injected.hits((STORE_CAS_CONFLICT,), "cas", key):
            raise PreconditionFailed(f"simulated: {key} changed since generation {generation}")
        return self.inner.write_if_generation_match(key, data, generation)

    def delete(self, key: str) -> None:
        self._write("delete", key)
        self.inner.delete(key)

    def upload_file(self, path: Path, key: str, *, expected_crc32c: str | None = None,
                    progress: ProgressFn | None = None) -> ObjectInfo:
        self._write("upload", key)
        return self.inner.upload_file(path, key, expected_crc32c=expected_crc32c, progress=progress)

    def download_file(self, key: str, path: Path) -> ObjectInfo:
        self._read("download", key)
        return self.inner.download_file(key, path)


GARBLES = ("garbage", "truncated", "empty")


def garbled(data: bytes, how: str) -> bytes:
    """``data`` damaged ``how`` (one of ``GARBLES``)."""
    if how == "truncated":
        return data[: len(data) // 2]
    return b"" if how == "empty" else b"\x00{\"phase\": \xff not json"
