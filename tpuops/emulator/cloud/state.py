"""Nodes, operations and their lifecycle: the heart of the emulator.

Transitions (as on Cloud TPU, at emulator speed)::

    create:  CREATING --boot delay--> READY          (op done with the Node)
             CREATING --boot delay--> (removed)      (stockout: op fails RESOURCE_EXHAUSTED)
    stop:    READY -> STOPPING --group ended--> STOPPED      (single-host nodes only)
    start:   STOPPED -> STARTING --boot delay--> READY
    delete:  any -> DELETING --group ended--> (removed)  (op done with Empty)
             (a node the ``hold_deletes`` fault names stays DELETING until it is released)
    preempt: READY (preempted=TRUE, SIGTERM) --grace or group empty, SIGKILL--> PREEMPTED

Entering READY boots every worker of the node (one per host): its metadata server (once), on a
``-pod`` runtime its TPU runtime, and its ``startup-script``; leaving READY ends every worker's
process groups and closes the node's billing interval. A slice is preempted, stopped and deleted
whole; its health follows its workers' runtimes (``nodes.Node.health``), probed every
``RUNTIME_PROBE_S`` outside the lock.

One re-entrant lock guards all state. Requests take it briefly and never sleep; delays are
callbacks on the scheduler thread, and the end of a process group is reported by the
sandbox reaper thread. Both check the node's generation before acting.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuops.emulator.apierror import ApiError, invalid, not_found, precondition
from tpuops.emulator.cloud import catalog
from tpuops.emulator.cloud.billing import BillingLedger
from tpuops.emulator.cloud.catalog import check_zone
from tpuops.emulator.cloud.nodes import Node
from tpuops.emulator.cloud.operations import EMPTY_TYPE, NODE_TYPE, LongRunningOperation, OperationStore
from tpuops.emulator.cloud.scheduler import Scheduler
from tpuops.emulator.cloud.wire import NodeFields, check_resource_id, rfc3339, string_list, string_map
from tpuops.emulator.faults import Faults
from tpuops.emulator.vm.metadata import MetadataServer, MetadataView
from tpuops.emulator.vm.sandbox import Sandboxes, ScriptRun, signal_group
from tpuops.emulator.vm.workers import SINGLE_HOST_ADDRESS, AddressPool, RuntimeImage, Worker, runtime_answers

log = logging.getLogger(__name__)


def host_keys(uid: str, worker: int) -> dict[str, str]:
    """The SSH host keys a TPU VM worker publishes as guest attributes (stable per node and worker)."""
    keys = {}
    for algorithm in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
        digest = hashlib.sha512(f"{uid}/{worker}/{algorithm}".encode()).digest()
        blob = len(algorithm).to_bytes(4, "big") + algorithm.encode() + (32).to_bytes(4, "big") + digest[:32]
        keys[f"hostkeys/{algorithm}"] = f"{algorithm} {base64.b64encode(blob).decode()}"
    return keys

RUNTIME_PROBE_S = 0.5

UPDATABLE_PATHS = frozenset({"description", "tags", "labels", "metadata", "network_config.enable_external_ips"})


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


def stockout_error(zone: str) -> ApiError:
    """The error a create operation ends with when the zone has no capacity, worded as on GCP."""
    return ApiError(
        "RESOURCE_EXHAUSTED",
        f'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU '
        f"Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x{random.getrandbits(64):016x}]",
    )


class EmulatorState:
    """All nodes and operations of one emulator, with their lifecycle."""

    def __init__(self, config: EmulatorConfig, faults: Faults) -> None:
        self.config = config
        self.faults = faults
        self.lock = threading.RLock()
        self.ops = OperationStore()
        self.nodes: dict[tuple[str, str, str], Node] = {}
        self.billing = BillingLedger(config.state_dir)
        self.sandboxes = Sandboxes(config.state_dir, config.image_python)
        self.addresses = AddressPool()
        self.runtime_image = RuntimeImage(config.state_dir, config.image_python)
        self.scheduler = Scheduler()
        self._tick_hooks: list[Callable[[], None]] = [self._random_preemptions, self._kill_runtimes,
                                                      self._probe_runtimes]
        self._last_probe = 0.0
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

    def add_node(
        self,
        project: str,
        zone: str,
        node_id: str,
        spec: NodeFields,
        *,
        queued_resource: str = "",
        check_capacity: bool = True,
    ) -> Node:
        """Insert a CREATING node and schedule its boot (caller holds the lock)."""
        key = (project, zone, node_id)
        if key in self.nodes:
            raise ApiError(
                "ALREADY_EXISTS", f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' already exists"
            )
        node = Node(
            project=project,
            zone=zone,
            node_id=node_id,
            spec=spec,
            uid=str(random.randrange(10**18, 2**63)),
            create_time=time.time(),
            queued_resource=queued_resource,
        )
        hosts = spec.accelerator.hosts
        addresses = [SINGLE_HOST_ADDRESS] if hosts == 1 else self.addresses.allocate(hosts)
        node.workers = [
            Worker(number, address, f"{node_id}-w-{number}") for number, address in enumerate(addresses)
        ]
        node.serves_runtime = hosts > 1 and "-pod" in spec.runtime_version and self.runtime_image.usable()
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
        self.sandboxes.terminate(
            node.live_pgids, self.config.shutdown_wait_s, lambda: self._deleted(node.key, generation)
        )

    def stop_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        check_zone(zone)
        with self.lock:
            node = self.node(project, zone, node_id)
            if not node.spec.accelerator.single_host:
                raise precondition(
                    f"Node {node.name} spans several hosts ({node.spec.accelerator.name}); "
                    "only single-host nodes can be stopped."
                )
            if node.state != "READY" or node.preempting:
                raise precondition(f"Node {node.name} cannot be stopped in state {node.state}.")
            op = self.ops.start(project, zone, node.name, "stop")
            node.pending_op = op
            self._leave_ready(node, "stopped")
            generation = node.advance("STOPPING")
            self.sandboxes.terminate(
                node.live_pgids, self.config.shutdown_wait_s, lambda: self._stopped(node.key, generation)
            )
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

    def update_node(
        self, project: str, zone: str, node_id: str, paths: list[str], body: dict[str, Any]
    ) -> dict[str, Any]:
        """Apply the fields of ``body`` named by the update mask ``paths`` (snake_case)."""
        check_zone(zone)
        if not paths:
            raise invalid("Field update_mask is required.")
        unsupported = sorted(set(paths) - UPDATABLE_PATHS)
        if unsupported:
            raise invalid(
                f"Invalid update_mask path {unsupported[0]!r}; updatable: {', '.join(sorted(UPDATABLE_PATHS))}."
            )
        with self.lock:
            node = self.node(project, zone, node_id)
            if node.state == "DELETING":
                raise precondition(f"Node {node.name} is being deleted.")
            self._apply_update(node, paths, body)
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
            return [
                {
                    "name": node.name,
                    "state": node.state,
                    "uid": node.uid,
                    **self._describe_worker(node, node.workers[0]),
                    "preempting": node.preempting,
                    "workers": [self._describe_worker(node, worker) for worker in node.workers],
                }
                for node in sorted(self.nodes.values(), key=lambda n: n.name)
            ]

    def _describe_worker(self, node: Node, worker: Worker) -> dict[str, Any]:
        return {
            "worker": worker.number,
            "address": worker.address,
            "sandbox": str(self.worker_directory(node, worker)),
            "metadata_host": worker.metadata_server.host if worker.metadata_server else None,
            "pgid": worker.runs[-1].live_pgid if worker.runs else None,
            "script_runs": [{"pgid": run.pgid, "exit_code": run.exit_code} for run in worker.runs],
            "runtime_pgid": worker.runtime.live_pgid if worker.runtime else None,
            "runtime_up": worker.runtime_up,
            "never_boots": worker.never_boots,
        }

    def worker_directory(self, node: Node, worker: Worker) -> Path:
        """Worker ``worker``'s directory (its HOME, logs, TMPDIR): worker 0's is the node's, as on one host."""
        directory = self.sandboxes.directory(node.project, node.zone, node.node_id)
        return directory if worker.number == 0 else directory.with_name(f"{directory.name}.w{worker.number}")

    def guest_attributes(self, project: str, zone: str, node_id: str) -> list[dict[str, str]]:
        """Per worker, its guest attributes by ``namespace/key``: the SSH host keys every TPU VM
        publishes, and what that worker's processes wrote to its metadata server."""
        check_zone(zone)
        with self.lock:
            node = self.node(project, zone, node_id)
            views = [(worker.number, worker.metadata_server) for worker in node.workers]
            uid = node.uid
        return [{**host_keys(uid, number), **(server.view.guest_attributes() if server else {})}
                for number, server in views]

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

    def metadata_hosts_by_group(self) -> dict[int, str]:
        """Each live process group of a node's worker -> that worker's metadata host (``metadoor``)."""
        with self.lock:
            return {
                pgid: worker.metadata_server.host
                for node in self.nodes.values()
                for worker in node.workers
                if worker.metadata_server is not None
                for pgid in worker.live_pgids
            }

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` every tick (under no lock; it takes the lock itself)."""
        self._tick_hooks.append(hook)

    def close(self) -> None:
        """End every process group, close every interval and server. The emulator is stopping."""
        self.scheduler.close()
        with self.lock:
            servers = [w.metadata_server for node in self.nodes.values() for w in node.workers if w.metadata_server]
            self.billing.close_all("emulator-shutdown")
        self.sandboxes.close(grace_s=min(self.config.shutdown_wait_s, 2.0))
        for server in servers:
            server.close()

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
            self.billing.open(
                uid=node.uid,
                name=node.name,
                zone=node.zone,
                accelerator_type=node.spec.accelerator.name,
                capacity=node.spec.capacity,
                created_epoch=node.create_time,
            )
            if node.pending_op is not None:  # done when READY (its endTime is billing's start), before the guest boots
                self.ops.succeed(node.pending_op, NODE_TYPE, node.to_json())
                node.pending_op = None
            self._start_guest(node)

    def _start_guest(self, node: Node) -> None:
        """Boot the 'VMs', one per worker: metadata server (kept across restarts), TPU runtime, startup script.

        A worker the ``never_boot_workers`` fault names for this boot runs nothing (and that entry is used up).
        """
        node.symptoms.clear()
        script = node.spec.metadata.get("startup-script")
        endpoints = [worker.endpoint() for worker in node.workers]
        for worker in node.workers:
            server = worker.metadata_server or self._metadata_server(node, worker)
            worker.metadata_server = server
            server.view.set_preempted(False)
            worker.runtime_up = worker.runtime_seen = False
            worker.never_boots = self.faults.take_worker_fault("never_boot_workers", node.node_id, worker.number)
            if worker.never_boots:
                continue
            directory = self.worker_directory(node, worker)
            runtime = self.runtime_image.script(endpoints, worker) if node.serves_runtime else None
            if runtime is not None:
                worker.runtime = self.sandboxes.run_script(
                    directory, runtime, server.host, lambda run: self._script_exited(node, run), name="tpu-runtime")
            if script:
                run = self.sandboxes.run_script(
                    directory, script, server.host, lambda run: self._script_exited(node, run))
                worker.runs.append(run)

    def _metadata_server(self, node: Node, worker: Worker) -> MetadataServer:
        number = catalog.project_number(node.project)
        email = f"tpuops-vm@{node.project}.iam.gserviceaccount.com"
        account = {
            "email": email,
            "aliases": "default\n",
            "scopes": "https://www.googleapis.com/auth/cloud-platform\n",
            "token": json.dumps({"access_token": node.sa_token, "expires_in": 3599, "token_type": "Bearer"}),
        }
        view = MetadataView(
            instance={
                "name": node.node_id if worker.number == 0 else f"{node.node_id}-w-{worker.number}",
                "hostname": f"{worker.hostname}.{node.zone}.c.{node.project}.internal",
                "id": node.uid,
                "zone": f"projects/{number}/zones/{node.zone}",
                "maintenance-event": "NONE",
                "network-interfaces/0/ip": worker.address,
                # The VM's service account, under "default" and its email as on GCE (oauth2client asks by
                # email): its token lets the node's own processes get and delete this node (and read
                # operations), nothing else, as the custom role does.
                **{f"service-accounts/{alias}/{key}": value for alias in ("default", email)
                   for key, value in account.items()},
            },
            project={"project-id": node.project, "numeric-project-id": number},
            attributes=node.system_attributes(worker),
        )
        return MetadataServer(view)

    @staticmethod
    def _script_exited(node: Node, run: ScriptRun) -> None:
        log.info("startup script of %s (pgid %s) exited with %s", node.name, run.pgid, run.exit_code)

    def _fail_stockout(self, key: tuple[str, str, str], generation: int) -> None:
        with self.lock:
            node = self._current(key, generation)
            if node is None:
                return
            del self.nodes[key]
            self._release_addresses(node)
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
            servers = [worker.metadata_server for worker in node.workers if worker.metadata_server]
            self._release_addresses(node)
        for server in servers:
            server.close()

    def _release_addresses(self, node: Node) -> None:
        """Give a removed slice's worker addresses back (a single host's 127.0.0.1 was never taken)."""
        if len(node.workers) > 1:
            self.addresses.release([worker.address for worker in node.workers])

    def _preempt(self, node: Node, grace_s: float) -> None:
        """The whole slice: every worker is told (``instance/preempted``) and every worker's processes end."""
        node.preempting = True
        for worker in node.workers:
            if worker.metadata_server is not None:
                worker.metadata_server.view.set_preempted(True)
        generation = node.generation
        self.sandboxes.terminate(node.live_pgids, grace_s, lambda: self._preempted(node.key, generation))

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
        for worker in node.workers:
            worker.runtime_up = False

    def _apply_update(self, node: Node, paths: list[str], body: dict[str, Any]) -> None:
        """Validate every masked field first, then apply them all: an invalid update changes nothing."""
        spec = node.spec
        description = str(body.get("description") or "")
        tags = string_list(body.get("tags"), "tags")
        labels = string_map(body.get("labels"), "labels")
        metadata = string_map(body.get("metadata"), "metadata")
        if "description" in paths:
            spec.description = description
        if "tags" in paths:
            spec.tags = tags
        if "labels" in paths:
            spec.labels = labels
        if "metadata" in paths:
            spec.metadata = metadata
            for worker in node.workers:
                if worker.metadata_server is not None:
                    worker.metadata_server.view.set_attributes(node.system_attributes(worker))
        if "network_config.enable_external_ips" in paths:
            enabled = bool((body.get("networkConfig") or {}).get("enableExternalIps"))
            current = spec.network_config or node.to_json()["networkConfig"]
            spec.network_config = {**current, "enableExternalIps": enabled}

    def _random_preemptions(self) -> None:
        """Draw random preemptions for the time since the last draw, as it passed: a tick comes every
        ``tick_s`` or later (a loaded machine runs the scheduler late), and drawing for ``tick_s`` then
        gave fewer preemptions than ``preempt_rate_per_s`` says (half of them at a load of 25)."""
        now = time.monotonic()
        elapsed, self._last_draw = now - self._last_draw, now
        with self.lock:
            candidates = [
                node
                for node in self.nodes.values()
                if node.state == "READY" and node.preemptible and not node.preempting
            ]
            draws = self.faults.preemption_draws(len(candidates), elapsed)
            for node, hit in zip(candidates, draws, strict=True):
                if hit:
                    log.info("random preemption of %s", node.name)
                    self._preempt(node, self.config.grace_s)

    def _kill_runtimes(self) -> None:
        """The ``kill_runtimes`` fault: SIGKILL the runtime of each named worker of a READY node (entry used up)."""
        with self.lock:
            for node in self.nodes.values():
                for worker in node.workers:
                    pgid = worker.runtime.live_pgid if worker.runtime else None
                    if (node.state == "READY" and pgid is not None
                            and self.faults.take_worker_fault("kill_runtimes", node.node_id, worker.number)):
                        log.info("killing the TPU runtime of %s worker %s", node.name, worker.number)
                        signal_group(pgid, signal.SIGKILL)

    def _probe_runtimes(self) -> None:
        """Ask every runtime of every READY slice whether it answers (outside the lock), then record it.

        A runtime that answered and stops answering adds a symptom naming its worker.
        """
        now = time.monotonic()
        if now - self._last_probe < RUNTIME_PROBE_S:
            return
        self._last_probe = now
        with self.lock:
            targets = [(node.key, node.generation, worker.number, worker.address)
                       for node in self.nodes.values() if node.state == "READY" and node.serves_runtime
                       for worker in node.workers if not worker.never_boots]
        answers = [(key, generation, number, runtime_answers(address, timeout_s=0.5))
                   for key, generation, number, address in targets]
        with self.lock:
            for key, generation, number, up in answers:
                node = self._current(key, generation)
                if node is None or node.preempting:
                    continue
                worker = node.workers[number]
                if worker.runtime_seen and worker.runtime_up and not up:
                    node.symptoms.append({
                        "createTime": rfc3339(time.time()),
                        "symptomType": "MESH_BUILD_FAIL",
                        "details": f"The TPU runtime of worker {number} stopped answering on {worker.endpoint()}.",
                        "workerId": str(number),
                    })
                worker.runtime_up = up
                worker.runtime_seen = worker.runtime_seen or up
            for node in self.nodes.values():
                self._note_absent_workers(node)

    @staticmethod
    def _note_absent_workers(node: Node) -> None:
        """Once the workers that boot are up, a symptom for each that never booted (once per boot)."""
        if node.state != "READY" or not node.serves_runtime:
            return
        for worker in node.workers:
            noted = any(s.get("workerId") == str(worker.number) for s in node.symptoms)
            if worker.never_boots and not noted and all(w.runtime_up for w in node.workers if not w.never_boots):
                node.symptoms.append({
                    "createTime": rfc3339(time.time()),
                    "symptomType": "MESH_BUILD_FAIL",
                    "details": f"Worker {worker.number} did not boot; its TPU runtime never answered.",
                    "workerId": str(worker.number),
                })

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
