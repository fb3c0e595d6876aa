"""The emulator's records of nodes and queued resources, and their v2 JSON form.

A record holds what the API shows plus what the emulator needs to run the node (its
generation counter, pending operations, and its workers: one per host, each with its metadata
server and process groups). ``to_json`` emits only real ``google.cloud.tpu.v2`` fields, since the
client rejects unknown ones. A node is its whole slice: one ``state``; per-worker detail shows only
in ``networkEndpoints`` (worker order), ``health`` and ``symptoms[].workerId``.
Records are mutated only under the emulator's state lock.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from tpuops.emulator.apierror import invalid
from tpuops.emulator.cloud import catalog
from tpuops.emulator.cloud.operations import LongRunningOperation
from tpuops.emulator.cloud.wire import NodeFields, rfc3339, string_list, string_map
from tpuops.emulator.vm.workers import TPU_RUNTIME_PORT, Worker, tpu_env, worker_endpoints

UPDATABLE_PATHS = frozenset({"description", "tags", "labels", "metadata", "network_config.enable_external_ips"})


def check_update_mask(paths: list[str]) -> None:
    """Refuse (INVALID_ARGUMENT) an empty update mask or one naming a field that cannot be updated."""
    if not paths:
        raise invalid("Field update_mask is required.")
    unsupported = sorted(set(paths) - UPDATABLE_PATHS)
    if unsupported:
        raise invalid(f"Invalid update_mask path {unsupported[0]!r}; updatable: {', '.join(sorted(UPDATABLE_PATHS))}.")


@dataclass
class Node:
    """One emulated TPU node.

    ``generation`` grows at every state change; a delayed transition scheduled for one
    generation does nothing if the node has moved on (deleted, stopped, preempted) since.
    """

    project: str
    zone: str
    node_id: str
    spec: NodeFields
    uid: str
    create_time: float
    state: str = "CREATING"
    generation: int = 0
    queued_resource: str = ""
    pending_op: LongRunningOperation | None = None
    delete_ops: list[LongRunningOperation] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    serves_runtime: bool = False
    symptoms: list[dict[str, str]] = field(default_factory=list)
    preempting: bool = False
    sa_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.node_id}"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.project, self.zone, self.node_id)

    @property
    def preemptible(self) -> bool:
        return self.spec.capacity != "on-demand"

    @property
    def live_pgids(self) -> list[int]:
        """Every process group of every worker in which anything may still live."""
        return [pgid for worker in self.workers for pgid in worker.live_pgids]

    def advance(self, state: str) -> int:
        """Move to ``state`` and return the new generation."""
        self.state = state
        self.generation += 1
        return self.generation

    def system_attributes(self, worker: Worker) -> dict[str, str]:
        """Metadata attributes as the metadata server of TPU VM worker ``worker`` shows them.

        A single-host node keeps the two it always had; a slice's workers also learn where the others are.
        """
        accelerator = self.spec.accelerator
        own = {**self.spec.metadata, "agent-worker-number": str(worker.number), "accelerator-type": accelerator.name}
        if accelerator.single_host:
            return own
        return {
            **own,
            "instance-id": f"{self.uid}-w-{worker.number}",
            "worker-network-endpoints": worker_endpoints(self.workers, self.uid),
            "tpu-env": tpu_env(worker, accelerator=accelerator.name, node_id=self.node_id, zone=self.zone,
                               topology=accelerator.topology, runtime_version=self.spec.runtime_version),
        }

    def apply_update(self, paths: list[str], body: dict[str, Any]) -> None:
        """Apply the fields of ``body`` that the update mask ``paths`` (snake_case) names.

        Every masked field is validated first, then all are applied: an invalid update changes nothing.
        The workers' metadata servers are the caller's to refresh when ``metadata`` is among the paths.

        Raises:
            ApiError: INVALID_ARGUMENT (a mask ``check_update_mask`` refuses, a malformed field).
        """
        check_update_mask(paths)
        spec = self.spec
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
        if "network_config.enable_external_ips" in paths:
            enabled = bool((body.get("networkConfig") or {}).get("enableExternalIps"))
            current = spec.network_config or self.to_json()["networkConfig"]
            spec.network_config = {**current, "enableExternalIps": enabled}

    def health(self) -> tuple[str | None, str]:
        """``health`` and ``healthDescription`` of a READY node.

        Without a runtime to ask (single-host nodes, images without the TPU runtime stand-in) a READY
        node is HEALTHY. A slice serving runtimes is HEALTHY only while every worker's runtime answers:
        UNHEALTHY_TENSORFLOW once one that answered stops, TIMEOUT when the workers that boot are up but
        one never booted, no health yet while runtimes are still coming up.
        """
        if not self.serves_runtime:
            return "HEALTHY", ""
        dead = [w for w in self.workers if w.runtime_seen and not w.runtime_up]
        if dead:
            return "UNHEALTHY_TENSORFLOW", "; ".join(
                f"the TPU runtime of worker {w.number} does not answer on {w.endpoint()}" for w in dead)
        if all(w.runtime_up for w in self.workers):
            return "HEALTHY", ""
        absent = [w for w in self.workers if w.never_boots]
        if absent and all(w.runtime_up for w in self.workers if not w.never_boots):
            return "TIMEOUT", "; ".join(f"worker {w.number} did not boot" for w in absent)
        return None, ""

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        number = catalog.project_number(self.project)
        region = self.zone.rsplit("-", 1)[0]
        out: dict[str, Any] = {
            "name": self.name,
            "acceleratorType": spec.accelerator.name,
            "acceleratorConfig": {"type": spec.accelerator.config_type, "topology": spec.accelerator.topology},
            "state": self.state,
            "runtimeVersion": spec.runtime_version,
            "networkConfig": spec.network_config
            or {
                "network": f"projects/{self.project}/global/networks/default",
                "subnetwork": f"projects/{self.project}/regions/{region}/subnetworks/default",
                "enableExternalIps": True,
            },
            "serviceAccount": spec.service_account
            or {
                "email": f"{number}-compute@developer.gserviceaccount.com",
                "scope": ["https://www.googleapis.com/auth/cloud-platform"],
            },
            "createTime": rfc3339(self.create_time),
            "schedulingConfig": spec.scheduling_config,
            "networkEndpoints": [
                {"ipAddress": w.address, "port": TPU_RUNTIME_PORT, "accessConfig": {"externalIp": w.address}}
                for w in self.workers
            ],
            "id": self.uid,
            "apiVersion": "V2",
        }
        if self.state == "READY":
            health, description = self.health()
            if health:
                out["health"] = health
            if description:
                out["healthDescription"] = description
        optional = {
            "description": spec.description,
            "labels": spec.labels,
            "metadata": spec.metadata,
            "tags": spec.tags,
            "networkConfigs": spec.network_configs,
            "dataDisks": spec.data_disks,
            "shieldedInstanceConfig": spec.shielded_instance_config,
            "cidrBlock": spec.cidr_block,
            "queuedResource": self.queued_resource,
            "symptoms": [dict(symptom) for symptom in self.symptoms],
        }
        out.update({key: value for key, value in optional.items() if value})
        return out


@dataclass
class QueuedNodeSpec:
    """One entry of a queued resource's ``tpu.nodeSpec``, expanded to node ids."""

    node_ids: list[str]
    spec: NodeFields
    echo: dict[str, Any]


