"""A slice's workers through a node's life: placed, booted, told of a preemption, ended, watched.

A node of H hosts is H workers (``vm.workers``), each a "VM" with its own loopback address, metadata
server, directory and process groups. ``EmulatorState`` decides when a node moves (READY, STOPPING,
PREEMPTED, DELETING); ``SliceLifecycle`` does what that move means for every worker of the slice at once:

- placed: a single host on 127.0.0.1, a slice's workers on addresses taken from the pool (given back when
  the node is gone);
- booted (entering READY): each worker's metadata server (created once, kept across restarts), on a
  ``-pod`` runtime its TPU runtime, then its ``startup-script``; a worker the ``never_boot_workers`` fault
  names runs nothing;
- preempted: every worker's ``instance/preempted`` turns TRUE, then every worker's groups end after the grace;
- ended (stopped, deleted): every worker's groups end;
- watched (every tick): the ``kill_runtimes`` fault, and each runtime of a READY slice probed every
  ``RUNTIME_PROBE_S`` outside the lock; a runtime that stops answering, or a worker that never booted,
  becomes a ``MESH_BUILD_FAIL`` symptom naming the worker (what ``nodes.Node.health`` reads).

Every method runs with the state's lock held (the caller's) except the tick hooks, ``close`` and
``metadata_hosts_by_group``, which take it themselves (the hooks never hold it across a probe). A
callback that ends a move (``on_gone``) comes back on the sandbox reaper thread, and the state checks the
node's generation before acting on it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpuops.emulator.cloud import catalog
from tpuops.emulator.cloud.nodes import Node
from tpuops.emulator.cloud.wire import rfc3339
from tpuops.emulator.faults import Faults
from tpuops.emulator.vm.metadata import MetadataServer, MetadataView
from tpuops.emulator.vm.sandbox import Sandboxes, ScriptRun, signal_group
from tpuops.emulator.vm.workers import SINGLE_HOST_ADDRESS, AddressPool, RuntimeImage, Worker, runtime_answers

log = logging.getLogger(__name__)

RUNTIME_PROBE_S = 0.5

NodeKey = tuple[str, str, str]


def host_keys(uid: str, worker: int) -> dict[str, str]:
    """The SSH host keys a TPU VM worker publishes as guest attributes (stable per node and worker)."""
    keys = {}
    for algorithm in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
        digest = hashlib.sha512(f"{uid}/{worker}/{algorithm}".encode()).digest()
        blob = len(algorithm).to_bytes(4, "big") + algorithm.encode() + (32).to_bytes(4, "big") + digest[:32]
        keys[f"hostkeys/{algorithm}"] = f"{algorithm} {base64.b64encode(blob).decode()}"
    return keys


class SliceLifecycle:
    """The workers of every node of one emulator: their machines, processes and runtimes.

    Args:
        state_dir: where the sandboxes and the runtime image's shim live.
        image_python: the interpreter that plays the VM image's python3 (None: this one).
        faults: the worker faults (``never_boot_workers``, ``kill_runtimes``) it uses up.
        lock: the state's lock, taken by the tick hooks only.
        nodes: the state's nodes, read by the tick hooks under ``lock``.
    """

    def __init__(self, state_dir: Path, image_python: str | None, faults: Faults, lock: threading.RLock,
                 nodes: Mapping[NodeKey, Node]) -> None:
        self.sandboxes = Sandboxes(state_dir, image_python)
        self.addresses = AddressPool()
        self.runtime_image = RuntimeImage(state_dir, image_python)
        self._faults = faults
        self._lock = lock
        self._nodes = nodes
        self._last_probe = 0.0

    # ----- a node's moves (caller holds the lock)

    def place(self, node: Node) -> None:
        """Give a new node its workers, one per host, and say whether they serve a TPU runtime."""
        hosts = node.spec.accelerator.hosts
        addresses = [SINGLE_HOST_ADDRESS] if hosts == 1 else self.addresses.allocate(hosts)
        node.workers = [Worker(number, address, f"{node.node_id}-w-{number}")
                        for number, address in enumerate(addresses)]
        node.serves_runtime = hosts > 1 and "-pod" in node.spec.runtime_version and self.runtime_image.usable()

    def boot(self, node: Node) -> None:
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
            worker.never_boots = self._faults.take_worker_fault("never_boot_workers", node.node_id, worker.number)
            if worker.never_boots:
                continue
            directory = self.worker_directory(node, worker)
            runtime = self.runtime_image.script(endpoints, worker) if node.serves_runtime else None
            if runtime is not None:
                worker.runtime = self.sandboxes.run_script(
                    directory, runtime, server.host, lambda run: _script_exited(node, run), name="tpu-runtime")
            if script:
                run = self.sandboxes.run_script(directory, script, server.host, lambda run: _script_exited(node, run))
                worker.runs.append(run)

    def leave_ready(self, node: Node) -> None:
        """The slice's runtimes count as down from now: whatever answers is going away."""
        for worker in node.workers:
            worker.runtime_up = False

    def end(self, node: Node, wait_s: float, on_gone: Callable[[], None]) -> None:
        """End every worker's process groups (SIGTERM, SIGKILL after ``wait_s``); ``on_gone`` once all are gone."""
        self.sandboxes.terminate(node.live_pgids, wait_s, on_gone)

    def preempt(self, node: Node, grace_s: float, on_gone: Callable[[], None]) -> None:
        """Tell every worker (``instance/preempted``), then end every worker's processes after ``grace_s``."""
        for worker in node.workers:
            if worker.metadata_server is not None:
                worker.metadata_server.view.set_preempted(True)
        self.end(node, grace_s, on_gone)

    def refresh_attributes(self, node: Node) -> None:
        """Show the node's metadata, as just updated, on every worker's metadata server."""
        for worker in node.workers:
            if worker.metadata_server is not None:
                worker.metadata_server.view.set_attributes(node.system_attributes(worker))

    def forget(self, node: Node) -> list[MetadataServer]:
        """A removed node: its slice's addresses go back to the pool; returns its servers, to close outside the lock.

        A single host's 127.0.0.1 was never taken.
        """
        if len(node.workers) > 1:
            self.addresses.release([worker.address for worker in node.workers])
        return [worker.metadata_server for worker in node.workers if worker.metadata_server]

    # ----- views (caller holds the lock)

    def worker_directory(self, node: Node, worker: Worker) -> Path:
        """Worker ``worker``'s directory (its HOME, logs, TMPDIR): worker 0's is the node's, as on one host."""
        directory = self.sandboxes.directory(node.project, node.zone, node.node_id)
        return directory if worker.number == 0 else directory.with_name(f"{directory.name}.w{worker.number}")

    def describe(self, node: Node) -> dict[str, Any]:
        """What the admin API shows of a node's emulation: worker 0's fields at the top, every worker's below."""
        return {
            "name": node.name,
            "state": node.state,
            "uid": node.uid,
            **self._describe_worker(node, node.workers[0]),
            "preempting": node.preempting,
            "workers": [self._describe_worker(node, worker) for worker in node.workers],
        }

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

    @staticmethod
    def guest_attributes(node: Node) -> list[dict[str, str]]:
        """Per worker, its guest attributes by ``namespace/key``: the SSH host keys every TPU VM
        publishes, and what that worker's processes wrote to its metadata server."""
        return [{**host_keys(node.uid, worker.number),
                 **(worker.metadata_server.view.guest_attributes() if worker.metadata_server else {})}
                for worker in node.workers]

    def metadata_hosts_by_group(self) -> dict[int, str]:
        """Each live process group of a node's worker -> that worker's metadata host (``vm.metadoor`` asks).

        Takes the lock itself: the door asks from its own thread.
        """
        with self._lock:
            return {pgid: worker.metadata_server.host for node in self._nodes.values() for worker in node.workers
                    if worker.metadata_server is not None for pgid in worker.live_pgids}

    def close(self, shutdown_wait_s: float) -> None:
        """End every process group and stop every metadata server: the emulator is stopping."""
        with self._lock:
            servers = [w.metadata_server for node in self._nodes.values() for w in node.workers if w.metadata_server]
        self.sandboxes.close(grace_s=min(shutdown_wait_s, 2.0))
        for server in servers:
            server.close()

    # ----- tick hooks (they take the lock themselves)

    def kill_runtimes(self) -> None:
        """The ``kill_runtimes`` fault: SIGKILL the runtime of each named worker of a READY node (entry used up)."""
        with self._lock:
            for node in self._nodes.values():
                for worker in node.workers:
                    pgid = worker.runtime.live_pgid if worker.runtime else None
                    if (node.state == "READY" and pgid is not None
                            and self._faults.take_worker_fault("kill_runtimes", node.node_id, worker.number)):
                        log.info("killing the TPU runtime of %s worker %s", node.name, worker.number)
                        signal_group(pgid, signal.SIGKILL)

    def probe_runtimes(self) -> None:
        """Ask every runtime of every READY slice whether it answers (outside the lock), then record it.

        A runtime that answered and stops answering adds a symptom naming its worker.
        """
        now = time.monotonic()
        if now - self._last_probe < RUNTIME_PROBE_S:
            return
        self._last_probe = now
        with self._lock:
            targets = [(node.key, node.generation, worker.number, worker.address)
                       for node in self._nodes.values() if node.state == "READY" and node.serves_runtime
                       for worker in node.workers if not worker.never_boots]
        answers = [(key, generation, number, runtime_answers(address, timeout_s=0.5))
                   for key, generation, number, address in targets]
        with self._lock:
            for key, generation, number, up in answers:
                node = self._nodes.get(key)
                if node is None or node.generation != generation or node.preempting:
                    continue
                worker = node.workers[number]
                if worker.runtime_seen and worker.runtime_up and not up:
                    node.symptoms.append(_mesh_symptom(
                        number, f"The TPU runtime of worker {number} stopped answering on {worker.endpoint()}."))
                worker.runtime_up = up
                worker.runtime_seen = worker.runtime_seen or up
            for node in self._nodes.values():
                _note_absent_workers(node)

    # ----- a worker's machine

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


def _script_exited(node: Node, run: ScriptRun) -> None:
    log.info("startup script of %s (pgid %s) exited with %s", node.name, run.pgid, run.exit_code)


def _mesh_symptom(worker: int, details: str) -> dict[str, str]:
    return {"createTime": rfc3339(time.time()), "symptomType": "MESH_BUILD_FAIL", "details": details,
            "workerId": str(worker)}


def _note_absent_workers(node: Node) -> None:
    """Once the workers that boot are up, a symptom for each that never booted (once per boot)."""
    if node.state != "READY" or not node.serves_runtime:
        return
    for worker in node.workers:
        noted = any(s.get("workerId") == str(worker.number) for s in node.symptoms)
        if worker.never_boots and not noted and all(w.runtime_up for w in node.workers if not w.never_boots):
            node.symptoms.append(_mesh_symptom(
                worker.number, f"Worker {worker.number} did not boot; its TPU runtime never answered."))
