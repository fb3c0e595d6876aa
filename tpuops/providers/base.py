"""The node-provider protocol: the one seam between tpuops and a cloud that runs TPU nodes.

A provider is a handful of calls on one project's nodes, in the vocabulary of
``tpuops.providers.nodes``. It holds no ledger and no policy: the ``Fleet`` (``tpuops.fleet``) is
the only holder of a provider, and dates, records, retries across zones and adopts on top of it.

Contract, for every implementation (``tests/providers/test_provider_contract.py`` holds each to it):
- errors are the taxonomy of ``tpuops.core.errors``, converted once inside the provider (never an SDK's);
- ``create_node`` of a name taken in that zone raises ``AlreadyExists``; nothing else is created;
- ``delete_node`` of a missing node returns None (success): deletes are idempotent;
- ``find_node`` of a missing node returns None; ``list_nodes`` returns every node in the zone;
- a listing can lag: a node just created may be missing from ``list_nodes`` for a while, and one just deleted
  may still show, so one listing without a node is no evidence that it is gone (the controller asks for
  ``evidence_passes`` listings in a row, ``tpuops.controller.decide``); a preempted node stays listed PREEMPTED;
- an ``Operation`` is a snapshot; ``operation`` reports it afresh (one call), and never blocks;
- every method is safe to call from many threads at once.

What a node *is* (its shape, runtimes, prices, zones) the provider's class answers with its ``Offers``
(``tpuops.providers.offers``; ``registry.ProviderClass.offers``), not this protocol: it needs no connection.

Optional capabilities are separate protocols (as dstack's ``ComputeWith...`` mixins):
``StartsNodes`` (start a STOPPED node), ``QueuesNodes`` (queued resources, ``up --queued``),
``ListsOperations`` (the operations on one node, whoever asked for them: the evidence that dates a
self-delete, ``tpuops.billing.observer``) and, in ``commands``, ``RunsCommands`` (run a program on a node's
worker, ``exec``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from tpuops.core.errors import Timeout, UsageError
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
        """Every node in ``zone`` (all pages), as the provider sees it now: it may lag behind creates and deletes.

        Args:
            zone: a zone the provider's rules accept (``check_zone``).

        Returns:
            The nodes, in no promised order; an empty list for a zone without nodes.

        Raises:
            TransientError: the listing failed for now (retried inside first); the caller takes it as no evidence.
            Unreachable: nothing answered at the provider's endpoint.
            PermissionDenied: the credentials may not list the project's nodes.
        """
        ...

    def find_node(self, zone: str, name: str) -> NodeInfo | None:
        """The node ``name`` of ``zone``.

        Returns:
            The node, or None when it does not exist (never ``NotFound``).

        Raises:
            TransientError, Unreachable, PermissionDenied: as ``list_nodes``.
        """
        ...

    def create_node(self, zone: str, request: NodeRequest) -> Operation:
        """Start creating ``request`` in ``zone``.

        Returns:
            The create's operation: done at once or later (``wait_for`` waits on it); its error, if it fails
            later, is in the same taxonomy.

        Raises:
            AlreadyExists: the name is taken in ``zone``; nothing is created.
            CapacityError: a stockout (it may surface here or as the operation's error).
            QuotaError, PermissionDenied, InvalidRequest: the request can never succeed as asked.
            TransientError, Unreachable: the request may not have arrived; asking again is safe (``AlreadyExists``
                then says it did).
        """
        ...

    def delete_node(self, zone: str, name: str) -> Operation | None:
        """Start deleting node ``name`` of ``zone``; a delete is idempotent.

        Returns:
            The delete's operation, or None when the node does not exist (success, not an error).

        Raises:
            TransientError, Unreachable, PermissionDenied: as ``list_nodes``; the node may still be there.
        """
        ...

    def operation(self, zone: str, name: str) -> Operation:
        """Where the operation called ``name`` stands now (one call; never blocks).

        Raises:
            NotFound: the provider does not know (or no longer remembers) the operation.
            TransientError, Unreachable: as ``list_nodes``.
        """
        ...


@runtime_checkable
class StartsNodes(Protocol):
    """A provider whose nodes can be STOPPED, and started again."""

    def start_node(self, zone: str, name: str) -> Operation:
        """Start a STOPPED node.

        Returns:
            The start's operation.

        Raises:
            NotFound: no such node.
            TransientError, Unreachable, PermissionDenied: as ``NodeProvider.list_nodes``.
        """
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
        """Queue one node; it waits out a stockout until ``valid_until_s`` instead of failing.

        Raises:
            AlreadyExists: ``qr_id`` is taken in the zone.
            QuotaError, PermissionDenied, InvalidRequest, TransientError, Unreachable: as ``create_node``.
        """
        ...

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedInfo:
        """The queued resource ``qr_id`` as it stands now.

        Raises:
            NotFound: no such queued resource.
            TransientError, Unreachable, PermissionDenied: as ``NodeProvider.list_nodes``.
        """
        ...

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool = False) -> Operation | None:
        """Start deleting (``force`` also deletes its nodes); idempotent.

        Returns:
            The delete's operation, or None when the queued resource does not exist.

        Raises:
            TransientError, Unreachable, PermissionDenied: as ``NodeProvider.list_nodes``.
        """
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


class InProcessWorld:
    """The base of a provider whose nodes live in this process (``memory``, ``simulated``): it needs no emulator
    and has no wire format, so what its ``create_node`` takes (a dry run shows it) is the request's own fields.
    Its rules and offers it names itself (the in-process worlds take Cloud TPU's: ``cloud_tpu.offers``)."""

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
