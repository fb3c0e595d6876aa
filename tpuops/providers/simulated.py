"""The simulated Cloud TPU (provider ``simulated``): a ``NodeProvider`` on a clock a simulation moves.

A real implementation of the node-provider protocol (held to the provider contract suite), whose
nodes live on virtual time (``CloudModel``):

- a create is refused inside a stockout episode (its operation ends RESOURCE_EXHAUSTED, as Cloud
  TPU's does), else the node is CREATING and becomes READY after a create -> READY latency drawn
  for its accelerator; its create operation ends then (its end dates the start of billing, as on
  Cloud TPU);
- a READY spot or preemptible node is preempted after an exponential time at its zone's and
  capacity's hazard (or at an age from the model's ``lifetime`` trace): the agent gets the notice
  ``notice_s`` before, the node turns PREEMPTED (with ``ends_with_agent``, the emulator's way: the draw
  dates the notice, and the node turns PREEMPTED when its job has stopped, ``Workload.stops_at``);
- a READY node whose job ends deletes itself (the agent's dead-man's switch does so on a VM), the
  model's ``self_delete`` later: until then it stays READY, billed and preemptible (a preemption then
  is billed, or free under the first-minute rule, like any other; the job has ended, so nobody saves);
  a notice inside the job's final save (``Workload.final_s``) does not stop it either: the job ends as
  it would and the node turns PREEMPTED then, with no self-delete (the startup script sees the notice);
- a delete stops billing at once and frees the name after a drawn delete latency: a create of that
  name before then starts only when the delete is over (the controller's replacement waits for
  the delete; here the wait is folded into the create, so nothing blocks on virtual time);
- what a simulation may do to a node besides (the fault swarm's): a create whose worker never boots
  (``never_boots``: a single host stays CREATING, its create never ends; a slice turns READY with that
  worker listed unhealthy and its job never steps), a slice worker's runtime that dies (``worker_dies``:
  listed unhealthy until the node goes, the job hangs), and a host maintenance event (``maintenance``:
  TPU VMs do not live-migrate; the VM goes down at once, its job killed without time to save; an
  on-demand node is REPAIRING with health UNHEALTHY_MAINTENANCE and READY again later, its startup
  script running a new attempt; a spot or preemptible node is TERMINATED for good).

Events are applied lazily, in time order, whenever the provider is called or ``catch_up`` is: so with
``system_clock`` it is a real-time cloud, with a ``VirtualClock`` a simulation. What runs on a node
is a ``Workload`` (the simulated agents, by run id). Every call is counted per virtual minute (API
quota), every READY interval kept as the billing truth with the first-minute rule
(``tpuops.providers.cloud_tpu.billing_rules``); a node still READY is billed up to the clock's now, as Cloud TPU
bills it. Its rules and offers are Cloud TPU's, named explicitly (``cloud_tpu.offers.CloudTpuRules``): it is
Cloud TPU on a clock, so Google's offers are its model.
Every draw comes from the node's own generator, seeded by (seed, zone, name,
how many creates of that name came before): the controller acts on runs concurrently, so the order of
calls varies from one simulation to the next, and a shared stream would hand a node another run's draw;
so the same seed gives the same timeline whatever the order. Thread-safe: one lock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

from tpuops.core import acting
from tpuops.core.clock import UTC, Clock, system_clock
from tpuops.core.errors import AlreadyExists, CapacityError, NotFound
from tpuops.core.naming import RUN_KEY, run_of
from tpuops.providers.base import Connection, InProcessWorld
from tpuops.providers.cloud_model import EMULATOR_SPEED, CloudModel
from tpuops.providers.cloud_tpu.adapter import CALL_TIMEOUT_S as CALL_TIMEOUT_S  # the client's, a slow answer meets
from tpuops.providers.cloud_tpu.billing_rules import PREEMPTIBLE_CAPACITIES, billed_seconds, preemption_is_free
from tpuops.providers.cloud_tpu.offers import CloudTpuRules
from tpuops.providers.nodes import NodeInfo, NodeRequest, NodeState, Operation
from tpuops.providers.offers import hosts_of


class Workload(Protocol):
    """What runs on the simulated nodes, by run id (the node's run label)."""

    def finish_time(self, run_id: str, ready_at: float, accelerator: str = "") -> float | None:
        """When the run's job would end on a node (of ``accelerator``: an elastic run's size sets its pace) READY at
        ``ready_at`` (None: it never ends by itself)."""
        ...

    def final_s(self, run_id: str) -> float:
        """The job's last seconds (its final save) that a notice no longer stops: it ends as it would."""
        ...

    def stops_at(self, run_id: str, notice_at: float) -> tuple[float, float] | None:
        """After a notice at ``notice_at``: when the job acts on it and when it has stopped (saved, exited);
        None: it does not stop by itself."""
        ...

    def started(self, run_id: str, at: float, accelerator: str = "") -> None: ...

    def interrupted(self, run_id: str, notice_at: float, end_at: float) -> None: ...

    def finished(self, run_id: str, at: float) -> None: ...

    def hung(self, run_id: str, at: float) -> None:
        """The job stops stepping at ``at`` and never ends by itself (a worker of its slice is down)."""
        ...


class Idle:
    """A workload of nodes that run nothing (a provider opened from the registry)."""

    def finish_time(self, run_id: str, ready_at: float, accelerator: str = "") -> float | None:
        return None

    def final_s(self, run_id: str) -> float:
        return 0.0

    def stops_at(self, run_id: str, notice_at: float) -> tuple[float, float] | None:
        return None

    def started(self, run_id: str, at: float, accelerator: str = "") -> None:
        return None

    def interrupted(self, run_id: str, notice_at: float, end_at: float) -> None:
        return None

    def finished(self, run_id: str, at: float) -> None:
        return None

    def hung(self, run_id: str, at: float) -> None:
        return None


@dataclass
class Billed:
    """One READY interval of one node: the billing truth of a simulation."""

    zone: str
    name: str
    run_id: str | None
    accelerator: str
    capacity: str
    created: float
    start: float
    end: float | None = None
    reason: str = ""

    @property
    def seconds(self) -> float:
        return 0.0 if self.end is None else self.end - self.start

    def billed_s(self, now: float) -> float:
        """Its billed seconds (``billing_rules``); an interval still open is billed up to ``now``."""
        return billed_seconds(self.capacity, self.created, self.start, now if self.end is None else self.end,
                              preempted=self.reason == "preempted")

    @property
    def free(self) -> bool:
        return self.reason == "preempted" and self.end is not None and preemption_is_free(
            self.capacity, self.created, self.end)


@dataclass
class _Op:
    zone: str
    node: str
    started: float
    done_at: float
    error: CapacityError | None = None
    verb: str = "create"


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class SimulatedCloud(CloudTpuRules, InProcessWorld):
    """Cloud TPU on a clock (``NodeProvider``): see the module docstring."""

    def __init__(self, project: str = "tpuops-local", model: CloudModel | None = None, *, clock: Clock = system_clock,
                 seed: int = 0, workload: Workload | None = None, poll_interval_s: float = 0.0) -> None:
        self.project = project
        self.model = model or CloudModel()
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.workload: Workload = workload or Idle()
        self.start = clock()
        self.calls: Counter[int] = Counter()
        """API calls per virtual minute since ``start``."""
        self.creates: Counter[int] = Counter()
        """CreateNode calls per virtual minute (Cloud TPU rates them apart from reads)."""
        self.billing: list[Billed] = []
        self._seed = seed
        self._rngs: dict[str, random.Random] = {}  # by uid: the node's own draws
        self._incarnations: Counter[tuple[str, str]] = Counter()  # creates per (zone, name)
        self._nodes: dict[tuple[str, str], NodeInfo] = {}
        self._open: dict[str, Billed] = {}  # by uid
        self._free_at: dict[tuple[str, str], float] = {}  # a deleted name is taken until its delete is over
        self._events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, uid)
        self._preempt_at: dict[str, float] = {}  # by uid: the drawn preemption a job's end came before
        self._notice_at: dict[str, float] = {}  # by uid: the notice of its drawn preemption
        self._ended: set[str] = set()  # uids whose job ended, READY until their self-delete
        self._by_uid: dict[str, tuple[str, str]] = {}
        self._ops: dict[str, _Op] = {}
        self._ops_of: dict[tuple[str, str], list[str]] = {}  # by (zone, node): its operations' names, in order
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self.api_answers_at: Callable[[float], float] = lambda at: at
        """When the API first answers a call made at ``at`` (a VM's own DELETE included): ``at`` unless a simulation
        says the API is down then (the fault swarm's outages), so that a node whose job ended stays READY, and
        billed, until its self-delete gets through or the controller's delete does."""
        self.never_boots: Callable[[str, str], bool] = lambda zone, name: False
        """Whether a create of ``name`` in ``zone`` now gets a worker that never boots (module docstring)."""
        self._absent: set[str] = set()  # uids of slices with a worker that never booted

    @classmethod
    def connect(cls, connection: Connection) -> SimulatedCloud:
        """The registry's door (``node_provider = "simulated"``): the emulator's pace on wall time, seed 0."""
        return cls(connection.project, EMULATOR_SPEED, poll_interval_s=connection.poll_interval_s)

    # -- time ----------------------------------------------------------------------------------

    def _schedule(self, at: float, kind: str, uid: str) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, uid))

    def next_event(self) -> float | None:
        """When the next thing happens on its own (READY, a notice's end, a job's end), or None."""
        with self._lock:
            return self._events[0][0] if self._events else None

    def ready_nodes(self) -> int:
        """How many nodes are READY now."""
        with self._lock:
            return sum(node.state is NodeState.READY for node in self._nodes.values())

    def notices_ahead(self) -> list[tuple[float, float]]:
        """(notice, end) of every preemption still to come."""
        with self._lock:
            ahead = []
            for at, _, kind, uid in self._events:
                key = self._by_uid.get(uid)
                node = self._nodes.get(key) if key else None
                if kind == "preempt" and node is not None and node.uid == uid and uid not in self._ended:
                    ahead.append((self._notice_at.get(uid, at), at))
            return ahead

    def catch_up(self) -> None:
        """Apply, in time order, everything due by the clock's now."""
        now = self.clock()
        with self._lock:
            while self._events and self._events[0][0] <= now:
                at, _, kind, uid = heapq.heappop(self._events)
                key = self._by_uid.get(uid)
                node = self._nodes.get(key) if key else None
                if node is None or node.uid != uid:
                    continue  # the node went (deleted) before its event
                {"ready": self._ready, "preempt": self._preempt, "finish": self._finish, "gone": self._gone}[kind](
                    node, at)

    def _ready(self, node: NodeInfo, at: float) -> None:
        key = (node.zone, node.name)
        self._nodes[key] = replace(node, state=NodeState.READY, health="")  # READY again after a maintenance too
        run_id = run_of(node.labels)  # a probe bills to the run it probes for, as the ledger counts it
        created = node.create_time.timestamp() if node.create_time else at
        self._open[node.uid] = Billed(node.zone, node.name, run_id, node.accelerator, node.capacity.value, created, at)
        hazard = self.model.hazard(node.zone, node.capacity.value)
        rng = self._rngs[node.uid]
        drawn = at + rng.expovariate(hazard / 3600.0) if hazard > 0 else None
        if self.model.lifetime is not None and node.capacity.value in PREEMPTIBLE_CAPACITIES:
            drawn = at + self.model.lifetime.draw(rng)
        absent = node.uid in self._absent
        if absent:  # the worker that never booted is listed unhealthy; the job waits on it for ever
            self._nodes[key] = replace(self._nodes[key], unhealthy_workers=(node.hosts - 1,))
        finish = self.workload.finish_time(run_id, at, node.accelerator) if run_id and not absent else None
        if run_id:
            self.workload.started(run_id, at, node.accelerator)
            if absent:
                self.workload.hung(run_id, at)
        final = self.workload.final_s(run_id) if run_id and finish is not None else 0.0
        if drawn is None:
            if finish is not None:
                self._schedule(finish, "finish", node.uid)
            return
        notice, preempt = self._preemption(run_id, at, drawn)
        self._notice_at[node.uid] = notice
        if finish is not None and (finish < preempt or notice >= finish - final):
            self._schedule(finish, "finish", node.uid)
            self._preempt_at[node.uid] = preempt
        else:
            self._schedule(preempt, "preempt", node.uid)

    def _preemption(self, run_id: str | None, ready: float, drawn: float) -> tuple[float, float]:
        """(notice, end) of a preemption drawn at ``drawn`` on a node READY at ``ready`` (see ``ends_with_agent``).
        The notice is when the job learns of it: with ``ends_with_agent``, when it acts on it (an agent busy
        importing TensorFlow looks later), which dates its save and its wake marker."""
        if not self.model.ends_with_agent:
            return max(ready, drawn - self.model.notice_s), drawn
        latest = drawn + self.model.notice_s
        stops = self.workload.stops_at(run_id, drawn) if run_id else None
        if stops is None:
            return drawn, latest
        end = min(latest, max(drawn, stops[1]))
        return min(max(drawn, stops[0]), end), end

    def _preempt(self, node: NodeInfo, at: float) -> None:
        notice = self._notice_at.pop(node.uid, at)
        self._close(node.uid, at, "preempted")
        self._nodes[(node.zone, node.name)] = replace(node, state=NodeState.PREEMPTED)
        run_id = node.labels.get(RUN_KEY)
        if run_id and node.uid not in self._ended:
            self.workload.interrupted(run_id, notice, at)

    def _finish(self, node: NodeInfo, at: float) -> None:
        """The job ended: the node deletes itself ``self_delete`` later (at once by default)."""
        run_id = node.labels.get(RUN_KEY)
        if run_id:
            self.workload.finished(run_id, at)
        preempt = self._preempt_at.pop(node.uid, None)
        noticed = preempt is not None and preempt <= at  # in its final save: the node goes with the job
        answers = self.api_answers_at(at)
        if self.model.self_delete.median_s <= 0 and not noticed and answers <= at:
            self._gone(node, at)
            return
        gone = max(answers, at + self.model.self_delete.draw(self._rngs[node.uid]))
        self._ended.add(node.uid)
        self._schedule(gone, "gone", node.uid)  # the self-delete, or the controller's delete of a PREEMPTED node
        if noticed:
            self._preempt(node, at)
        elif preempt is not None and preempt < gone:
            self._schedule(preempt, "preempt", node.uid)

    def _gone(self, node: NodeInfo, at: float) -> None:
        """The node's self-delete: billing stops, the name is free, and its delete operation dates it (as Cloud TPU's
        ListOperations shows the one the VM asked for: ``node_operations``)."""
        self._close(node.uid, at, "job-ended")
        self._record_op(node.zone, _Op(node.zone, node.name, at, at, verb="delete"))
        del self._nodes[(node.zone, node.name)]
        del self._rngs[node.uid]
        self._ended.discard(node.uid)
        self._notice_at.pop(node.uid, None)

    def _close(self, uid: str, at: float, reason: str) -> None:
        billed = self._open.pop(uid, None)
        if billed is not None:
            billed.end, billed.reason = at, reason
            self.billing.append(billed)

    def _call(self, create: bool = False) -> float:
        self.catch_up()
        now = self.clock()
        minute = int((now - self.start) // 60)
        with self._lock:
            self.calls[minute] += 1
            if create:
                self.creates[minute] += 1
        return now

    # -- NodeProvider ----------------------------------------------------------------------------

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        self._call()
        with self._lock:
            return [node for (where, _), node in self._nodes.items() if where == zone]

    def find_node(self, zone: str, name: str) -> NodeInfo | None:
        self._call()
        with self._lock:
            return self._nodes.get((zone, name))

    def create_node(self, zone: str, request: NodeRequest) -> Operation:
        acting.check("CreateNode")  # the client's own: its lease renewed as it goes out (tpuops.core.acting)
        now = self._call(create=True)
        with self._lock:
            key = (zone, request.name)
            if key in self._nodes:
                raise AlreadyExists(f"node {request.name!r} already exists in {zone}")
            if self.model.out_of_capacity(zone, now - self.start, request.accelerator, request.capacity.value):
                return self._snapshot(self._record_op(zone, _Op(zone, request.name, now, now, CapacityError(
                    f"There is no more capacity in the zone \"{zone}\"; you can try in another zone"))))
            begins = max(now, self._free_at.pop(key, now))  # the name is free once its delete is over
            uid = str(next(self._ids))
            self._incarnations[key] += 1
            rng = self._rngs[uid] = random.Random(f"{self._seed}/{zone}/{request.name}/{self._incarnations[key]}")
            ready_at = begins + self.model.ready_for(request.accelerator, self._incarnations[key] > 1).draw(rng)
            self._nodes[key] = NodeInfo(
                name=request.name, zone=zone, project=self.project, accelerator=request.accelerator,
                runtime=request.runtime, capacity=request.capacity, state=NodeState.CREATING, health="",
                labels=dict(request.labels), create_time=_at(begins), uid=uid,
                hosts=hosts_of(self.offers, request.accelerator))
            self._by_uid[uid] = key
            if self.never_boots(zone, request.name):
                if self._nodes[key].hosts == 1:  # the VM never comes up: CREATING, its create never ends
                    return self._snapshot(self._record_op(zone, _Op(zone, request.name, now, math.inf)))
                self._absent.add(uid)
            self._schedule(ready_at, "ready", uid)
            return self._snapshot(self._record_op(zone, _Op(zone, request.name, now, ready_at)))

    def delete_node(self, zone: str, name: str) -> Operation | None:
        acting.check("DeleteNode")
        now = self._call()
        with self._lock:
            node = self._nodes.pop((zone, name), None)
            if node is None:
                return None
            ended = node.uid in self._ended
            self._ended.discard(node.uid)
            self._preempt_at.pop(node.uid, None)
            self._notice_at.pop(node.uid, None)
            if node.state is NodeState.READY:
                self._close(node.uid, now, "deleted")
                if node.labels.get(RUN_KEY) and not ended:
                    self.workload.interrupted(node.labels[RUN_KEY], now, now + self.model.notice_s)
            self._free_at[(zone, name)] = now + self.model.delete_latency.draw(self._rngs.pop(node.uid))
            return self._snapshot(self._record_op(zone, _Op(zone, name, now, now, verb="delete")))

    # -- what a simulation does to a node (the fault swarm's) -----------------------------------------

    def _running(self, zone: str, name: str) -> NodeInfo | None:
        """The node if it is READY with its job still going (what a maintenance or a dying worker can strike)."""
        self.catch_up()
        node = self._nodes.get((zone, name))
        if node is None or node.state is not NodeState.READY or node.uid in self._ended:
            return None
        return node

    def _forget_events(self, uid: str) -> None:
        """Drop the node's scheduled READY, preemption and job end (its timeline is redrawn or over)."""
        self._events = [event for event in self._events if event[3] != uid]
        heapq.heapify(self._events)
        self._preempt_at.pop(uid, None)
        self._notice_at.pop(uid, None)

    def worker_dies(self, zone: str, name: str, worker: int) -> bool:
        """The TPU runtime of ``worker`` of a READY slice dies: the node stays READY (one state for the whole
        slice) with the worker listed unhealthy until it goes, and the job stops stepping (its mesh is broken).
        False: no slice of that name is READY with its job going."""
        with self._lock:
            node = self._running(zone, name)
            if node is None or node.hosts < 2:
                return False
            now = self.clock()
            self._nodes[(zone, name)] = replace(node, unhealthy_workers=(min(max(worker, 1), node.hosts - 1),))
            drawn = self._preempt_at.pop(node.uid, None)
            self._events = [event for event in self._events if not (event[3] == node.uid and event[2] == "finish")]
            heapq.heapify(self._events)
            if drawn is not None and drawn > now:  # the preemption its job's end came before still comes
                self._schedule(drawn, "preempt", node.uid)
            run_id = node.labels.get(RUN_KEY)
            if run_id:
                self.workload.hung(run_id, now)
            return True

    def maintenance(self, zone: str, name: str, down_s: float) -> bool:
        """A host maintenance event on a READY node now (module docstring): billing stops, its job is killed;
        on-demand, the node is REPAIRING for ``down_s`` and READY again (a new attempt starts); spot or
        preemptible, it is TERMINATED. False: no node of that name is READY with its job going."""
        with self._lock:
            node = self._running(zone, name)
            if node is None:
                return False
            now = self.clock()
            self._forget_events(node.uid)
            spot = node.capacity.value in PREEMPTIBLE_CAPACITIES
            self._close(node.uid, now, "terminated" if spot else "maintenance")
            state = NodeState.TERMINATED if spot else NodeState.REPAIRING
            self._nodes[(zone, name)] = replace(node, state=state, health="UNHEALTHY_MAINTENANCE")
            run_id = node.labels.get(RUN_KEY)
            if run_id:
                self.workload.interrupted(run_id, now, now)
            if not spot:
                self._schedule(now + down_s, "ready", node.uid)
            return True

    def _record_op(self, zone: str, op: _Op) -> str:
        operation = f"projects/{self.project}/locations/{zone}/operations/operation-{next(self._ids)}"
        self._ops[operation] = op
        self._ops_of.setdefault((zone, op.node), []).append(operation)
        return operation

    def node_operations(self, zone: str, name: str) -> list[Operation]:
        self._call()
        with self._lock:
            return [self._snapshot(op) for op in self._ops_of.get((zone, name), [])]

    def operation(self, zone: str, name: str) -> Operation:
        self._call()
        with self._lock:
            if name not in self._ops:
                raise NotFound(f"operation {name} not found")
            return self._snapshot(name)

    def _snapshot(self, name: str) -> Operation:
        op = self._ops[name]
        done = op.done_at <= self.clock()
        return Operation(name=name, zone=op.zone, done=done,
                         target=f"projects/{self.project}/locations/{op.zone}/nodes/{op.node}",
                         started=_at(op.started), ended=_at(op.done_at) if done else None,
                         error=op.error if done else None, verb=op.verb)

    # -- what a simulation reports -----------------------------------------------------------------

    def open_intervals(self) -> list[Billed]:
        """The READY intervals still open (their nodes READY now): billed up to the clock's now."""
        with self._lock:
            return list(self._open.values())

    def billed(self, price: Callable[[Billed], float]) -> dict[str | None, float]:
        """USD per run id of every READY interval up to the clock's now, closed or still open, by ``price``
        (USD per hour of the interval's node)."""
        self.catch_up()
        now = self.clock()
        totals: dict[str | None, float] = Counter()
        with self._lock:
            for interval in (*self.billing, *self._open.values()):
                totals[interval.run_id] += interval.billed_s(now) / 3600.0 * price(interval)
        return dict(totals)
