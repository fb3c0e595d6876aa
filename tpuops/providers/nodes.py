"""The provider-neutral vocabulary of nodes: what the domain knows of a node, whatever cloud runs it.

The domain (``runs``, ``controller``, ``sweeps``, ``fleet``) imports node types from here, never
from an adapter: an adapter converts its SDK's nodes, states and operations into these once.

Invariants:
- ``NodeState`` holds the Cloud TPU v2 states plus ``GONE`` (a node that no longer exists); an
  adapter for another cloud maps its states onto them (``is_dead`` is what recovery acts on).
- ``NodeRequest`` is exactly what a create asks for; a run freezes one at declare time
  (``runs.NodeSpec`` is a ``NodeRequest`` plus the zones to try), so a recreate asks the same.
- ``MetadataKey`` is the one list of node metadata keys that tpuops sets and the startup script
  reads (``templates/startup.sh.j2`` gets them from the renderer): a key spelled anywhere else is a bug.
  The agent, which cannot import this module, reads ``WAKE_JOB`` by the constant it is made from.
- ``Operation`` is a snapshot of a long-running request; it is never refreshed in place: ask the
  provider again (``NodeProvider.operation``) for a newer one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tpuops.agent.wake import WAKE_JOB_ATTRIBUTE
from tpuops.core.clock import UTC
from tpuops.core.create_result import CreateResult
from tpuops.core.errors import TpuopsError
from tpuops.core.kinds import Capacity, ValueEnum
from tpuops.core.naming import MANAGED_BY_KEY, MANAGED_BY_VALUE


class MetadataKey(ValueEnum):
    """Node metadata keys that tpuops writes at create time and the VM's startup script reads."""

    STARTUP_SCRIPT = "startup-script"
    MAX_RUN_SECONDS = "tpuops-max-run-seconds"
    """The dead-man's switch: past this many seconds the job is stopped and the node deletes itself."""
    KEEP_NODE = "tpuops-keep-node"
    """Set ("true"): the node stays up after its job ends (``--keep``)."""
    TPU_API = "tpuops-tpu-api"
    """A non-default API endpoint (the emulator) the node deletes itself through."""
    WAKE_JOB = WAKE_JOB_ATTRIBUTE
    """The Cloud Run job (``projects/P/locations/R/jobs/J``) the agent starts after its save on a preemption
    notice (``tpuops.agent.wake``; setting ``wake_job``)."""


class NodeState(str, Enum):
    """Node states of the v2 API, plus GONE for a node that no longer exists."""

    UNSPECIFIED = "STATE_UNSPECIFIED"
    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REIMAGING = "REIMAGING"
    DELETING = "DELETING"
    REPAIRING = "REPAIRING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    UNKNOWN = "UNKNOWN"
    GONE = "GONE"

    @property
    def is_dead(self) -> bool:
        """A node in this state will never run work again: delete and recreate it."""
        return self in (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.GONE)


@dataclass(frozen=True)
class NodeInfo:
    """What we know of one node, independent of any SDK's types."""

    name: str
    zone: str
    project: str
    accelerator: str
    runtime: str
    capacity: Capacity
    state: NodeState
    health: str
    labels: dict[str, str]
    create_time: datetime | None
    uid: str = ""
    hosts: int = 1
    """How many hosts (workers) the node is: 4 for a v3-32 slice, 1 for a single TPU VM."""
    unhealthy_workers: tuple[int, ...] = ()
    """The workers the provider reports a symptom for (a runtime that stopped answering, a worker that never
    booted): the node's state is the whole slice's, so this is where one bad worker shows."""

    @property
    def managed(self) -> bool:
        return self.labels.get(MANAGED_BY_KEY) == MANAGED_BY_VALUE

    def age_s(self, now: datetime | None = None) -> float | None:
        if self.create_time is None:
            return None
        return ((now or datetime.now(UTC)) - self.create_time).total_seconds()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "zone": self.zone, "project": self.project,
            "accelerator": self.accelerator, "runtime": self.runtime, "capacity": self.capacity.value,
            "state": self.state.value, "health": self.health, "labels": self.labels,
            "create_time": self.create_time.isoformat() if self.create_time else None,
            "managed": self.managed, "uid": self.uid, "hosts": self.hosts,
            "unhealthy_workers": list(self.unhealthy_workers),
        }


class NodeRequest(BaseModel):
    """A node to create; ``body()`` is exactly the Cloud TPU REST body of its CreateNode."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    accelerator: str
    runtime: str
    capacity: Capacity
    labels: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    description: str = "created by tpuops"
    service_account: str | None = None
    """The VM's account email; None leaves the project's default compute account."""

    def body(self) -> dict[str, Any]:
        # cloud-platform scope: the VM's own account reads the bucket and may delete its node.
        account: dict[str, Any] = {"scope": ["https://www.googleapis.com/auth/cloud-platform"]}
        if self.service_account:
            account["email"] = self.service_account
        scheduling: dict[str, bool] = {}
        if self.capacity is Capacity.SPOT:
            scheduling["spot"] = True
        elif self.capacity is Capacity.PREEMPTIBLE:
            scheduling["preemptible"] = True
        return {
            "description": self.description,
            "acceleratorType": self.accelerator,
            "runtimeVersion": self.runtime,
            "schedulingConfig": scheduling,
            "labels": dict(self.labels),
            "metadata": dict(self.metadata),
            "serviceAccount": account,
        }

    def matches(self, node: NodeInfo) -> bool:
        """Whether an existing node is this request already made (so it may be adopted)."""
        return (node.managed and node.accelerator == self.accelerator and node.runtime == self.runtime
                and node.capacity is self.capacity)


@dataclass(frozen=True)
class Operation:
    """A long-running request (create, delete, start) as its provider last reported it.

    ``started`` and ``ended`` are the provider's own times (None when it does not say, or has not
    ended); ``error`` is what ended it badly, already in the taxonomy of ``tpuops.core.errors``.
    """

    name: str
    zone: str
    done: bool
    target: str = ""
    """The resource it acts on (``projects/P/locations/Z/nodes/N``)."""
    started: datetime | None = None
    ended: datetime | None = None
    error: TpuopsError | None = None

    @property
    def result(self) -> CreateResult:
        """Where a create stands: RUNNING, OK, or what its error means for the run."""
        if not self.done:
            return CreateResult.RUNNING
        return CreateResult.OK if self.error is None else CreateResult.of(self.error)

    @property
    def message(self) -> str:
        return "" if self.error is None else str(self.error)


@dataclass(frozen=True)
class QueuedInfo:
    """A queued resource: its id, zone, state (ACCEPTED, ACTIVE, FAILED, SUSPENDED, ...) and node ids."""

    name: str
    zone: str
    state: str
    node_ids: list[str]
    spot: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "zone": self.zone, "state": self.state, "node_ids": self.node_ids,
                "spot": self.spot}