@dataclass
class QueuedResource:
    """One queued resource: a request for nodes that the emulator provisions when it can."""

    project: str
    zone: str
    qr_id: str
    create_time: float
    requests: list[QueuedNodeSpec]
    tier: dict[str, Any]
    queueing_policy: dict[str, Any]
    reservation_name: str = ""
    valid_after: float | None = None
    valid_until: float | None = None
    state: str = "ACCEPTED"
    state_initiator: str = "USER"
    failure: dict[str, Any] | None = None
    delete_ops: list[LongRunningOperation] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.qr_id}"

    @property
    def node_keys(self) -> list[tuple[str, str, str]]:
        return [(self.project, self.zone, node_id) for request in self.requests for node_id in request.node_ids]

    def to_json(self) -> dict[str, Any]:
        state: dict[str, Any] = {"state": self.state, "stateInitiator": self.state_initiator}
        data_field = {
            "CREATING": "creatingData",
            "ACCEPTED": "acceptedData",
            "PROVISIONING": "provisioningData",
            "FAILED": "failedData",
            "DELETING": "deletingData",
            "ACTIVE": "activeData",
            "SUSPENDING": "suspendingData",
            "SUSPENDED": "suspendedData",
        }.get(self.state)
        if data_field:
            state[data_field] = {"error": self.failure} if self.state == "FAILED" and self.failure else {}
        out: dict[str, Any] = {
            "name": self.name,
            "createTime": rfc3339(self.create_time),
            "tpu": {"nodeSpec": [request.echo for request in self.requests]},
            "state": state,
            **self.tier,
        }
        if self.queueing_policy:
            out["queueingPolicy"] = self._policy_json()
        if self.reservation_name:
            out["reservationName"] = self.reservation_name
        return out

    def _policy_json(self) -> dict[str, Any]:
        """The queueing policy as the API answers it: durations become absolute times."""
        policy = dict(self.queueing_policy)
        if "validUntilDuration" in policy and self.valid_until is not None:
            del policy["validUntilDuration"]
            policy["validUntilTime"] = rfc3339(self.valid_until)
        if "validAfterDuration" in policy and self.valid_after is not None:
            del policy["validAfterDuration"]
            policy["validAfterTime"] = rfc3339(self.valid_after)
        return policy
