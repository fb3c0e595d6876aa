"""Nodes, operations and their lifecycle: the heart of the emulator.

Transitions (as on Cloud TPU, at emulator speed)::

    create:  CREATING --boot delay--> READY          (op done with the Node)
             CREATING --boot delay--> (removed)      (stockout: op fails RESOURCE_EXHAUSTED)
    stop:    READY -> STOPPING --group ended--> STOPPED      (single-host nodes only)
    start:   STOPPED -> STARTING --boot delay--> READY
    delete:  any -> DELETING --group ended--> (removed)  (op done with Empty)
             (a node the ``hold_deletes`` fault names stays DELETING until it is released)
    preempt: READY (preempted=TRUE, SIGTERM) --grace or group empty, SIGKILL--> PREEMPTED

``EmulatorState`` decides these moves and keeps the node's state, operations and billing interval
(opened on entering READY, closed on leaving it). What a move means for the node's workers (one per
host) is the slice lifecycle's (``slices.SliceLifecycle``): entering READY boots every worker, leaving
it ends every worker's process groups; a slice is preempted, stopped and deleted whole, and its health
follows its workers' runtimes (``nodes.Node.health``).

One re-entrant lock guards all state. Requests take it briefly and never sleep; delays are
callbacks on the scheduler thread, and the end of a process group is reported by the
sandbox reaper thread. Both check the node's generation before acting.
"""

from __future__ import annotations

import hmac
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuops.emulator.apierror import ApiError, invalid, not_found, precondition
from tpuops.emulator.cloud.billing import BillingLedger
from tpuops.emulator.cloud.catalog import check_zone, stockout_error
from tpuops.emulator.cloud.nodes import Node, check_update_mask
from tpuops.emulator.cloud.operations import EMPTY_TYPE, NODE_TYPE, LongRunningOperation, OperationStore
from tpuops.emulator.cloud.scheduler import Scheduler
from tpuops.emulator.cloud.slices import SliceLifecycle
from tpuops.emulator.cloud.wire import NodeFields, check_resource_id
from tpuops.emulator.faults import Faults

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmulatorConfig:
    """How one emulator behaves; the defaults suit interactive use, tests shorten the delays."""

    state_dir: Path
    boot_delay_s: float = 1.0
    grace_s: float = 30.0
    image_python: str | None = None
    # SIGTERM-to-SIGKILL wait when a node is stopped or deleted (an OS shutdown, not a preemption).
    shutdown_wait_s: float = 1.0
    tick_s: float = 0.1


