"""The billing observer: when each node of ours started and stopped costing, dated into the ledger.

Cloud TPU bills a node while it is READY, but a node carries no time of its last state change:
what the ledger holds is dated from what the node engine (``tpuops.fleet.Fleet``) saw and did,
which it reports here. ``BillingObserver`` dates READY (a create operation's end, else within the
gap between two sightings), ends (a delete operation's start, a node found gone), and the
self-deletes of nodes whose job ended (the delete operation their VM asked for, ``node_operations``).

Invariants: the ledger keeps transitions only (a node seen again unchanged costs no ledger work);
every node we create is recorded before anyone waits on it; a change is dated within the gap in
which it happened, never outside it, whatever a clock that is off says (READY: between the ask for the
create and the first sighting READY; a sighting short of READY may come from a listing that lags).

Ends, one rule: an incarnation's end is dated once, from evidence that it is gone, never before it, and then stands.
The evidence is its delete operation's start (``node_operations``; kept within the gap between the last sighting of
it as it was and the sighting that found it going), else that sighting itself: seen DELETING, or found gone (a
lookup without it or with another incarnation under its name, our create taking its name). Never its run's end
(guard ``ledger.evidence_end``): a run that ends while the API fails leaves its node READY, and billed, until a
delete gets through; never the middle of the gap either, where it may still have been billing. A listing that leaves
a node out is no finding by itself (listings lag): the node is looked up (``_still_there``), and its end waits for
its delete to be listed (the operations lag too) up to ``EVIDENCE_WAIT_S`` after the first listing that missed it,
then is dated at that listing (at once when our create takes its name). What stands is not undone: a sighting older
than the end (a listing that lags) and a record of the incarnation read before another process closed it change
nothing (guard ``ledger.closed_stays_closed``). ``_ended_at`` applies the rule, ``gone`` and ``_ended_before`` keep
what stands.

May import what the billing wing may: the ledger, ``tpuops.core`` and the provider-neutral node
vocabulary. It calls no provider: an operation's times are asked through ``operations``, the
engine's own lookup, handed in, and so are ``node_operations`` and ``find_node``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import NamedTuple

from tpuops.billing.ledger import CLOSED_STAYS_CLOSED, DELETED, Ledger, NodeRecord, Sighting
from tpuops.core import naming
from tpuops.core.clock import UTC, Clock, system_clock, utc_now
from tpuops.core.errors import NotFound, TpuopsError
from tpuops.core.guards import Guard
from tpuops.providers.nodes import NodeInfo, NodeRequest, NodeState, Operation

EVIDENCE_END = Guard("ledger.evidence_end", "a node's end is dated only from evidence that it is gone (its delete "
                     "operation), never guessed while the node may still have been billed")

NodeOperations = Callable[[str, str], list[Operation]]
"""The operations on one node, by zone and name, whoever asked for them (the provider's ``ListsOperations``)."""
FindsNode = Callable[[str, str], NodeInfo | None]
"""One node as the provider holds it now, by zone and name; None when it has none (the provider's ``find_node``)."""
Operations = Callable[[str, str], Operation]
"""Where one of our operations stands, by zone and operation name (the engine's ``Fleet.operation``)."""


class _Sighted(NamedTuple):
    """The last sighting of a node: which incarnation, in which state, when, and how long after the one before
    (``looked``: False for a READY no listing showed, ``_ready_unseen``)."""

    uid: str
    state: NodeState | None
    at: datetime
    gap: timedelta | None = None
    looked: bool = True


_PACES = 0.5
"""How many former gaps between sightings a change may be dated before its sighting (``_changed_at``)."""

_NEVER = _Sighted("", None, datetime.min.replace(tzinfo=UTC))

EVIDENCE_WAIT_S = 3600.0
"""How long after its last sighting a node absent from listings, whose delete the provider's operations do not show
(yet), stays open in the ledger before it is dated at the sighting that missed it (``_ended_at``)."""

_ENDED = (NodeState.DELETING.value, DELETED)
"""The ledger's states after which an incarnation's end is dated already."""

_BOOTING = (NodeState.CREATING, NodeState.UNSPECIFIED)
"""The states a node is seen in before its first READY."""

_SHORT_OF_READY = (None, NodeState.CREATING.value, NodeState.UNSPECIFIED.value)
"""The ledger's states (None: no transition yet) of an incarnation that has not been READY."""

_AFTER_READY = (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.REPAIRING, NodeState.RESTARTING,
                NodeState.STOPPING, NodeState.STOPPED)
"""The states a node reaches only from READY (a delete, DELETING, also ends a node that never was)."""

_REPAIRS = (NodeState.REPAIRING.value, NodeState.RESTARTING.value)
"""The ledger's states of an incarnation that returns to READY by itself (a host maintenance, a restart)."""

_CLOCKS_APART = timedelta(seconds=5)
"""How far before a node's createTime its create operation's may be (both the API's; they are taken apart)."""


class _Looks(NamedTuple):
    """The looks at one zone (``_paced``): when the last was asked for, the gap before it, how many pairs of two
    consecutive gaps were measured, and the shortest of their longer gaps (``_pace``)."""

    last: datetime
    gap: timedelta | None = None
    pairs: int = 0
    shortest: timedelta | None = None


def _paced(paces: dict[str, _Looks], zone: str, asked: datetime) -> None:
    """Count a look at ``zone`` asked at ``asked`` in ``paces`` (``_pace``)."""
    looks = paces.get(zone, _Looks(asked))
    gap = asked - looks.last if looks.last < asked else None
    pair = max(gap, looks.gap) if gap is not None and looks.gap is not None else None
    shortest = pair if looks.shortest is None or (pair is not None and pair < looks.shortest) else looks.shortest
    paces[zone] = _Looks(max(asked, looks.last), looks.gap if gap is None else gap, looks.pairs + (pair is not None),
                         shortest)


def _pace(paces: dict[str, _Looks], zone: str) -> timedelta | None:
    """The pace of the looks at ``zone`` in ``paces``: the shortest gap between two looks that is no shorter than one
    next to it, so that neither a look that came early nor an outage sets it. A look that came early (a pass
    overrunning into the next: the swarm's clock.early) makes one short gap between two at the pace; taken for the
    pace, it kept every later change away from READY within half of it of its sighting, up to a pass late, for the
    process's life (the swarm's seed 8200: two preemptions dated 220 s and 260 s late, 41 % more READY than the cloud
    billed, after a pass came 270 s early hours before). An outage (looks missed) makes one long gap, the pace only
    while every pair measured holds it: None before two pairs (three gaps), as one pair may hold an outage. Two looks
    that came early in a row set a shorter pace, on the safe side (a change is then dated nearer its sighting)."""
    looks = paces.get(zone)
    return looks.shortest if looks is not None and looks.pairs > 1 else None


def _sighting(node: NodeInfo, state: NodeState, at: datetime) -> Sighting:
    """The ledger's record of ``node`` seen in ``state``, which began ``at``."""
    return Sighting(project=node.project, zone=node.zone, name=node.name, accelerator=node.accelerator,
                    capacity=node.capacity.value, state=state.value, uid=node.uid or None,
                    run_id=naming.run_of(node.labels), sweep_id=node.labels.get(naming.SWEEP_KEY),
                    created_at=node.create_time, at=at)


class BillingObserver:
    """Dates in one project's ledger when its nodes started and stopped costing, from what the engine reports."""

    def __init__(self, ledger: Ledger, project: str, operations: Operations, *, clock: Clock = system_clock,
                 node_operations: NodeOperations | None = None, find_node: FindsNode | None = None) -> None:
        self.ledger = ledger
        self.project = project
        self.operations = operations
        self.clock = clock
        """What dates the ledger's transitions: wall time, or a simulation's virtual clock (``tpuops.core.clock``)."""
        self.node_operations = node_operations
        """Where the delete of a node we did not delete ourselves is found (``_ended_at``); None: the provider
        cannot say, and such an end is dated within the gap between sightings."""
        self.find_node = find_node
        """Where a node a listing no longer shows is looked up before its end is dated (``listed``); None: the
        listing's word is taken."""
        self._last_seen: dict[tuple[str, str], _Sighted] = {}  # by (zone, name): the last sighting
        self._creating: dict[tuple[str, str], tuple[str, datetime | None]] = {}
        """By (zone, name): the create operation to date READY by, until READY, and when we asked for it (None: asked
        elsewhere, ``expect``)."""
        self._missed: dict[tuple[str, str], datetime] = {}  # by (zone, name): the first listing that missed it, open
        self._zone_paces: dict[str, _Looks] = {}
        """By zone: its listings (``_pace``: the pace of a node seen only once since its create, ``_changed_at``; the
        last gap is as long as the outage that kept looks away, and so may be the first: one gap is no pace)."""
        self._zone_looks: dict[str, _Looks] = {}
        """As ``_zone_paces``, counting the listings that failed too (``unlisted``): the pace a change away from READY
        is dated by, on the safe side (the listings that got through are further apart while the API fails)."""
        self._unlisted: set[tuple[str, str]] = set()
        """The (zone, name)s whose last ask for the create the provider lists failed (``_listed_create_end``)."""

    def observe(self, *nodes: NodeInfo, at: datetime | None = None, asked: datetime | None = None) -> None:
        """Append what we saw of our nodes ``at`` (default: now) to the ledger (one transaction).

        A node seen again in the state this observer last recorded for it is skipped: the ledger
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
        stale = {(n.zone, n.name) for n in fresh if self._ended_before(n)}
        if stale:
            nodes = tuple(n for n in nodes if (n.zone, n.name) not in stale)
            fresh = [n for n in fresh if (n.zone, n.name) not in stale]
        if fresh:
            # at: this observer's clock, not the ledger's default (the wall's), dates what the ledger does itself
            # (the name's former incarnation closed by a new uid: in a simulation, years off; the swarm's seed 3320)
            self.ledger.observe_nodes([_sighting(n, n.state, self._at(n, now, stamp)) for n in fresh], at=now)
        for n in nodes:
            if n.managed:
                self._missed.pop((n.zone, n.name), None)
                before = last.get((n.zone, n.name))
                last[(n.zone, n.name)] = _Sighted(n.uid, n.state, stamp, None if before is None else stamp - before.at)

    def _ended_before(self, node: NodeInfo) -> bool:
        """Whether the ledger holds the end of the node's incarnation already, so that this sighting is older than
        that evidence (a listing that lags, a cache): an incarnation that is deleting or gone never comes back, and
        a sighting of it READY again re-opened it in the ledger, which then billed hours the cloud never did (the
        swarm's seeds 6, 103, 118). Asked only of an incarnation this observer does not hold as seen (after its end,
        in a new process, or after our own create of its replacement under the same name): one it holds was not ended
        since without its knowing (``gone`` forgets a node). What it holds of the name after our own create of a
        replacement is that create (no uid yet), not the incarnation deleted before it: a lagging listing that still
        showed the deleted one READY re-opened it, and its READY was dated by the replacement's create, whose end it
        took from it (the swarm's seeds 42, 615 and 762: a node held READY for hours after its delete, its
        replacement's READY lost)."""
        if not node.uid or not CLOSED_STAYS_CLOSED.on:
            return False
        last = self._last_seen.get((node.zone, node.name))
        if last is not None and last.uid == node.uid:
            return False
        return self._last_state(node.zone, node.name, node.uid) in _ENDED

    def _at(self, node: NodeInfo, seen: datetime, first: datetime) -> datetime:
        """When the state a node is first seen in at ``seen`` began (``first``: when the call that saw it went out)."""
        if node.state is NodeState.READY:
            return self._ready_at(node, seen)
        if node.state not in (NodeState.CREATING, NodeState.UNSPECIFIED):  # past READY: was it READY unseen?
            self._ready_unseen(node.zone, node.name, seen, uid=node.uid or None, created=node.create_time, node=node)
        if node.state is NodeState.DELETING:
            return self._ended_at(node.zone, node.name, node.create_time, seen, first, uid=node.uid or None) or seen
        return self._changed_at(node.zone, node.name, seen, first=first, away=node.state in _AFTER_READY)

    def _ended_at(self, zone: str, name: str, created: datetime | None, seen: datetime,
                  first: datetime | None = None, *, uid: str | None = None, wait: bool = False,
                  sure: bool = False) -> datetime | None:
        """When a node first seen DELETING or gone at ``seen`` stopped costing, by the module's one rule of end dating:
        its delete's start, else ``seen``, the sighting that proved it gone; None: not dated yet (it waits).

        A node whose job ended deletes itself (the dead-man's switch), and Cloud TPU bills it until
        that delete starts; the delete operation its VM asked for says when (``node_operations``: the
        first delete of this incarnation, not before its create). Its run's end is no evidence: a run
        that ended while the API failed left its node READY, billed, until a self-delete got through
        (a run ended 63 s before its delete did, and the ledger held 0.44 of what was billed). The date
        is kept within the gap between the last sighting of the node as it was and this one (a clock
        that is off cannot move it out); a process that never saw the node before (``status``,
        ``down``, the dashboard) keeps it after the last transition the ledger holds of the incarnation
        (``uid``) instead: the node was in that state from then on. With no delete to be found (the operations failed,
        lag or cannot be listed) it is dated at ``seen``, where it had surely stopped, never within the gap, where it
        may still have been billing: the middle of the gap dated self-deletes early when the operations listing lagged
        (the swarm's seeds 4417 and 7036: up to 100 s of billing missing), seeds 4, 13 and 30 up to half a pass early
        when the operations could not be listed, and seed 727 a self-delete made at the end of a two-hour outage within
        that gap. With ``wait`` (the node is only absent from a listing, which can lag), an end whose delete is not
        found yet is not dated yet (None: the node stays open, and the next listing asks again), for up to
        ``EVIDENCE_WAIT_S`` after the first listing that missed it, and then (or once it is ``sure`` to be gone) dated
        at that listing: the swarm's seed 152 closed a live node on a listing behind and never billed the 900 s until it
        was seen READY again. A node the ledger holds short of READY waits as well while the create the provider lists
        could not be asked (``_unlisted``): whether it was READY unseen, and since when, is that create's
        (``_ready_unseen``): closed at once, a node whose create's answer was lost and that nobody saw before it deleted
        itself went unbilled (the swarm's seed 3811: 0 s of 980 s). One never sighted is asked from its record's time
        on. One last seen repairing (``_REPAIRS``) that deleted itself was READY again before, since this observer's
        last look at the earliest, on the safe side: its job ran to its end (the swarm's seed 4905: 9000 s billed after
        a maintenance nobody saw end, none of it in the ledger). A new process has no such look (the ledger keeps
        transitions, not sightings): from the repair's start it would bill far more than the cloud did.
        """
        guess = self._changed_at(zone, name, seen, first)
        last = self._last_seen.get((zone, name))
        since = last.at if last is not None else (self._last_change(zone, name, uid) or created)
        if since is None or since >= seen or self._last_state(zone, name, uid) in _ENDED:
            return guess  # the ledger holds its end already (our own delete dated it): nothing to ask
        if not EVIDENCE_END.on:
            return guess
        missed = self._missed.setdefault((zone, name), seen) if wait else seen
        within = wait and not sure and (seen - missed).total_seconds() <= EVIDENCE_WAIT_S
        state = self._state_of(zone, name, uid)
        if within and state in _SHORT_OF_READY and (zone, name) in self._unlisted:
            return None  # was it READY unseen? The create they list says, asked again at the next listing
        waits = within and self.node_operations is not None and \
            state == NodeState.READY.value  # no READY, nothing billed: nothing to wait for
        try:
            started = self._delete_started(zone, name, created, since)
        except TpuopsError:
            started = None
        if started is not None:
            if wait and last is not None and state in _REPAIRS:  # it deleted itself (ours are dated): it ran again
                with contextlib.suppress(NotFound):
                    self.ledger.observe(self.project, zone, name, NodeState.READY, since, uid=uid)
            return min(max(started, since), seen)
        return None if waits else missed

    def _delete_started(self, zone: str, name: str, created: datetime | None, since: datetime) -> datetime | None:
        """When the first delete of the node's incarnation (created at ``created``, else seen at ``since``) started,
        as the provider's operations say; None when none is found or the provider cannot be asked (``TpuopsError``
        when it fails to answer).

        A delete that was over when this incarnation was created acted on the one before (the name is free only once
        its delete is over), even when it started at that very moment (a replacement created as its forerunner's
        delete returned): taken for this one's, it dated the end at the last sighting, up to a pass early."""
        if self.node_operations is None:
            return None
        operations = self.node_operations(zone, name)  # its failure is the caller's (``_ended_at``)
        after = created or since
        starts = [op.started for op in operations
                  if op.verb == "delete" and op.error is None and op.started is not None and op.started >= after
                  and not (created is not None and op.ended is not None and op.ended <= created)]
        return min(starts, default=None)

    def _last_change(self, zone: str, name: str, uid: str | None) -> datetime | None:
        """When the ledger's last transition of the incarnation happened; None when it holds none."""
        changes = self.ledger.transitions(self.project, zone, name, uid=uid)
        return changes[-1].at if changes else None

    def _changed_at(self, zone: str, name: str, seen: datetime, first: datetime | None = None, *,
                    away: bool = False) -> datetime:
        """When a change first seen at ``seen`` most likely happened: within the gap since the last sighting.

        Cloud TPU bills a node while it is READY, but a node carries no time of its last state
        change, and nothing in the API dates a preemption or a delete made from inside the VM:
        all we know is that the change happened after the last sighting of the node as it was
        (or after we asked for it, ``create``) and before this one. Dated at the sighting, it is
        always late: READY time then ended one pass late after each preemption, and the ledger
        billed 2.5-3.8 % more than Cloud TPU under churn. So it is dated in the middle of the
        gap, but no further back than ``_PACES`` former look (half the gap between the two
        sightings before). For an observer that looks at a steady pace (the controller's
        passes) that is the middle, off by at most half a pass and as often early as late; a
        longer gap means that a look was missed (a pass the API or the store failed, ``up``, then
        nothing until ``status``), and the middle of it could bill far less than Cloud TPU did
        (dated a pass back in a gap of two, a preemption was 230 s early: the swarm's seed 2813),
        so the date stays within half a pace of the sighting, on the safe side. The pace is the shorter of the node's
        last gap and its zone's pace of listings (``_pace``: its shortest gap that is no shorter than one next to it, so
        that a look that came early does not set it for good, the swarm's seed 8200): a node's own gap spans the looks
        the API or the store failed before it (a preemption dated 87 s early after a gap of seven passes: the swarm's
        seed 8990), and for a change away from READY (``away``) the zone's pace of its looks, the failed listings too
        (``unlisted``: a preemption dated 79 s early at the pace of the listings that got through, seven passes apart,
        the swarm's seed 5658); the zone's is a pace once three gaps were measured: a process's first gap may be an
        outage, and a preemption after hours with no look was dated in their middle (the swarm's seeds 7090 and 9468:
        1235 s and 895 s missing). With no pace known, the middle of the gap; with no earlier sighting (a new process),
        or only a READY no listing showed (``_ready_unseen``: the middle of the hours since was 3400 s early, the
        swarm's seed 3557) and no pace, the sighting's time it is (``first``: when the call that saw it went out), on
        the safe side.
        """
        last = self._last_seen.get((zone, name))
        if last is None:
            return first or seen
        paces = [p for p in (last.gap, _pace(self._zone_paces, zone), _pace(self._zone_looks, zone) if away else None)
                 if p is not None]
        pace = min(paces, default=None)  # the node's own gap may span looks that were missed: its zone's may not
        if pace is None and not last.looked:
            return first or seen
        if last.at >= seen:
            return seen
        back = (seen - last.at) / 2
        return seen - (back if pace is None else min(back, _PACES * pace))

    def _ready_at(self, node: NodeInfo, seen: datetime) -> datetime:
        """When a node first seen READY at ``seen`` became READY: its create operation's end, else ``_changed_at``.

        A create operation is done when its node is READY, and says when (its endTime): one
        GetOperation, once per node whose create this observer was told of (``created``, ``expect``), dates the
        start of billing exactly; a node another process created (a pass of ``train``, ``up --no-wait``) is
        dated by the create the provider lists for it (``_listed_ready``), not at its first sighting here (2-6 s
        late per node).
        """
        return (self._created_ready(node.zone, node.name, seen, node.create_time) or self._listed_ready(node, seen)
                or self._guessed_ready(node, seen))

    def _guessed_ready(self, node: NodeInfo, seen: datetime) -> datetime:
        """When a node first seen READY at ``seen`` became READY, when no operation says (its GetOperation and the
        ListOperations failed or lagged, or its create never reported done): the incarnation's first READY at the
        earliest it can have been, its create (our ask for it, else its createTime), never after ``seen``. That is
        on the safe side: the ledger bills the node's boot at most more than the cloud, and never misses what it
        billed (dated in the middle of the gap, READY was up to half a pass late: the swarm's seeds 78, 282, 426,
        568, 594). A sighting of it short of READY is no bound: a listing that lags shows a node CREATING after its
        READY (``_created_ready``). A READY after a state past it (a repair's end) is dated within the gap while the
        looks come at their pace, and at the last sighting (the earliest) after a gap of more than two: dated one
        pace before the sighting, a repair's end in an outage was 850 s late (the swarm's seed 2018)."""
        zone, name = node.zone, node.name
        if self._state_of(zone, name, node.uid or None) not in _SHORT_OF_READY:
            last = self._last_seen.get((zone, name))
            if last is not None and last.gap is not None and last.uid == node.uid and seen - last.at > 2 * last.gap:
                return last.at  # looks were missed since: the earliest it can have been (as for a first READY)
            return self._changed_at(zone, name, seen)
        return self._create_floor(node, seen) or self._changed_at(zone, name, seen)

    def _create_floor(self, node: NodeInfo, seen: datetime) -> datetime | None:
        """The earliest the incarnation seen at ``seen`` can have been READY: our ask for its create, kept in our clock
        whatever the API's says, else its createTime; never after ``seen``; None when neither is known."""
        last = self._last_seen.get((node.zone, node.name))
        asked = last.at if last is not None and not last.uid and last.state is None else None  # ``created``
        created = node.create_time
        if asked is not None and (created is None or created >= asked - _CLOCKS_APART):
            return min(asked, seen)  # our own create's (an older createTime is the incarnation before's)
        return min(created, seen) if created is not None else None

    def _listed_ready(self, node: NodeInfo, seen: datetime) -> datetime | None:
        """When the node this observer never saw READY became READY, as the end of its incarnation's create operation
        says (one ListOperations: ``node_operations``); None when the ledger has it READY already (nothing to date),
        or no such create is found, also after a sighting of it short of READY (a create whose answer was lost: seen
        CREATING, never told of its operation; the swarm's seed 58). Kept after the node's createTime and at or before
        ``seen``, not after that sighting (``_created_ready`` says why)."""
        last = self._last_seen.get((node.zone, node.name))
        if self.node_operations is None or (last is not None and (last.uid != node.uid or last.state is None
                                                                  or last.state not in _BOOTING)):
            return None
        if self._last_state(node.zone, node.name, node.uid or None) == NodeState.READY.value:
            return None
        return self._listed_create_end(node.zone, node.name, node.create_time, seen)

    def _listed_create_end(self, zone: str, name: str, floor: datetime | None, seen: datetime) -> datetime | None:
        """The end of the create the provider lists for the node's incarnation (created at ``floor``), kept after
        ``floor`` and at or before ``seen``; None when the provider cannot say or no such create is found. A create
        that ended before the incarnation was created made the one before; one asked for while the name was still
        being deleted started before this createTime, and is this one's (the swarm's seed 58). A create that ended
        before a delete that freed the name for this incarnation made an earlier one, however close the clocks: it
        dated a failed create's node READY (a stockout's, moments after its forerunner's delete)."""
        if self.node_operations is None:
            return None
        try:
            operations = self.node_operations(zone, name)
        except TpuopsError:
            self._unlisted.add((zone, name))
            return None
        self._unlisted.discard((zone, name))
        freed = max((op.ended for op in operations if op.verb == "delete" and op.ended is not None
                     and floor is not None and op.ended <= floor), default=None)  # the name free for this one
        ends = [op.ended for op in operations
                if op.verb == "create" and op.error is None and op.ended is not None
                and (floor is None or op.ended >= floor - _CLOCKS_APART) and (freed is None or op.ended > freed)]
        if not ends:
            return None
        ready = min(max(ends), seen)
        return ready if floor is None else max(ready, floor)

    def _state_of(self, zone: str, name: str, uid: str | None) -> str | None:
        """The ledger's last state of the incarnation (``uid``, else the name's latest); None when it holds none."""
        changes = self.ledger.transitions(self.project, zone, name, uid=uid)
        return changes[-1].state if changes else None

    def _last_state(self, zone: str, name: str, uid: str | None) -> str | None:
        """The ledger's last state of the incarnation ``uid``; None without a uid or when it holds none."""
        return self._state_of(zone, name, uid) if uid else None

    def _created_ready(self, zone: str, name: str, seen: datetime, created: datetime | None = None) -> datetime | None:
        """When the node whose create this observer was told of (``created``, ``expect``) and never saw READY became
        READY, as its create operation's end says (one GetOperation, once); None: nothing to ask, or the create did
        not succeed.

        It is kept between our ask for the create (for one asked elsewhere, the operation's start) and ``seen``, as a
        clock that is off cannot move it out; not after a sighting of the node short of READY: a listing that lags
        shows a node CREATING after its READY, and kept after such sightings READY started when the lag ended,
        missing what was billed meanwhile (the swarm's seed 747: 228 s of 2200 s). An operation that was over before the
        incarnation seen was created (``created``: its createTime) made the one before: a run's memory can still name
        it when the write of the new create's was lost (compare-and-swap conflicts), and it dated a replacement's
        READY at its forerunner's, billing hours the cloud never did (the swarm's seed 44). When the GetOperation fails,
        the create the provider lists for the node dates it instead: guessed within the gap, READY was up to half a
        pass late (the swarm's seed 34, on a branch whose passes' creates went out in a varying order).
        """
        operation, asked = self._creating.pop((zone, name), (None, None))
        if operation is None:
            return None
        try:
            done = self.operations(zone, operation)
        except TpuopsError:  # asked once only: the create the provider lists says the same (ListOperations)
            listed = self._listed_create_end(zone, name, created, seen)
            return listed if listed is None or asked is None else min(max(listed, asked), seen)
        since = asked or done.started
        if done.ended is None or done.error is not None or since is None:
            return None
        if created is not None and done.ended < created - _CLOCKS_APART:
            return None
        return min(max(done.ended, since), seen)

    def _ready_unseen(self, zone: str, name: str, seen: datetime, *, uid: str | None = None,
                      created: datetime | None = None, node: NodeInfo | None = None) -> None:
        """A node found gone or deleted at ``seen`` that we created but this observer never saw READY lived between two
        looks (created, trained and deleted itself between two passes): its create operation dates its READY,
        which goes to the ledger and stands as its last sighting, so that its end is dated after it (``_ended_at``)
        and it is billed in between. Nothing when it was never READY (the create failed) or nothing says when.

        A create whose answer was lost was never told of: when the ledger holds the incarnation (``uid``, None when
        never sighted; created at ``created``) short of READY, the create the provider lists for it dates its READY
        instead (a node seen CREATING, then gone after a short job, billed 80 s the ledger never held: the swarm's
        seeds 84 and 178). A node sighted past READY (``node``) gets its READY in its own incarnation, recorded first
        when the ledger has none yet: the name's latest may be a record a listing that lags closed, which took no
        READY, so what the node billed went unseen. An incarnation the ledger holds READY already gets no READY again: a
        process that never saw it (a cron pass beside the watch) told of its create, which ended hours before, re-opened
        a preempted node READY from that end at each pass, to its next sighting PREEMPTED (the swarm's seed 8825: 71059
        s held against 4351 s billed). One sighted in a state that only READY leads to (``_AFTER_READY``: preempted
        while nobody could look) whose create no call dates is given its READY at its create, on the safe side
        (``_create_floor``): with none, the ledger held nothing of the 784 s it billed (the swarm's seed 4627)."""
        ready = self._created_ready(zone, name, seen, created)
        if ready is None and created is not None and self._state_of(zone, name, uid) in _SHORT_OF_READY:
            ready = self._listed_create_end(zone, name, created, seen)
            if ready is None and node is not None and node.state in _AFTER_READY:
                ready = self._create_floor(node, seen)  # it was READY, and no call says since when: the safe side
        if ready is None or (uid is not None and any(t.state == NodeState.READY.value for t in
                                                     self.ledger.transitions(self.project, zone, name, uid=uid))):
            return
        if node is not None and node.uid:  # sighted: its own incarnation, recorded if need be (not the name's latest)
            self.ledger.observe_nodes([_sighting(node, NodeState.READY, ready)], at=seen)
        else:
            with contextlib.suppress(NotFound):
                self.ledger.observe(self.project, zone, name, NodeState.READY, ready)
        before = self._last_seen.get((zone, name))  # its pace, if it has one
        self._last_seen[(zone, name)] = _Sighted("", NodeState.READY, ready, before.gap if before else None, False)

    def expect(self, zone: str, name: str, operation: str) -> None:
        """The node's create operation, started elsewhere (another process, a pass that died), for ``_ready_at``.

        Without it a node that this observer first sees READY is dated at that sighting, up to a
        pass late. A node whose create it was told of, or that it has seen already, is left as it is.
        """
        if (zone, name) not in self._last_seen:
            self._creating.setdefault((zone, name), (operation, None))

    def gone(self, zone: str, name: str, at: datetime | None = None, record: NodeRecord | None = None, *,
             absent: bool = False, sure: bool = False) -> None:
        """Close the node's ledger incarnation (``record``, else its open one): at ``at`` when known, else when it
        went (``_ended_at``: a node that deleted itself, where its delete operation says). Its open incarnation is
        read only when that evidence is to be asked for; ``mark_deleted`` closes ``record``'s (its uid), else the
        name's. A node whose create this observer was told of and that it never saw READY is first given its READY
        (``_ready_unseen``), so that what it billed is known. ``absent``: it is only absent from a listing
        (``_ended_at`` may wait for evidence); ``sure``: gone for certain all the same (its name was free for a create
        of ours). A ``record`` whose incarnation the ledger holds closed already (read before another process closed it)
        changes nothing: closed by name, its successor under that name was closed instead, READY in the cloud (the
        swarm's seeds 6143 and 7560)."""
        if at is None and record is None and self.node_operations is not None:
            record = next(iter(self.ledger.nodes(self.project, zone, name=name, open_only=True)), None)
        if CLOSED_STAYS_CLOSED.on and record is not None and record.uid and \
                self._last_state(zone, name, record.uid) == DELETED:
            self._missed.pop((zone, name), None)  # a wait for its end is over (a successor's starts again: later)
            return  # read before another process closed it: its end stands, and the name's next incarnation is not it
        self._ready_unseen(zone, name, at or utc_now(self.clock), uid=record.uid if record else None,
                           created=record.created_at if record else None)
        stamp = at or self._ended_at(zone, name, record.created_at if record else None, utc_now(self.clock),
                                     uid=record.uid if record else None, wait=absent, sure=sure)
        if stamp is None:
            return  # only absent from a listing, with no evidence of its end yet: the next listing asks again
        self._missed.pop((zone, name), None)
        self._unlisted.discard((zone, name))
        self._last_seen.pop((zone, name), None)
        self._creating.pop((zone, name), None)
        self.ledger.mark_deleted(self.project, zone, name, at=stamp, uid=record.uid if record else None)

    def recorded(self, zone: str, request: NodeRequest) -> None:
        """A node we asked for, recorded in the ledger now, before anyone waits on it (a killed process leaves it).
        An incarnation of the name whose end is still awaited (``_missed``) is gone for sure (the name was free for
        this create): it is closed first, or the new node would be taken for it (the swarm's seed 610)."""
        if (zone, request.name) in self._missed:
            self.gone(zone, request.name, absent=True, sure=True)
        labels = request.labels
        self.ledger.record_node(self.project, zone, request.name, request.accelerator, request.capacity.value,
                                run_id=naming.run_of(labels), sweep_id=labels.get(naming.SWEEP_KEY),
                                at=utc_now(self.clock))

    def created(self, zone: str, request: NodeRequest, operation: str, asked: datetime) -> None:
        """Our create of the node, asked for at ``asked`` (which bounds when it can have become READY,
        ``_changed_at``) by ``operation`` (whose end dates its READY, ``_ready_at``): recorded now."""
        self.recorded(zone, request)
        self._last_seen[(zone, request.name)] = _Sighted("", None, asked)
        self._creating[(zone, request.name)] = (operation, asked)

    def deleting(self, zone: str, name: str, operation: Operation, asked: datetime, answered: datetime) -> None:
        """Our delete of the node, asked at ``asked`` and answered at ``answered``: billing stops where the delete
        operation started (its createTime), kept within these two local times (a clock off between us and the API
        moves nothing). A node created and never seen READY is first given its READY (``_ready_unseen``), also
        one whose create's answer was lost: its open incarnation (the uid and createTime a sighting gave it) lets the
        create the provider lists date it (a listing that lagged showed it CREATING until our delete, and the ledger
        held none of the 322 s it billed: the swarm's seed 172)."""
        record = None if self.node_operations is None else next(
            iter(self.ledger.nodes(self.project, zone, name=name, open_only=True)), None)
        self._ready_unseen(zone, name, asked, uid=record.uid if record else None,
                           created=record.created_at if record else None)
        with contextlib.suppress(NotFound):
            self.ledger.observe(self.project, zone, name, NodeState.DELETING,
                                min(max(operation.started or answered, asked), answered))

    def listed(self, zone: str, nodes: dict[str, NodeInfo], asked: datetime) -> None:
        """A whole listing of ``zone`` (the call went out at ``asked``): what it shows is observed, and the open
        ledger intervals of nodes it no longer shows are closed: they stopped costing (their dead-man's switch, a
        preemption that made them vanish). A node the listing no longer shows is looked up first (``find_node``):
        a listing that lags shows the zone as it was, before our create, and a node taken for gone on its word was
        dated gone at once, the hours it then billed missing from the ledger (the swarm's seeds 956, 1445, 2204)."""
        _paced(self._zone_paces, zone, asked)
        _paced(self._zone_looks, zone, asked)
        self.observe(*(self._repair_checked(zone, node) for node in nodes.values()), asked=asked)
        for record in self.ledger.nodes(self.project, zone, open_only=True):
            if record.name not in nodes and not self._still_there(zone, record):
                self.gone(zone, record.name, record=record, absent=True)

    def unlisted(self, zone: str, asked: datetime) -> None:
        """A listing of ``zone`` (asked at ``asked``) that failed: no evidence of any node, but a look all the same,
        which sets the pace a change away from READY is dated by (``_changed_at``)."""
        _paced(self._zone_looks, zone, asked)

    def _repair_checked(self, zone: str, node: NodeInfo) -> NodeInfo:
        """A node a listing shows repairing (``_REPAIRS``), as a lookup of it (``find_node``) shows it now: a listing
        that lags shows a repair that is over, and the return to READY was then dated after the lag, the time billed
        meanwhile missing from the ledger (the swarm's seeds 2733 and 8325: 802 s and 375 s). The listing's word when
        the lookup fails or finds another incarnation or none (what ends it is ``_still_there``'s and ``gone``'s)."""
        if self.find_node is None or not node.managed or node.state.value not in _REPAIRS:
            return node
        try:
            found = self.find_node(zone, node.name)
        except TpuopsError:
            return node
        return found if found is not None and found.uid == node.uid else node

    def _still_there(self, zone: str, record: NodeRecord) -> bool:
        """Whether the incarnation of ``record``, which a listing no longer showed, is still there (then it is
        observed as found); False when it is gone (found missing, or another incarnation under its name), nothing
        can be asked, or the lookup failed: then ``gone(absent=True)`` dates its end only from evidence (its delete
        operation), keeping it open meanwhile, up to ``EVIDENCE_WAIT_S``."""
        if self.find_node is None:
            return False
        asked = utc_now(self.clock)
        try:
            node = self.find_node(zone, record.name)
        except TpuopsError:
            return False
        if node is None or (record.uid is not None and node.uid and node.uid != record.uid):
            return False
        self.observe(node, asked=asked)
        return True

    def zones_of_open_nodes(self) -> Iterable[str]:
        """The zones where the ledger says one of our nodes may live (an interval still open)."""
        return (record.zone for record in self.ledger.nodes(self.project, open_only=True))
