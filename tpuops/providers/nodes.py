"""The provider-neutral vocabulary of nodes: what the domain knows of a node, whatever cloud runs it.

The domain (``runs``, ``controller``, ``sweeps``, ``fleet``) imports node types from here, never
from an adapter: an adapter converts its SDK's nodes, states and operations into these once.

Nothing here is one cloud's wire format: a request body, a state's spelling in an API, how capacity is asked
for are the adapter's (``cloud_tpu`` holds Cloud TPU's REST body, its v2 states and their mapping).

Invariants:
- ``NodeState`` is what any TPU cloud's node can be (creating, ready, preempted, deleting, ...) plus ``GONE``
  (a node that no longer exists); every adapter maps its cloud's states onto them (``is_dead`` is what
  recovery acts on).
- ``NodeRequest`` is exactly what a create asks for (accelerator, capacity, labels, startup payload); a run
  freezes one at declare time (``runs.NodeSpec`` is a ``NodeRequest`` plus the zones to try), so a recreate
  asks the same.
- ``Operation`` is a snapshot of a long-running request; it is never refreshed in place: ask the
  provider again (``NodeProvider.operation``) for a newer one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tpuops.core.clock import UTC
from tpuops.core.create_result import CreateResult
from tpuops.core.errors import TpuopsError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MANAGED_BY_KEY, MANAGED_BY_VALUE


class NodeState(str, Enum):
    """Where a node stands, in words any TPU cloud has; each adapter maps its own states onto these once.

    The values are what ``status`` shows and ``--json`` prints. A state the adapter cannot place is UNKNOWN (the
    controller waits on it); GONE is a node that no longer exists.
    """

    UNSPECIFIED = "STATE_UNSPECIFIED"
    """Not reported yet (a queued node the cloud has not made)."""
    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REPAIRING = "REPAIRING"
    DELETING = "DELETING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
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
    """A node to create, in no cloud's vocabulary: each provider turns it into its own request (its create body).

    ``metadata`` is the startup payload (``core.naming.MetadataKey``: the startup script and its settings), which
    a provider hands to the node as its cloud does (VM metadata, a container's environment).
    """

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
    """The resource it acts on, in the provider's own naming, ending with the node's name (Cloud TPU:
    ``projects/P/locations/Z/nodes/N``)."""
    started: datetime | None = None
    ended: datetime | None = None
    error: TpuopsError | None = None
    verb: str = ""
    """What it does (Cloud TPU's metadata verb: ``create``, ``delete``, ``start``); empty if the provider won't say."""

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