class EmulatorState:
    """All nodes and operations of one emulator, with their lifecycle."""

    def __init__(self, config: EmulatorConfig, faults: Faults) -> None:
        self.config = config
        self.faults = faults
        self.lock = threading.RLock()
        self.ops = OperationStore()
        self.nodes: dict[tuple[str, str, str], Node] = {}
        self.billing = BillingLedger(config.state_dir)
        self.slices = SliceLifecycle(config.state_dir, config.image_python, faults, self.lock, self.nodes)
        self.scheduler = Scheduler()
        self._tick_hooks: list[Callable[[], None]] = [self._random_preemptions, self.slices.kill_runtimes,
                                                      self.slices.probe_runtimes]
        self._node_listeners: list[Callable[[tuple[str, str, str]], None]] = []
        self._last_heartbeat = 0.0
        self._last_draw = time.monotonic()
        self.scheduler.call_later(config.tick_s, self._tick)

    # ----- reading

    def node(self, project: str, zone: str, node_id: str) -> Node:
        """The node (caller holds the lock). Raises NOT_FOUND."""
        node = self.nodes.get((project, zone, node_id))
        if node is None:
            raise not_found(f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}'")
        return node

    def get_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        check_zone(zone)
        with self.lock:
            return self.node(project, zone, node_id).to_json()

    def list_nodes(self, project: str, zone: str) -> list[dict[str, Any]]:
        """Nodes of ``zone`` (``-``: every zone), sorted by name."""
        check_zone(zone, allow_all=True)
        with self.lock:
            chosen = [n for n in self.nodes.values() if n.project == project and zone in ("-", n.zone)]
            return [n.to_json() for n in sorted(chosen, key=lambda n: n.name)]

    # ----- mutations (each returns the operation as JSON)

    def create_node(self, project: str, zone: str, node_id: str, spec: NodeFields) -> dict[str, Any]:
        """Start creating a node; the operation finishes when it is READY or out of stock.

        Raises:
            ApiError: INVALID_ARGUMENT (zone, id), ALREADY_EXISTS.
        """
        check_zone(zone)
        check_resource_id("node", node_id)
        with self.lock:
            node = self.add_node(project, zone, node_id, spec)
            # The boot callback needs this lock, so the operation is attached before it can finish.
            node.pending_op = self.ops.start(project, zone, node.name, "create")
            return node.pending_op.to_json()

    def add_node(self, project: str, zone: str, node_id: str, spec: NodeFields, *, queued_resource: str = "",
                 check_capacity: bool = True) -> Node:
        """Insert a CREATING node and schedule its boot (caller holds the lock)."""
        key = (project, zone, node_id)
        if key in self.nodes:
            raise ApiError("ALREADY_EXISTS",
                           f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' already exists")
        node = Node(project=project, zone=zone, node_id=node_id, spec=spec, uid=str(random.randrange(10**18, 2**63)),
                    create_time=time.time(), queued_resource=queued_resource)
        self.slices.place(node)
        self.nodes[key] = node
        generation = node.generation
        if check_capacity and self.faults.stockout(zone):
            self.scheduler.call_later(self.config.boot_delay_s, lambda: self._fail_stockout(key, generation))
        else:
            self.scheduler.call_later(self.config.boot_delay_s, lambda: self._boot(key, generation))
        return node

    def delete_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        """Start deleting a node in any state; the operation finishes when it is gone."""
        check_zone(zone)
        with self.lock:
            node = self.node(project, zone, node_id)
            op = self.ops.start(project, zone, node.name, "delete")
            self.remove_node(node, op)
            return op.to_json()

    def remove_node(self, node: Node, op: LongRunningOperation | None = None) -> None:
        """Move ``node`` to DELETING and end its processes (caller holds the lock)."""
        if op is not None:
            node.delete_ops.append(op)
        if node.state == "DELETING":
            return
        self._leave_ready(node, "deleted")
        if node.pending_op is not None:
            self.ops.fail(node.pending_op, ApiError("ABORTED", f"Node {node.name} was deleted."))
            node.pending_op = None
        generation = node.advance("DELETING")
        self._changed(node.key)
        self.slices.end(node, self.config.shutdown_wait_s, lambda: self._deleted(node.key, generation))

    def stop_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        check_zone(zone)
        with self.lock:
            node = self.node(project, zone, node_id)
            if not node.spec.accelerator.single_host:
                raise precondition(f"Node {node.name} spans several hosts ({node.spec.accelerator.name}); "
                                   "only single-host nodes can be stopped.")
            if node.state != "READY" or node.preempting:
                raise precondition(f"Node {node.name} cannot be stopped in state {node.state}.")
            op = self.ops.start(project, zone, node.name, "stop")
            node.pending_op = op
            self._leave_ready(node, "stopped")
            generation = node.advance("STOPPING")
            self.slices.end(node, self.config.shutdown_wait_s, lambda: self._stopped(node.key, generation))
            return op.to_json()

    def start_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        check_zone(zone)
        with self.lock:
            node = self.node(project, zone, node_id)
            if node.state != "STOPPED":
                raise precondition(f"Node {node.name} cannot be started in state {node.state}.")
            op = self.ops.start(project, zone, node.name, "start")
            node.pending_op = op
            generation = node.advance("STARTING")
            self.scheduler.call_later(self.config.boot_delay_s, lambda: self._boot(node.key, generation))
            return op.to_json()

    def update_node(self, project: str, zone: str, node_id: str, paths: list[str],
                    body: dict[str, Any]) -> dict[str, Any]:
        """Apply the fields of ``body`` named by the update mask ``paths`` (snake_case; ``Node.apply_update``)."""
        check_zone(zone)
        check_update_mask(paths)
        with self.lock:
            node = self.node(project, zone, node_id)
            if node.state == "DELETING":
                raise precondition(f"Node {node.name} is being deleted.")
            node.apply_update(paths, body)
            if "metadata" in paths:
                self.slices.refresh_attributes(node)
            op = self.ops.start(project, zone, node.name, "update")
            self.ops.succeed(op, NODE_TYPE, node.to_json())
            return op.to_json()

    def preempt(self, project: str, zone: str, node_id: str, grace_s: float | None = None) -> dict[str, Any]:
        """Preempt a READY spot/preemptible node now (the admin API's fault)."""
        check_zone(zone)
        with self.lock:
            node = self.node(project, zone, node_id)
            if not node.preemptible:
                raise invalid(f"Node {node.name} is neither spot nor preemptible; only those can be preempted.")
            if node.state != "READY" or node.preempting:
                raise precondition(f"Node {node.name} cannot be preempted in state {node.state}.")
            self._preempt(node, self.config.grace_s if grace_s is None else grace_s)
            return node.to_json()

    # ----- operations

    def get_operation(self, name: str) -> dict[str, Any]:
        with self.lock:
            return self.ops.get(name).to_json()

    def list_operations(self, project: str, zone: str) -> list[dict[str, Any]]:
        check_zone(zone, allow_all=True)
        with self.lock:
            return [op.to_json() for op in self.ops.list(project, zone)]

    def delete_operation(self, name: str) -> None:
        with self.lock:
            self.ops.delete(name)

    def cancel_operation(self, name: str) -> None:
        with self.lock:
            self.ops.cancel(name)

    # ----- admin views

    def describe_nodes(self) -> list[dict[str, Any]]:
        """What the admin API shows about each node's emulation (sandbox, processes, scripts)."""
        with self.lock:
            return [self.slices.describe(node) for node in sorted(self.nodes.values(), key=lambda n: n.name)]

    def guest_attributes(self, project: str, zone: str, node_id: str) -> list[dict[str, str]]:
        """Per worker, its guest attributes by ``namespace/key``: the SSH host keys every TPU VM
        publishes, and what that worker's processes wrote to its metadata server."""
        check_zone(zone)
        with self.lock:
            return self.slices.guest_attributes(self.node(project, zone, node_id))

    def maintenance(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        """Simulate or perform a maintenance event: a READY node stays READY; the op returns it."""
        check_zone(zone)
        with self.lock:
            node = self.node(project, zone, node_id)
            if node.state != "READY":
                raise precondition(f"Node {node.name} cannot undergo maintenance in state {node.state}.")
            op = self.ops.start(project, zone, node.name, "maintenance")
            self.ops.succeed(op, NODE_TYPE, node.to_json())
            return op.to_json()

    def add_node_listener(self, listener: Callable[[tuple[str, str, str]], None]) -> None:
        """Call ``listener(key)`` under the lock whenever a node changes state, appears or goes away.

        Whoever owns the node (a queued resource) moves in the same step as the node, never a
        tick later.
        """
        self._node_listeners.append(listener)

    def _changed(self, key: tuple[str, str, str]) -> None:
        for listener in self._node_listeners:
            listener(key)

    def node_for_token(self, token: str) -> Node | None:
        """The node whose service-account token ``token`` is (what a VM's own process presents).

        Compared in constant time: the token is a credential, and a caller may present guesses.
        """
        presented = token.encode()
        with self.lock:
            return next((node for node in self.nodes.values()
                         if node.sa_token and hmac.compare_digest(node.sa_token.encode(), presented)), None)

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` every tick (under no lock; it takes the lock itself)."""
        self._tick_hooks.append(hook)

    def close(self) -> None:
        """End every process group, close every interval and server. The emulator is stopping."""
        self.scheduler.close()
        with self.lock:
            self.billing.close_all("emulator-shutdown")
        self.slices.close(self.config.shutdown_wait_s)

    # ----- transitions (scheduler and reaper threads)

    def _current(self, key: tuple[str, str, str], generation: int) -> Node | None:
        node = self.nodes.get(key)
        return node if node is not None and node.generation == generation else None

    def _boot(self, key: tuple[str, str, str], generation: int) -> None:
        with self.lock:
            node = self._current(key, generation)
            if node is None:
                return
            node.advance("READY")
            node.preempting = False
            self._changed(key)
            self.billing.open(uid=node.uid, name=node.name, zone=node.zone, accelerator_type=node.spec.accelerator.name,
                              capacity=node.spec.capacity, created_epoch=node.create_time)
            if node.pending_op is not None:  # done when READY (its endTime is billing's start), before the guest boots
                self.ops.succeed(node.pending_op, NODE_TYPE, node.to_json())
                node.pending_op = None
            self.slices.boot(node)

    def _fail_stockout(self, key: tuple[str, str, str], generation: int) -> None:
        with self.lock:
            node = self._current(key, generation)
            if node is None:
                return
            del self.nodes[key]
            self.slices.forget(node)
            if node.pending_op is not None:
                self.ops.fail(node.pending_op, stockout_error(node.zone))
            self._changed(key)

    def _stopped(self, key: tuple[str, str, str], generation: int) -> None:
        with self.lock:
            node = self._current(key, generation)
            if node is None:
                return
            node.advance("STOPPED")
            self._changed(key)
            if node.pending_op is not None:
                self.ops.succeed(node.pending_op, NODE_TYPE, node.to_json())
                node.pending_op = None

    def _deleted(self, key: tuple[str, str, str], generation: int) -> None:
        with self.lock:
            node = self._current(key, generation)
            if node is None:
                return
            if self.faults.holds_delete(node.node_id):  # looked at again every tick until released
                self.scheduler.call_later(self.config.tick_s, lambda: self._deleted(key, generation))
                return
            del self.nodes[key]
            for op in node.delete_ops:
                self.ops.succeed(op, EMPTY_TYPE)
            self._changed(key)
            servers = self.slices.forget(node)
        for server in servers:
            server.close()

    def _preempt(self, node: Node, grace_s: float) -> None:
        """The whole slice: every worker is told and every worker's processes end; then PREEMPTED."""
        node.preempting = True
        generation = node.generation
        self.slices.preempt(node, grace_s, lambda: self._preempted(node.key, generation))

    def _preempted(self, key: tuple[str, str, str], generation: int) -> None:
        with self.lock:
            node = self._current(key, generation)
            if node is None:
                return
            self._leave_ready(node, "preempted")
            node.advance("PREEMPTED")
            node.preempting = False
            self._changed(key)

    def _leave_ready(self, node: Node, reason: str) -> None:
        if node.state == "READY":
            self.billing.close(node.uid, reason)
        self.slices.leave_ready(node)

    def _random_preemptions(self) -> None:
        """Draw random preemptions for the time since the last draw, as it passed: a tick comes every
        ``tick_s`` or later (a loaded machine runs the scheduler late), and drawing for ``tick_s`` then
        gave fewer preemptions than ``preempt_rate_per_s`` says (half of them at a load of 25)."""
        now = time.monotonic()
        elapsed, self._last_draw = now - self._last_draw, now
        with self.lock:
            candidates = [node for node in self.nodes.values()
                          if node.state == "READY" and node.preemptible and not node.preempting]
            draws = self.faults.preemption_draws(len(candidates), elapsed)
            for node, hit in zip(candidates, draws, strict=True):
                if hit:
                    log.info("random preemption of %s", node.name)
                    self._preempt(node, self.config.grace_s)

    def _tick(self) -> None:
        for hook in self._tick_hooks:
            try:
                hook()
            except Exception:
                log.exception("tick hook failed")
        now = time.monotonic()
        if now - self._last_heartbeat >= 1.0:
            self.billing.heartbeat()
            self._last_heartbeat = now
        self.scheduler.call_later(self.config.tick_s, self._tick)
