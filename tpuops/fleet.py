"""The Fleet: the one node engine over a node provider, and the only holder of one.

It creates, adopts, observes and deletes TPU VMs for ``up``, ``down``, ``status``, the reconcile
controller and the sweeps' endgame, through a ``NodeProvider`` (``tpuops.providers``), and dates
in the ledger when each node started and stopped costing. Nobody else calls a provider.

Invariants:
- Validation happens in ``plan_up`` (``tpuops.launch.provision``) before any API call.
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
  deleted itself, at the self-delete its run's status dates, within the sightings (``_ended_at``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple, cast

from tpuops.billing.ledger import Ledger, NodeRecord, Sighting
from tpuops.config import Settings
from tpuops.core import naming
from tpuops.core.clock import UTC, Clock, system_clock, utc_now
from tpuops.core.errors import AlreadyExists, CapacityError, Interrupted, NotFound, Timeout, TpuopsError, UsageError
from tpuops.core.kinds import ValueEnum
from tpuops.core.naming import MetadataKey
from tpuops.core.retry import call_with_retry
from tpuops.providers.base import NodeProvider, QueuesNodes, StartsNodes, require_queues, wait_for
from tpuops.providers.nodes import NodeInfo, NodeRequest, NodeState, Operation

Progress = Callable[[str], None]
SelfDeletes = Callable[[str], datetime | None]
"""When the node of a run (by id) asked for its own delete, as the run says (``runs.self_deleted_at``); None: not."""
Listing = dict[str, dict[str, NodeInfo]]
"""Nodes by zone, then by name, as one pass of ListNodes saw them."""


class _Sighted(NamedTuple):
    """The last sighting of a node: which incarnation, in which state, when, and how long after the one before."""

    uid: str
    state: NodeState | None
    at: datetime
    gap: timedelta | None = None


_PACES = 1
"""How many former gaps between sightings a change may be dated before its sighting (``_changed_at``)."""

_NEVER = _Sighted("", None, datetime.min.replace(tzinfo=UTC))


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class UpPlan:
    """A validated node request, the zones to try in order, and its startup script."""

    request: NodeRequest
    zones: list[str]

    @property
    def startup_script(self) -> str:
        return self.request.metadata[MetadataKey.STARTUP_SCRIPT.value]


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
    """Drives the nodes of one configured project through its provider, dating their cost in the ledger."""

    def __init__(self, provider: NodeProvider, settings: Settings, ledger: Ledger,
                 progress: Progress = _quiet, *, clock: Clock = system_clock,
                 self_deletes: SelfDeletes | None = None) -> None:
        self.provider = provider
        self.self_deletes = self_deletes
        """Where a node that deleted itself says when (``_ended_at``); the controller gives it its store's."""
        self.clock = clock
        """What dates the ledger's transitions: wall time, or a simulation's virtual clock (``tpuops.core.clock``)."""
        self.settings = settings
        self.ledger = ledger
        self.progress = progress
        self._last_seen: dict[tuple[str, str], _Sighted] = {}  # by (zone, name): the last sighting
        self._creating: dict[tuple[str, str], str] = {}  # by (zone, name): our create operation's name, until READY

    # -- observation -------------------------------------------------------------------------

    def observe(self, *nodes: NodeInfo, at: datetime | None = None, asked: datetime | None = None) -> None:
        """Append what we saw of our nodes ``at`` (default: now) to the ledger (one transaction).

        A node seen again in the state this engine last recorded for it is skipped: the ledger
        keeps transitions only, so a listing of unchanged nodes costs no ledger work. A change
        is stamped at the time it most likely happened (``_ready_at``, ``_changed_at``), not when
        it was seen. ``asked``: when the call that saw them went out. What an answer shows held
        at some moment between the call and its arrival, so a change first seen happened before
        ``at``, and one not yet seen happened after ``asked``, which is what the sighting keeps
        for the next change: kept as ``at``, a slow answer (a loaded machine, a slow API) made
        READY start up to its latency late.
        """
        now = at or utc_now(self.clock)
        stamp = min(asked, now) if asked is not None else now
        last = self._last_seen
        fresh = [n for n in nodes if n.managed and last.get((n.zone, n.name), _NEVER)[:2] != (n.uid, n.state)]
        if fresh:
            sightings = [
                Sighting(project=n.project, zone=n.zone, name=n.name, accelerator=n.accelerator,
                         capacity=n.capacity.value, state=n.state.value, uid=n.uid or None,
                         run_id=n.labels.get(naming.RUN_KEY), sweep_id=n.labels.get(naming.SWEEP_KEY),
                         created_at=n.create_time, at=self._at(n, now, stamp))
                for n in fresh]
            self.ledger.observe_nodes(sightings)
        for n in nodes:
            if n.managed:
                before = last.get((n.zone, n.name))
                last[(n.zone, n.name)] = _Sighted(n.uid, n.state, stamp, None if before is None else stamp - before.at)

    def _at(self, node: NodeInfo, seen: datetime, first: datetime) -> datetime:
        """When the state a node is first seen in at ``seen`` began (``first``: when the call that saw it went out)."""
        if node.state is NodeState.READY:
            return self._ready_at(node, seen)
        if node.state not in (NodeState.CREATING, NodeState.UNSPECIFIED):  # past READY: was it READY unseen?
            self._ready_unseen(node.zone, node.name, seen)
        if node.state is NodeState.DELETING:
            return self._ended_at(node.zone, node.name, node.labels.get(naming.RUN_KEY), node.create_time, seen, first,
                                  uid=node.uid or None)
        return self._changed_at(node.zone, node.name, seen, first=first)

    def _ended_at(self, zone: str, name: str, run_id: str | None, created: datetime | None, seen: datetime,
                  first: datetime | None = None, *, uid: str | None = None) -> datetime:
        """When a node first seen DELETING or gone at ``seen`` stopped costing: its self-delete, else ``_changed_at``.

        A node whose job ended deletes itself (the dead-man's switch), and Cloud TPU bills it until
        that delete starts. Jobs of one length end at one phase of the controller's pace, so the
        middle of the gap is not off as often early as late there: a 1,000-trial sweep ended them
        ~58 s early on average, 1.3 % of its spend under billing truth. The run's status dates the
        self-delete (``self_deletes``): when it is of this incarnation (not before its create), the
        end is dated there, kept within the gap between the last sighting of the node as it was and
        this one (a clock that is off, or a kept node deleted later, cannot move it out). A process
        that never saw the node before (``status``, ``down``, the dashboard) keeps it after the last
        transition the ledger holds of the incarnation (``uid``) instead: the node was in that state
        from then on, so it cannot have ended before.
        """
        guess = self._changed_at(zone, name, seen, first)
        if run_id is None or self.self_deletes is None:
            return guess
        last = self._last_seen.get((zone, name))
        since = last.at if last is not None else self._last_change(zone, name, uid)
        if since is None or since >= seen:
            return guess
        asked = self.self_deletes(run_id)
        if asked is None or (created is not None and asked < created):
            return guess
        return min(max(asked, since), seen)

    def _last_change(self, zone: str, name: str, uid: str | None) -> datetime | None:
        """When the ledger's last transition of the incarnation happened; None when it holds none."""
        changes = self.ledger.transitions(self.settings.project, zone, name, uid=uid)
        return changes[-1].at if changes else None

    def _changed_at(self, zone: str, name: str, seen: datetime, first: datetime | None = None) -> datetime:
        """When a change first seen at ``seen`` most likely happened: within the gap since the last sighting.

        Cloud TPU bills a node while it is READY, but a node carries no time of its last state
        change, and nothing in the API dates a preemption or a delete made from inside the VM:
        all we know is that the change happened after the last sighting of the node as it was
        (or after we asked for it, ``create``) and before this one. Dated at the sighting, it is
        always late: READY time then ended one pass late after each preemption, and the ledger
        billed 2.5-3.8 % more than Cloud TPU under churn. So it is dated in the middle of the
        gap, but no further back than ``_PACES`` former look (the gap between the two
        sightings before). For an observer that looks at a steady pace (the controller's
        passes) that is the middle, off by at most half a pass and as often early as late; a
        gap longer than twice the pace before it may mean that nobody was looking (``up``, then
        nothing until ``status``), and the middle of it could bill far less than Cloud TPU did,
        so the date stays within one pace of the sighting, on the safe side. With no earlier
        sighting (a new process), the sighting's time it is (``first``: when the call that saw it went out).
        """
        last = self._last_seen.get((zone, name))
        if last is None:
            return first or seen
        if last.at >= seen:
            return seen
        back = (seen - last.at) / 2
        return seen - (back if last.gap is None else min(back, _PACES * last.gap))

    def _ready_at(self, node: NodeInfo, seen: datetime) -> datetime:
        """When a node first seen READY at ``seen`` became READY: its create operation's end, else ``_changed_at``.

        A create operation is done when its node is READY, and says when (its endTime): one
        GetOperation, once per node this engine created or was told of (``expect``), dates the
        start of billing exactly.
        """
        return self._created_ready(node.zone, node.name, seen) or self._changed_at(node.zone, node.name, seen)

    def _created_ready(self, zone: str, name: str, seen: datetime) -> datetime | None:
        """When the node this engine asked for (or was told of, ``expect``) and never saw READY became READY, as its
        create operation's end says (one GetOperation, once); None: nothing to ask, or the create did not succeed.

        It is kept within the gap since the last sighting (for a node this engine never saw, since the operation
        started) and ``seen``, as a clock that is off cannot move it out.
        """
        operation = self._creating.pop((zone, name), None)
        if operation is None:
            return None
        try:
            done = self.provider.operation(zone, operation)
        except TpuopsError:
            return None
        last = self._last_seen.get((zone, name))
        since = last.at if last is not None else done.started
        if done.ended is None or done.error is not None or since is None:
            return None
        return min(max(done.ended, since), seen)

    def _ready_unseen(self, zone: str, name: str, seen: datetime) -> None:
        """A node found gone or deleted at ``seen`` that this engine created but never saw READY lived between two
        looks (created, trained and deleted itself between two passes): its create operation dates its READY,
        which goes to the ledger and stands as its last sighting, so that its end is dated after it (``_ended_at``)
        and it is billed in between. Nothing when it was never READY (the create failed) or nothing says when."""
        ready = self._created_ready(zone, name, seen)
        if ready is None:
            return
        with contextlib.suppress(NotFound):
            self.ledger.observe(self.settings.project, zone, name, NodeState.READY, ready)
        self._last_seen[(zone, name)] = _Sighted("", NodeState.READY, ready)

    def expect(self, zone: str, name: str, operation: str) -> None:
        """The node's create operation, started elsewhere (another process, a pass that died), for ``_ready_at``.

        Without it a node that this engine first sees READY is dated at that sighting, up to a
        pass late. A node this engine created or has seen already is left as it is.
        """
        if (zone, name) not in self._last_seen:
            self._creating.setdefault((zone, name), operation)

    def _gone(self, zone: str, name: str, at: datetime | None = None, record: NodeRecord | None = None) -> None:
        """Close the node's ledger incarnation (``record``, else its open one): at ``at`` when known, else when it
        went (``_ended_at``: a node that deleted itself, where its run says). Its open incarnation is read only
        when that evidence is to be asked for; ``mark_deleted`` finds it by name either way. A node this engine
        created and never saw READY is first given its READY (``_ready_unseen``), so that what it billed is known."""
        self._ready_unseen(zone, name, at or utc_now(self.clock))
        if at is None and record is None and self.self_deletes is not None:
            record = next(iter(self.ledger.nodes(self.settings.project, zone, name=name, open_only=True)), None)
        stamp = at or self._ended_at(zone, name, record.run_id if record else None,
                                     record.created_at if record else None, utc_now(self.clock),
                                     uid=record.uid if record else None)
        self._last_seen.pop((zone, name), None)
        self._creating.pop((zone, name), None)
        self.ledger.mark_deleted(self.settings.project, zone, name, at=stamp)

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
            self._gone(zone, name)
            return False
        self._ready_unseen(zone, name, asked)
        with contextlib.suppress(NotFound):
            self.ledger.observe(self.settings.project, zone, name, NodeState.DELETING,
                                min(max(operation.started or answered, asked), answered))
        if not wait:
            return True
        ended = None
        with contextlib.suppress(NotFound):
            ended = wait_for(self.provider, operation, timeout_s=timeout_s or self.settings.operation_timeout_s,
                         on_poll=on_poll, closely=closely).ended
        self._gone(zone, name, ended)
        return True

    def find(self, zone: str, name: str) -> NodeInfo | None:
        """The node called ``name`` in ``zone``, or None (one GetNode); what is seen goes to the ledger."""
        asked = utc_now(self.clock)
        node = self.provider.find_node(zone, name)
        if node is not None:
            self.observe(node, asked=asked)
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
        zones = list(self.settings.zones)
        for record in self.ledger.nodes(self.settings.project, open_only=True):
            if record.zone not in zones:
                zones.append(record.zone)
        return zones

    def list_zones(self, zones: Iterable[str], on_listed: Callable[[str, dict[str, NodeInfo]], None] | None = None,
                   ) -> tuple[Listing, dict[str, TpuopsError]]:
        """One ListNodes per zone and page, zones in parallel: the nodes by zone and name, and the zones that failed.

        What was seen goes to the ledger, and the open ledger intervals of nodes that a listed
        zone no longer shows are closed: they stopped costing (their dead-man's switch, a
        preemption that made them vanish). A zone whose listing failed is no evidence either way.
        Each zone is taken in as soon as its listing is in, and then handed to ``on_listed`` (in the
        caller's thread), while the others may still be retrying: what can be done in one zone
        (deleting a finished run's node) never waits for another zone's failing API.
        """
        zones = list(dict.fromkeys(zones))
        asked = utc_now(self.clock)
        listed: Listing = {}
        failed: dict[str, TpuopsError] = {}
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(zones)))) as pool:
            futures = {pool.submit(self.provider.list_nodes, zone): zone for zone in zones}
            for future in as_completed(futures):
                zone = futures[future]
                try:
                    found = future.result()
                except TpuopsError as err:
                    failed[zone] = err
                    continue
                nodes = listed[zone] = {n.name: n for n in found}
                self.observe(*nodes.values(), asked=asked)
                for record in self.ledger.nodes(self.settings.project, zone, open_only=True):
                    if record.name not in nodes:
                        self._gone(zone, record.name, record=record)
                if on_listed is not None:
                    on_listed(zone, nodes)
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

    def up(self, plan: UpPlan, *, wait: bool = True) -> UpResult:
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

    def up_queued(self, plan: UpPlan, *, valid_for_s: float | None, wait: bool = True) -> UpResult:
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
            self._record(zone, request)
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

    def _record(self, zone: str, request: NodeRequest) -> None:
        self.ledger.record_node(self.settings.project, zone, request.name, request.accelerator,
                                request.capacity.value, run_id=request.labels.get(naming.RUN_KEY),
                                sweep_id=request.labels.get(naming.SWEEP_KEY), at=utc_now(self.clock))

    def create(self, zone: str, request: NodeRequest) -> Operation:
        """Ask for the node in ``zone`` and record it in the ledger at once; returns the operation.

        The ledger has the node before anyone waits on it, so a process killed now leaves a
        record. ``AlreadyExists`` when the name is taken there. The time of the request bounds
        when the new node can have become READY (``_changed_at``).
        """
        asked = utc_now(self.clock)
        operation = self.provider.create_node(zone, request)
        self._record(zone, request)
        self._last_seen[(zone, request.name)] = _Sighted("", None, asked)
        self._creating[(zone, request.name)] = operation.name
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
        self.observe(node)
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
            self.observe(node)
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
