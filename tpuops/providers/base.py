"""The node-provider protocol: the one seam between tpuops and a cloud that runs TPU nodes.

A provider is a handful of calls on one project's nodes, in the vocabulary of
``tpuops.providers.nodes``. It holds no ledger and no policy: the ``Fleet`` (``tpuops.fleet``) is
the only holder of a provider, and dates, records, retries across zones and adopts on top of it.

Contract, for every implementation (``tests/test_provider_contract.py`` holds each to it):
- errors are the taxonomy of ``tpuops.core.errors``, converted once inside the provider (never an SDK's);
- ``create_node`` of a name taken in that zone raises ``AlreadyExists``; nothing else is created;
- ``delete_node`` of a missing node returns None (success): deletes are idempotent;
- ``find_node`` of a missing node returns None; ``list_nodes`` returns every node in the zone;
- an ``Operation`` is a snapshot; ``operation`` reports it afresh (one call), and never blocks;
- every method is safe to call from many threads at once.

Optional capabilities are separate protocols (as dstack's ``ComputeWith...`` mixins):
``StartsNodes`` (start a STOPPED node), ``QueuesNodes`` (queued resources, ``up --queued``) and
``ListsOperations`` (the operations on one node, whoever asked for them: the evidence that dates a
self-delete, ``tpuops.billing.observer``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from tpuops.core.errors import Timeout, UsageError
from tpuops.providers import accelerators
from tpuops.providers.nodes import NodeInfo, NodeRequest, Operation, QueuedInfo

CLOSE_POLL_S = 0.02
"""The shortest pause between two polls of an operation that someone waits on closely (``wait_for``)."""


@runtime_checkable
class NodeProvider(Protocol):
    """Creates, deletes and lists the TPU nodes of one project."""

    project: str
    poll_interval_s: float
    """How often this provider's operations and nodes are worth polling."""

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        """Every node in ``zone`` (all pages)."""
        ...

    def find_node(self, zone: str, name: str) -> NodeInfo | None:
        """The node, or None when it does not exist."""
        ...

    def create_node(self, zone: str, request: NodeRequest) -> Operation:
        """Start creating ``request`` in ``zone``; ``AlreadyExists`` if the name is taken there.

        A stockout may surface here (``CapacityError``) or later as the operation's error.
        """
        ...

    def delete_node(self, zone: str, name: str) -> Operation | None:
        """Start deleting; None when the node does not exist (a delete is idempotent)."""
        ...

    def operation(self, zone: str, name: str) -> Operation:
        """Where the operation called ``name`` stands now; ``NotFound`` once the provider forgot it."""
        ...


@runtime_checkable
class StartsNodes(Protocol):
    """A provider whose nodes can be STOPPED, and started again."""

    def start_node(self, zone: str, name: str) -> Operation:
        """Start a STOPPED node; returns the operation."""
        ...


@runtime_checkable
class QueuesNodes(Protocol):
    """A provider with queued resources: a request that waits out a stockout instead of failing."""

    @classmethod
    def queued_body(cls, project: str, zone: str, request: NodeRequest, *,
                    valid_until_s: float | None) -> dict[str, Any]:
        """What ``create_queued_resource`` would send, in the provider's own words, with no connection (a dry run)."""
        ...

    def create_queued_resource(self, zone: str, qr_id: str, request: NodeRequest, *,
                               valid_until_s: float | None = None) -> Operation:
        """Queue one node; ``AlreadyExists`` if ``qr_id`` is taken in the zone."""
        ...

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedInfo:
        """The queued resource, or ``NotFound``."""
        ...

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool = False) -> Operation | None:
        """Start deleting (``force`` also deletes its nodes); None when it does not exist."""
        ...


@runtime_checkable
class ListsOperations(Protocol):
    """Lists the operations on one node, including those asked for by someone else (the node's own self-delete)."""

    def node_operations(self, zone: str, name: str) -> list[Operation]:
        """Every operation the provider still keeps whose target is the node called ``name`` in ``zone``."""
        ...


def require_queues(provider_type: type) -> None:
    """Refuse (``UsageError``, one line) a provider class without queued resources, before anything is asked of it."""
    if not issubclass(provider_type, QueuesNodes):
        raise UsageError("this node provider has no queued resources: run 'tpuops up' without --queued")


def wait_for(provider: NodeProvider, operation: Operation, *, timeout_s: float,
         on_poll: Callable[[], None] | None = None, closely: bool = False) -> Operation:
    """Poll ``operation`` until done; return it, or raise its error (already in the taxonomy).

    ``on_poll`` runs between polls (the CLI shows the node's state; what it raises ends the
    wait). ``closely`` is for a caller with its next request ready (a replacement's create after a
    delete): polls follow each other ``CLOSE_POLL_S`` apart, spaced out to 2 % of the time waited
    so far (at most ``poll_interval_s``), so that the next request goes out within about one
    round trip of the completion without a long operation costing hundreds of polls.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    while not operation.done:
        operation = provider.operation(operation.zone, operation.name)
        if operation.done:
            break
        now = time.monotonic()
        if now >= deadline:
            raise Timeout(f"operation {operation.name} did not finish within {timeout_s:.0f} s")
        if on_poll is not None:
            on_poll()
        pause = max(CLOSE_POLL_S, (now - started) / 50) if closely else provider.poll_interval_s
        time.sleep(min(pause, provider.poll_interval_s))
    if operation.error is not None:
        raise operation.error
    return operation


class CloudTpuRules:
    """A provider's rules for the settings (``tpuops.providers.registry.RULES``, which ``config`` asks): the zones
    and accelerator types of the Cloud TPU catalog. The base of the Cloud TPU adapter and of the worlds that
    model Cloud TPU; a provider of another cloud says its own: ``check_zone``, ``check_accelerator`` and
    ``zones_for`` class methods that raise ``UsageError``, one line."""

    @classmethod
    def check_zone(cls, zone: str) -> str:
        return accelerators.check_zone(zone)

    @classmethod
    def check_accelerator(cls, accelerator: str) -> str:
        return accelerators.parse_accelerator(accelerator).type

    @classmethod
    def zones_for(cls, accelerator: str, zones: list[str]) -> list[str]:
        return accelerators.offered_zones(accelerator, zones)


class InProcessWorld(CloudTpuRules):
    """The base of a provider whose nodes live in this process (``memory``, ``simulated``): it needs no emulator
    and has no wire format, so what its ``create_node`` takes (a dry run shows it) is the request's own fields."""

    talks_to_emulator: ClassVar[bool] = False

    @classmethod
    def create_body(cls, project: str, zone: str, request: NodeRequest) -> dict[str, Any]:
        return request.model_dump(mode="json")


@dataclass(frozen=True)
class Connection:
    """What a provider is opened with (``tpuops.providers.registry``): one project, where, how patiently.

    ``token`` is a bearer token for a local endpoint (the emulator's); never logged or shown.
    """

    project: str
    endpoint: str | None = None
    token: str | None = field(default=None, repr=False)
    deadline_s: float = 120.0
    poll_interval_s: float = 5.0
