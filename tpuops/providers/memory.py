"""An in-memory node provider: a cloud of one process, for simulation and for tests without a server.

A real implementation of ``NodeProvider`` (held to the same contract suite as the Cloud TPU
adapter), not a mock: nodes live in a dict by (zone, name). A create is answered at once, its
operation done and the node CREATING until someone moves it (``set_state``: what a
simulation and the controller's tests do to play boot, preemption and loss); a delete removes the
node at once unless ``hold`` gated it, in which case the node is DELETING and its operation runs
until the gate opens (the next call of any kind then sees the node gone); ``hold_list`` holds a zone's
listings the same way (an API that keeps failing there). ``faults`` makes one
call on one node raise an error of the taxonomy. ``calls`` logs every call as (rpc, node, thread
name), so tests can say what a pass asked.

It lives in the package, not under tests/: it is registered (``node_provider = "memory"``), a
simulation of a plan can drive the controller through it, and it is the worked example of a provider
that is one module and one registration line.
Its rules and offers are Cloud TPU's, named explicitly (``cloud_tpu.offers.CloudTpuRules``): a cloud of one
process models Google's offers, so a v3-32 here has Cloud TPU's 4 hosts and prices.

Thread-safe: one lock around the nodes, the operations and the log.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from tpuops.core.clock import UTC
from tpuops.core.errors import AlreadyExists, NotFound, TpuopsError
from tpuops.providers.base import Connection, InProcessWorld
from tpuops.providers.cloud_tpu.offers import CloudTpuRules
from tpuops.providers.nodes import NodeInfo, NodeRequest, NodeState, Operation
from tpuops.providers.offers import hosts_of


@dataclass
class _Pending:
    """One operation: on which node, and the gate that ends it (None: done when made)."""

    node: tuple[str, str]
    started: datetime
    gate: threading.Event | None = None
    ended: datetime | None = None


class MemoryProvider(CloudTpuRules, InProcessWorld):
    """Nodes of one project, held in memory (``NodeProvider``)."""

    def __init__(self, project: str = "tpuops-local", *, poll_interval_s: float = 0.01) -> None:
        self.project = project
        self.poll_interval_s = poll_interval_s
        self.nodes: dict[tuple[str, str], NodeInfo] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.faults: dict[tuple[str, str], TpuopsError] = {}
        """(rpc, node name) -> the error that call raises, until removed."""
        self.on_create: Callable[[str], None] = lambda _name: None
        """Called with the node's name after each create (a test's hook into the moment)."""
        self._held: dict[tuple[str, str], threading.Event] = {}
        self._held_lists: dict[str, threading.Event] = {}
        self._operations: dict[str, _Pending] = {}
        self._gated: dict[str, _Pending] = {}  # held deletes not seen to end yet
        self._lock = threading.RLock()
        self._ids = itertools.count(1)

    @classmethod
    def connect(cls, connection: Connection) -> MemoryProvider:
        return cls(connection.project, poll_interval_s=connection.poll_interval_s)

    def _call(self, rpc: str, name: str) -> None:
        """Log the call, end the held deletes whose gate opened, and raise the call's fault if any."""
        with self._lock:
            self.calls.append((rpc, name, threading.current_thread().name))
            for operation, pending in list(self._gated.items()):
                if pending.gate is not None and pending.gate.is_set():
                    self.nodes.pop(pending.node, None)
                    pending.ended = datetime.now(UTC)
                    del self._gated[operation]
            fault = self.faults.get((rpc, name))
        if fault is not None:
            raise fault

    def hold(self, zone: str, name: str) -> threading.Event:
        """Hold the next delete of the node (DELETING) until the event returned is set."""
        with self._lock:
            self._held[(zone, name)] = threading.Event()
            return self._held[(zone, name)]

    def hold_list(self, zone: str) -> threading.Event:
        """Hold every listing of ``zone`` until the event returned is set."""
        with self._lock:
            return self._held_lists.setdefault(zone, threading.Event())

    def set_state(self, zone: str, name: str, state: NodeState) -> None:
        """Move a node to ``state`` (a boot, a preemption, a repair): what the cloud does on its own."""
        with self._lock:
            self.nodes[(zone, name)] = replace(self.nodes[(zone, name)], state=state)

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        self._call("ListNodes", "")
        with self._lock:
            gate = self._held_lists.get(zone)
        if gate is not None:
            gate.wait()
        with self._lock:
            return [node for (where, _), node in self.nodes.items() if where == zone]

    def find_node(self, zone: str, name: str) -> NodeInfo | None:
        self._call("GetNode", name)
        with self._lock:
            return self.nodes.get((zone, name))

    def create_node(self, zone: str, request: NodeRequest) -> Operation:
        self._call("CreateNode", request.name)
        now = datetime.now(UTC)
        with self._lock:
            if (zone, request.name) in self.nodes:
                raise AlreadyExists(f"node {request.name!r} already exists in {zone}")
            self.nodes[(zone, request.name)] = NodeInfo(
                name=request.name, zone=zone, project=self.project, accelerator=request.accelerator,
                runtime=request.runtime, capacity=request.capacity, state=NodeState.CREATING, health="",
                labels=dict(request.labels), create_time=now, uid=str(next(self._ids)),
                hosts=hosts_of(self.offers, request.accelerator))
            operation = self._start((zone, request.name), now, None)
        self.on_create(request.name)
        return operation

    def delete_node(self, zone: str, name: str) -> Operation | None:
        self._call("DeleteNode", name)
        now = datetime.now(UTC)
        with self._lock:
            if (zone, name) not in self.nodes:
                return None
            gate = self._held.pop((zone, name), None)
            if gate is None:
                del self.nodes[(zone, name)]
            else:
                self.set_state(zone, name, NodeState.DELETING)
            return self._start((zone, name), now, gate)

    def operation(self, zone: str, name: str) -> Operation:
        with self._lock:
            pending = self._operations.get(name)
        self._call("GetOperation", pending.node[1] if pending else name)
        if pending is None:
            raise NotFound(f"operation {name} not found")
        with self._lock:
            return self._snapshot(name, pending)

    def _start(self, node: tuple[str, str], now: datetime, gate: threading.Event | None) -> Operation:
        name = f"projects/{self.project}/locations/{node[0]}/operations/operation-{next(self._ids)}"
        pending = _Pending(node, now, gate, None if gate is not None else now)
        self._operations[name] = pending
        if gate is not None:
            self._gated[name] = pending
        return self._snapshot(name, pending)

    def _snapshot(self, name: str, pending: _Pending) -> Operation:
        project = self.project
        return Operation(name=name, zone=pending.node[0], done=pending.ended is not None,
                         target=f"projects/{project}/locations/{pending.node[0]}/nodes/{pending.node[1]}",
                         started=pending.started, ended=pending.ended)
