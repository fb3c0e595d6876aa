"""The Fleet: the one node engine over a node provider, and the only holder of one.

It creates, adopts, observes and deletes TPU VMs for ``up``, ``down``, ``status``, the reconcile
controller and the sweeps' endgame, through a ``NodeProvider`` (``tpuops.providers``). Nobody
else calls a provider. What it sees and does it reports to its billing observer
(``tpuops.billing.observer.BillingObserver``, ``Fleet.billing``), which dates in the ledger when
each node started and stopped costing: the engine acts, the observer dates.

Invariants:
- Validation happens in the node-request builder (``tpuops.launch.provision``) before any API call.
- ``up`` is idempotent: an existing node of ours with the same spec is adopted (waited
  for, started, or replaced when preempted), never duplicated, whichever configured zone it
  is in. A failed or interrupted ``up`` deletes what it created: no orphan.
- ``down`` of a missing node is success. ``status`` costs one ListNodes per zone and page.
- One node engine: the reconcile controller creates through ``create`` and observes through
  ``list_zones`` too, so creating-and-recording, listing-and-closing-intervals and the failure
  classes exist once. A create whose operation ends UNAVAILABLE, INTERNAL or DEADLINE_EXCEEDED
  is transient here as in the controller: asked again (the one retry policy) after cleaning up.
- Every node we create is recorded in the ledger before we wait on it, so a killed
  process leaves a record; every observed state is appended there, and every delete (a
  promotion's too) is dated there at the start of the provider's delete operation; a node that
  deleted itself, at the start of the delete its VM asked for, within the sightings (the observer's),
  never at its run's end.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Protocol, cast

from tpuops.billing.ledger import Ledger
from tpuops.billing.observer import BillingObserver
from tpuops.config import Settings
from tpuops.core.clock import Clock, system_clock, utc_now
from tpuops.core.errors import (
    AlreadyExists,
    CapacityError,
    Interrupted,
    NotFound,
    Timeout,
    TpuopsError,
    TransientError,
    UsageError,
)
from tpuops.core.guards import Guard
from tpuops.core.kinds import ValueEnum
from tpuops.core.retry import call_with_retry
from tpuops.providers.base import ListsOperations, NodeProvider, QueuesNodes, StartsNodes, require_queues, wait_for
from tpuops.providers.nodes import NodeInfo, NodeRequest, NodeState, Operation

Progress = Callable[[str], None]
Listing = dict[str, dict[str, NodeInfo]]
"""Nodes by zone, then by name, as one pass of ListNodes saw them."""

WRITE_AHEAD = Guard("fleet.write_ahead", "the ledger has a node from its create on, dated by the create's operation")


def _quiet(_: str) -> None:
    return None


class Planned(Protocol):
    """What ``up`` makes real: a validated node request and the zones to try in order. The one builder of them is
    ``tpuops.launch.provision`` (``UpPlan``), which stands below the engine's callers, not below the engine."""

    @property
    def request(self) -> NodeRequest: ...

    @property
    def zones(self) -> list[str]: ...


@dataclass
class UpResult:
    node: NodeInfo
    adopted: bool
    stockouts: list[str] = field(default_factory=list)


class Deleted(ValueEnum):
    """What ``down`` did with one node."""

    DELETED = "deleted"
    NOT_FOUND = "not found"
    REQUESTED = "requested"  # --no-wait: deletion asked for, not waited on
    STOPPED = "run stopped"  # the node's run was stopped (``api.stop``), which deleted the node


@dataclass(frozen=True)
class DownResult:
    name: str
    zone: str | None
    outcome: Deleted


class Fleet:
    """Drives the nodes of one configured project through its provider; its ``billing`` dates their cost."""

    def __init__(self, provider: NodeProvider, settings: Settings, ledger: Ledger,
                 progress: Progress = _quiet, *, clock: Clock = system_clock, threads: bool = True) -> None:
        """``threads=False``: list zones one after another in this thread (a simulation's cloud answers at once,
        so workers would only cost CPU time and make the order zones are taken in vary)."""
        self.provider = provider
        self.threads = threads
        self.clock = clock
        self.settings = settings
        self.progress = progress
        self.billing = BillingObserver(ledger, settings.project, self.operation, clock=clock,
                                       node_operations=provider.node_operations
                                       if isinstance(provider, ListsOperations) else None,
                                       find_node=provider.find_node)
        """What this engine sees and does, dated into the ledger (``tpuops.billing.observer``): READY, ends,
        self-deletes (dated by the delete operation the node's VM asked for, where the provider lists them)."""

    def delete(self, zone: str, name: str, *, wait: bool = False, on_poll: Callable[[], None] | None = None,
               timeout_s: float | None = None, closely: bool = False) -> bool:
        """Delete the node; False when it did not exist. With ``wait``, return once it is gone.

        Billing stops when the delete starts, which the delete operation dates (its
        createTime): the ledger ends the node's READY time there, kept within the local time
        of the request and its answer (a clock off between us and the API moves nothing). The
        controller waits ``closely`` to create a replacement under the same name at once;
        ``on_poll`` runs between polls, and what it raises ends the wait.
        """
        asked = utc_now(self.clock)
        operation = self.provider.delete_node(zone, name)
        answered = utc_now(self.clock)
        if operation is None:
            self.billing.gone(zone, name)
            return False
        self.billing.deleting(zone, name, operation, asked, answered)
        if not wait:
            return True
        ended = None
        with contextlib.suppress(NotFound):
            ended = wait_for(self.provider, operation, timeout_s=timeout_s or self.settings.operation_timeout_s,
                         on_poll=on_poll, closely=closely).ended
        self.billing.gone(zone, name, ended)
        return True

    def find(self, zone: str, name: str) -> NodeInfo | None:
        """The node called ``name`` in ``zone``, or None (one GetNode); what is seen goes to the ledger."""
        asked = utc_now(self.clock)
        node = self.provider.find_node(zone, name)
        if node is not None:
            self.billing.observe(node, asked=asked)
        return node

    def operation(self, zone: str, name: str) -> Operation:
        """Where one of our operations stands (one GetOperation); ``NotFound`` once the provider forgot it."""
        return self.provider.operation(zone, name)

    def _get(self, zone: str, name: str) -> NodeInfo:
        node = self.provider.find_node(zone, name)
        if node is None:
            raise NotFound(f"node {name} not found in {zone}")
        return node

    def _watch(self, zone: str, name: str) -> Callable[[], None]:
        def poll() -> None:
            node = self.find(zone, name)
            state = node.state.value if node else NodeState.GONE.value
            self.progress(f"{name} in {zone}: {state}")

        return poll

    def zones_in_view(self) -> list[str]:
        """Configured zones plus any zone where the ledger says one of our nodes may live."""
        return list(dict.fromkeys([*self.settings.zones, *self.billing.zones_of_open_nodes()]))

    def list_zones(self, zones: Iterable[str], on_listed: Callable[[str, dict[str, NodeInfo]], None] | None = None,
                   ) -> tuple[Listing, dict[str, TpuopsError]]:
        """One ListNodes per zone and page, zones in parallel: the nodes by zone and name, and the zones that failed.

        What was seen goes to the billing observer (``BillingObserver.listed``), which also closes what a listed
        zone no longer shows. A zone whose listing failed is no evidence either way.
        Each zone is taken in as soon as its listing is in, and then handed to ``on_listed`` (in the
        caller's thread), while the others may still be retrying: what can be done in one zone
        (deleting a finished run's node) never waits for another zone's failing API.
        """
        zones = list(dict.fromkeys(zones))
        asked = utc_now(self.clock)
        listed: Listing = {}
        failed: dict[str, TpuopsError] = {}

        def take(zone: str, listing: Callable[[], list[NodeInfo]]) -> None:
            try:
                found = listing()
            except TpuopsError as err:
                failed[zone] = err
                self.billing.unlisted(zone, asked)  # no evidence, but a look: the pace a preemption is dated by
                return
            nodes = listed[zone] = {n.name: n for n in found}
            self.billing.listed(zone, nodes, asked)
            if on_listed is not None:
                on_listed(zone, nodes)

        if not self.threads or len(zones) <= 1:
            for zone in zones:
                take(zone, lambda zone=zone: self.provider.list_nodes(zone))
        else:
            with ThreadPoolExecutor(max_workers=min(8, len(zones))) as pool:
                futures = {pool.submit(self.provider.list_nodes, zone): zone for zone in zones}
                for future in as_completed(futures):
                    take(futures[future], future.result)
        return ({zone: listed[zone] for zone in zones if zone in listed},
                {zone: failed[zone] for zone in zones if zone in failed})

    def status(self) -> list[NodeInfo]:
        """Every node in the zones in view: one ListNodes per zone and page, in parallel."""
        listed, failed = self.list_zones(self.zones_in_view())
        if failed:
            raise next(iter(failed.values()))
        return sorted((n for nodes in listed.values() for n in nodes.values()), key=lambda n: (n.zone, n.name))

    def locate(self, name: str, zones: Iterable[str] | None = None) -> list[NodeInfo]:
        """The nodes called ``name`` in ``zones`` (default: every zone in view)."""
        found = []
        for zone in zones or self.zones_in_view():
            node = self.find(zone, name)
            if node is not None:
                found.append(node)
        return found

    # -- up ------------------------------------------------------------------------------------

    def up(self, plan: Planned, *, wait: bool = True) -> UpResult:
        """Make the planned node exist (READY unless ``wait`` is False); adopt, never duplicate."""
        request = plan.request
        for existing in self.locate(request.name, plan.zones):
            adopted = self._adopt(existing, request, wait=wait)
            if adopted is not None:
                return UpResult(node=adopted, adopted=True)
        stockouts: list[str] = []
        for zone in plan.zones:
            try:
                node = call_with_retry(lambda zone=zone: self._create_in(zone, request, wait=wait),
                                       deadline_s=self.settings.api_deadline_s, on_retry=self._retrying(zone))
            except CapacityError:
                stockouts.append(zone)
                self.progress(f"no capacity for {request.accelerator} ({request.capacity.value}) in {zone}")
                continue
            if node is None:
                existing = self._get(zone, request.name)
                adopted = self._adopt(existing, request, wait=wait)
                if adopted is None:
                    return self.up(plan, wait=wait)
                return UpResult(node=adopted, adopted=True, stockouts=stockouts)
            return UpResult(node=node, adopted=False, stockouts=stockouts)
        raise CapacityError(
            f"no capacity for {request.accelerator} ({request.capacity.value}) in any configured zone "
            f"({', '.join(stockouts)}); try again later, add zones to tpuops.toml or use another accelerator")

    def up_queued(self, plan: Planned, *, valid_for_s: float | None, wait: bool = True) -> UpResult:
        """Ask for the node through a queued resource (named like the node) in the first zone.

        The request waits in the queue through a stockout instead of failing, until
        ``valid_for_s`` runs out; a FAILED or SUSPENDED request is deleted and asked again.
        """
        request, zone = plan.request, plan.zones[0]
        require_queues(type(self.provider))
        queues = cast(QueuesNodes, self.provider)
        for existing in self.locate(request.name, [zone]):
            adopted = self._adopt(existing, request, wait=wait)
            if adopted is not None:
                return UpResult(node=adopted, adopted=True)
        try:
            queued = queues.get_queued_resource(zone, request.name)
        except NotFound:
            queued = None
        if queued is not None and queued.state in ("FAILED", "SUSPENDED"):
            self.progress(f"queued resource {request.name} is {queued.state}: asking again")
            self._await(zone, request.name, queues.delete_queued_resource(zone, request.name, force=True))
            queued = None
        if queued is None:
            self.progress(f"queueing {request.name} ({request.accelerator}, {request.capacity.value}) in {zone}")
            operation = queues.create_queued_resource(zone, request.name, request, valid_until_s=valid_for_s)
            self._await(zone, request.name, operation)
            self.billing.recorded(zone, request)
        if not wait:
            return UpResult(node=self._placeholder(zone, request), adopted=queued is not None)
        deadline = time.monotonic() + self.settings.operation_timeout_s + (valid_for_s or 0)
        while True:
            node = self.find(zone, request.name)
            state = queues.get_queued_resource(zone, request.name).state
            self.progress(f"{request.name} in {zone}: queued {state}, node {node.state.value if node else 'none yet'}")
            if node is not None and node.state is NodeState.READY:
                return UpResult(node=node, adopted=queued is not None)
            if state in ("FAILED", "SUSPENDED"):
                raise CapacityError(f"queued resource {request.name} in {zone} is {state}; nothing was left running")
            if time.monotonic() >= deadline:
                self._await(zone, request.name, queues.delete_queued_resource(zone, request.name, force=True))
                raise Timeout(f"{request.name} was not provisioned in time; its queued resource was deleted")
            time.sleep(self.provider.poll_interval_s)

    @staticmethod
    def _placeholder(zone: str, request: NodeRequest) -> NodeInfo:
        """What ``--no-wait`` reports for a node that the queue has not made yet."""
        return NodeInfo(name=request.name, zone=zone, project="", accelerator=request.accelerator,
                        runtime=request.runtime, capacity=request.capacity, state=NodeState.UNSPECIFIED,
                        health="", labels=dict(request.labels), create_time=None)

    def _adopt(self, node: NodeInfo, request: NodeRequest, *, wait: bool) -> NodeInfo | None:
        """Take over an existing node; None when it was dead and has been deleted for recreation."""
        if not request.matches(node):
            why = ("was not created by tpuops" if not node.managed else
                   f"is {node.accelerator} {node.capacity.value} on {node.runtime}, not "
                   f"{request.accelerator} {request.capacity.value} on {request.runtime}")
            raise UsageError(f"node {node.name!r} exists in {node.zone} and {why}: "  # the user's request, exit 2
                             f"choose another name or delete it first ('tpuops down {node.name}')")
        if node.state.is_dead or node.state is NodeState.DELETING:
            self.progress(f"{node.name} in {node.zone} is {node.state.value}: deleting it to recreate")
            self._delete_and_wait(node.zone, node.name)
            return None
        self.progress(f"{node.name} exists in {node.zone} ({node.state.value}): adopting it")
        if node.state in (NodeState.STOPPED, NodeState.STOPPING) and wait:
            if not isinstance(self.provider, StartsNodes):
                raise AlreadyExists(f"node {node.name!r} in {node.zone} is {node.state.value} and this provider "
                                    f"cannot start it: delete it first ('tpuops down {node.name}')")
            self._wait_state(node.zone, node.name, {NodeState.STOPPED})
            self._await(node.zone, node.name, self.provider.start_node(node.zone, node.name))
        if not wait:
            return node
        return self._wait_state(node.zone, node.name, {NodeState.READY})

    def create(self, zone: str, request: NodeRequest) -> Operation:
        """Ask for the node in ``zone`` and record it in the ledger at once; returns the operation.

        The ledger has the node before anyone waits on it, so a process killed now leaves a
        record. ``AlreadyExists`` when the name is taken there. The time of the request bounds
        when the new node can have become READY (``_changed_at``). A create whose answer was lost (a
        transient error) may have gone through: the node is recorded all the same, so that the zone is
        listed and what it bills is seen (a listing without it closes the record with nothing billed);
        unrecorded, a node in a zone the ledger held nothing in billed unseen (the swarm's seed 178).
        """
        asked = utc_now(self.clock)
        try:
            operation = self.provider.create_node(zone, request)
        except TransientError:
            if WRITE_AHEAD.on:
                self.billing.recorded(zone, request)
            raise
        if WRITE_AHEAD.on:
            self.billing.created(zone, request, operation.name, asked)
        return operation

    def _retrying(self, zone: str) -> Callable[[BaseException, float], None]:
        def say(err: BaseException, wait_s: float) -> None:
            self.progress(f"the create in {zone} failed transiently ({err}); asking again in {wait_s:.0f} s")

        return say

    def _create_in(self, zone: str, request: NodeRequest, *, wait: bool) -> NodeInfo | None:
        """Create in one zone; None if the name turned out to exist there already."""
        self.progress(f"creating {request.name} ({request.accelerator}, {request.capacity.value}) in {zone}")
        try:
            operation = self.create(zone, request)
        except AlreadyExists:
            return None
        if not wait:
            return self._get(zone, request.name)
        try:
            self._await(zone, request.name, operation)
        except CapacityError:
            self._cleanup(zone, request.name)
            raise
        except KeyboardInterrupt:
            self._cleanup(zone, request.name, wait=False)
            raise Interrupted(f"interrupted: deletion of {request.name} in {zone} requested") from None
        except TpuopsError:
            self._cleanup(zone, request.name)
            raise
        node = self._get(zone, request.name)
        self.billing.observe(node)
        return node

    def _await(self, zone: str, name: str, operation: Operation | None) -> None:
        if operation is not None:
            wait_for(self.provider, operation, timeout_s=self.settings.operation_timeout_s,
                     on_poll=self._watch(zone, name))

    def _cleanup(self, zone: str, name: str, *, wait: bool = True) -> None:
        """Delete what a failed create may have left, so that no orphan is billed."""
        node = self.provider.find_node(zone, name)
        if node is None or not node.managed:
            return
        self.progress(f"cleaning up {name} in {zone}")
        if wait:
            self._delete_and_wait(zone, name)
        else:
            self.delete(zone, name)

    def _wait_state(self, zone: str, name: str, wanted: set[NodeState]) -> NodeInfo:
        """Poll GetNode until the node reaches one of ``wanted``; a dead node ends the wait."""
        deadline = time.monotonic() + self.settings.operation_timeout_s
        while True:
            node = self._get(zone, name)
            self.billing.observe(node)
            self.progress(f"{name} in {zone}: {node.state.value}")
            if node.state in wanted:
                return node
            if node.state.is_dead:
                raise TpuopsError(f"node {name} in {zone} became {node.state.value} while we waited")
            if time.monotonic() >= deadline:
                raise Timeout(f"node {name} in {zone} is still {node.state.value} after "
                              f"{self.settings.operation_timeout_s:.0f} s")
            time.sleep(self.provider.poll_interval_s)

    # -- down ----------------------------------------------------------------------------------

    def _delete_queued(self, zone: str, name: str) -> None:
        """A node asked for with ``--queued`` leaves its request behind: delete it too."""
        if isinstance(self.provider, QueuesNodes):
            with contextlib.suppress(NotFound):
                self._await(zone, name, self.provider.delete_queued_resource(zone, name, force=True))

    def _delete_and_wait(self, zone: str, name: str) -> bool:
        return self.delete(zone, name, wait=True, on_poll=self._watch(zone, name))

    def down(self, names: list[str] | None, *, wait: bool = True) -> list[DownResult]:
        """Delete the named nodes (``None``: every node of ours in view), concurrently. The names were checked by
        the caller (``api.down``, before the ledger or the API was touched)."""
        if names is None:
            targets = [(n.zone, n.name) for n in self.status() if n.managed]
        else:
            targets = [(n.zone, n.name) for name in names for n in self.locate(name)]
        results = [DownResult(name, None, Deleted.NOT_FOUND) for name in names or []
                   if name not in {t[1] for t in targets}]
        def delete(target: tuple[str, str]) -> DownResult:
            zone, name = target
            if not wait:
                self.delete(zone, name)
                return DownResult(name, zone, Deleted.REQUESTED)
            deleted = self._delete_and_wait(zone, name)
            self._delete_queued(zone, name)
            return DownResult(name, zone, Deleted.DELETED if deleted else Deleted.NOT_FOUND)

        if targets:
            with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
                results.extend(pool.map(delete, targets))
        return results
