"""What the nodes cost: READY intervals from the ledger, priced by the catalog, summed per node, run, sweep, day.

Billing rules (docs/cloud-tpu.md): Cloud TPU bills a node while it is READY, at its hourly price
(``pricing``). A spot or preemptible node preempted within a minute of its create is free: the provider's rule,
asked through the catalog's offers (Cloud TPU's is ``tpuops.providers.cloud_tpu.billing_rules``, the one
definition the emulator's billing record applies too). Here an
incarnation's READY interval starts at a READY transition and ends at the next transition of any
other state (DELETING, PREEMPTED, STOPPING, STOPPED, TERMINATED, DELETED, ...);
an interval still open is billed up to ``now``. Daily totals split intervals at UTC midnight.

Precision: the ledger holds transitions dated by ``Fleet`` from the best evidence the API
gives. A READY start is the end of the node's create operation (exact, whoever created it, where the
provider lists the operations on a node); a delete is the delete operation's start, ours or the VM's own
(exact: billing stops when a delete starts; never the run's end, which an API outage can put long before);
anything else (a preemption, a node gone with no delete to be found) is dated within the gap between the last
sighting as it was and the first as it is, in its middle while tpuops watches at a steady pace, so
that an edge is as often early as late by at most half a pass instead of always a pass late
(tests/controller/test_controller_churn.py holds a controller's runs with 0 to 10 preemptions within 2 % of the
emulator's billing truth). A node nobody watches is billed until the next observation, on the safe
side for budgets; and a preemption never observed (the node went from READY straight to gone)
cannot earn the first-minute exemption, so it is billed.

Per-interval precision: one READY interval is good to about ±0.1 s against the emulator's billing
record (its edges are operation times where an operation dates them, sightings dated by ``Fleet``
otherwise; measured: ±1.4 % on 9-s intervals). That is noise on the minutes and hours nodes really
run, and sums over many intervals do better, as early and late edges cancel.

Design: everything that computes is a pure function of ledger rows (``NodeHistory``), a
``Catalog`` and ``now``, tested without a database or a server; ``spent`` is the thin layer that
reads the ledger (``Ledger.histories``). The report of ``tpuops cost``, with each run's goodput
from the store, is assembled in the service layer (``tpuops.api.accounting``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from tpuops.billing.ledger import Ledger, NodeHistory, Transition
from tpuops.billing.pricing import Catalog, catalog_of, parse_capacity
from tpuops.core.clock import UTC
from tpuops.core.errors import UsageError
from tpuops.core.formats import format_usd
from tpuops.core.kinds import Capacity
from tpuops.providers.nodes import NodeState
from tpuops.providers.registry import offers_of

if TYPE_CHECKING:
    from tpuops.config import Settings

@dataclass(frozen=True)
class Interval:
    """A stretch of READY time; ``open`` when the node was still READY at ``end`` (= now)."""

    start: datetime
    end: datetime
    open: bool = False

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())


@dataclass(frozen=True)
class DayCost:
    day: date
    """The UTC day."""
    ready_seconds: float
    usd: float


@dataclass(frozen=True)
class NodeCost:
    """One incarnation's READY time and cost (within the report's ``since``), by UTC day."""

    history: NodeHistory
    usd_per_hour: float
    free: bool
    """Preempted within a minute of its create (``billing_rules``): its READY time costs nothing."""
    ready_now: bool
    days: tuple[DayCost, ...]

    @property
    def ready_seconds(self) -> float:
        return sum(day.ready_seconds for day in self.days)

    @property
    def usd(self) -> float:
        return sum(day.usd for day in self.days)

    def to_json(self) -> dict[str, Any]:
        node = self.history.node
        return {
            "project": node.project, "zone": node.zone, "name": node.name, "uid": node.uid,
            "accelerator": node.accelerator, "capacity": node.capacity, "run_id": node.run_id,
            "sweep_id": node.sweep_id, "usd_per_hour": self.usd_per_hour, "free": self.free,
            "ready_now": self.ready_now, "ready_seconds": round(self.ready_seconds, 3), "usd": round(self.usd, 6),
        }


@dataclass(frozen=True)
class Total:
    """The sum over a group of nodes: a run, a sweep, a UTC day, or everything."""

    key: str | None
    """Run id, sweep id or ISO day; None for nodes outside any run, and for the grand total."""
    nodes: int
    ready_seconds: float
    usd: float
    usd_per_hour_now: float | None = None
    """What the group's nodes READY now cost per hour (the burn rate); None for a day."""

    def to_json(self) -> dict[str, Any]:
        out = {"key": self.key, "nodes": self.nodes, "ready_seconds": round(self.ready_seconds, 3),
               "usd": round(self.usd, 6)}
        if self.usd_per_hour_now is not None:
            out["usd_per_hour_now"] = round(self.usd_per_hour_now, 6)
        return out


@dataclass(frozen=True)
class SizeTotal:
    """What one size of an elastic run cost: its nodes (every attempt on it and its probes), chips, READY time, USD,
    each node priced by its own chips."""

    run_id: str
    accelerator: str
    chips: int
    nodes: int
    ready_seconds: float
    usd: float

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "accelerator": self.accelerator, "chips": self.chips, "nodes": self.nodes,
                "ready_seconds": round(self.ready_seconds, 3), "usd": round(self.usd, 6)}


@dataclass(frozen=True)
class CostReport:
    now: datetime
    since: datetime | None
    nodes: tuple[NodeCost, ...]
    runs: tuple[Total, ...]
    sweeps: tuple[Total, ...]
    days: tuple[Total, ...]
    total: Total
    catalog: Catalog
    sizes: tuple[SizeTotal, ...] = ()
    """Per run that ran on more than one accelerator (an elastic run), per size, largest first."""

    def to_json(self) -> dict[str, Any]:
        return {
            "currency": self.catalog.currency,
            "prices": {"source": self.catalog.source, "retrieved": self.catalog.retrieved.isoformat()},
            "now": self.now.isoformat(), "since": self.since.isoformat() if self.since else None,
            "total": self.total.to_json(),
            "runs": [t.to_json() for t in self.runs], "sweeps": [t.to_json() for t in self.sweeps],
            "days": [t.to_json() for t in self.days], "nodes": [n.to_json() for n in self.nodes],
            "sizes": [s.to_json() for s in self.sizes],
        }

    def rows(self) -> list[dict[str, Any]]:
        """One row per node and UTC day: the finest grain, for CSV and spreadsheets."""
        rows = []
        for cost in self.nodes:
            node = cost.history.node
            for day in cost.days:
                rows.append({
                    "day": day.day.isoformat(), "project": node.project, "zone": node.zone, "node": node.name,
                    "uid": node.uid or "", "accelerator": node.accelerator, "capacity": node.capacity,
                    "run_id": node.run_id or "", "sweep_id": node.sweep_id or "",
                    "ready_seconds": round(day.ready_seconds, 3), "usd": round(day.usd, 6),
                })
        return rows


# -- intervals (pure) -----------------------------------------------------------------------------


def ready_intervals(transitions: Sequence[Transition], now: datetime) -> list[Interval]:
    """The READY intervals of one incarnation from its transitions in observed order.

    READY opens an interval, any other state closes it; one still open ends at ``now``. An interval never ends
    before it starts: a READY dated by another process after the delete that a slow answer dated later in the
    ledger (the create of a node deleted while it booted ended after that delete began) counts nothing, never less
    than nothing (the swarm's seed 2124: -75 s).
    """
    intervals: list[Interval] = []
    start: datetime | None = None
    for transition in transitions:
        if transition.state == NodeState.READY.value:
            if start is None:
                start = transition.at
        elif start is not None:
            intervals.append(Interval(start, max(start, transition.at)))
            start = None
    if start is not None:
        intervals.append(Interval(start, max(start, now), open=True))
    return intervals


def preempted_in_first_minute(history: NodeHistory, catalog: Catalog) -> bool:
    """Whether the incarnation is free: seen PREEMPTED within a minute of its create, at a preemptible price (the
    rule of the catalog's provider, ``Offers.preemption_is_free``).

    The create is the ledger's ``created_at``; the preemption is the first PREEMPTED transition.
    """
    preempted = next((t.at for t in history.transitions if t.state == NodeState.PREEMPTED.value), None)
    if preempted is None:
        return False
    capacity = parse_capacity(history.node.capacity).value
    return catalog.offers.preemption_is_free(capacity, history.node.created_at.timestamp(), preempted.timestamp())


def clip(interval: Interval, since: datetime | None) -> Interval | None:
    """The part of ``interval`` from ``since`` on (None if nothing is left)."""
    if since is None or interval.start >= since:
        return interval
    if interval.end <= since:
        return None
    return Interval(since, interval.end, interval.open)


def split_by_day(interval: Interval) -> Iterator[tuple[date, Interval]]:
    """Cut ``interval`` at every UTC midnight it spans; yields (UTC day, piece)."""
    start, end = interval.start.astimezone(UTC), interval.end.astimezone(UTC)
    while start < end:
        midnight = datetime.combine(start.date() + timedelta(days=1), time.min, tzinfo=UTC)
        piece_end = min(end, midnight)
        yield start.date(), Interval(start, piece_end, open=interval.open and piece_end == end)
        start = piece_end


def is_ready_now(history: NodeHistory) -> bool:
    return (history.node.deleted_at is None and bool(history.transitions)
            and history.transitions[-1].state == NodeState.READY.value)


# -- prices (pure) --------------------------------------------------------------------------------


def node_cost(history: NodeHistory, catalog: Catalog, now: datetime, since: datetime | None = None) -> NodeCost:
    """Price one incarnation's READY time from ``since`` (default: all of it) up to ``now``.

    The first-minute exemption looks at the whole incarnation, whatever ``since`` cuts off.

    Raises:
        UsageError: the ledger row names an accelerator, capacity or zone the catalog cannot price.
    """
    node = history.node
    usd_per_hour = catalog.price_per_hour(node.accelerator, node.capacity, node.zone)
    intervals = ready_intervals(history.transitions, now)
    free = preempted_in_first_minute(history, catalog)
    seconds_by_day: dict[date, float] = defaultdict(float)
    for interval in intervals:
        clipped = clip(interval, since)
        if clipped is None:
            continue
        for day, piece in split_by_day(clipped):
            seconds_by_day[day] += piece.seconds
    days = tuple(DayCost(day, seconds, 0.0 if free else seconds / 3600 * usd_per_hour)
                 for day, seconds in sorted(seconds_by_day.items()) if seconds > 0)
    return NodeCost(history=history, usd_per_hour=usd_per_hour, free=free, ready_now=is_ready_now(history),
                    days=days)


def _total(key: str | None, costs: Sequence[NodeCost]) -> Total:
    return Total(key, len(costs), sum(c.ready_seconds for c in costs), sum(c.usd for c in costs),
                 usd_per_hour_now=sum(c.usd_per_hour for c in costs if c.ready_now))


def _totals(costs: Sequence[NodeCost], key: Callable[[NodeCost], str | None]) -> tuple[Total, ...]:
    groups: dict[str | None, list[NodeCost]] = defaultdict(list)
    for cost in costs:
        groups[key(cost)].append(cost)
    ordered = sorted(groups.items(), key=lambda item: (item[0] is None, item[0] or ""))
    return tuple(_total(name, members) for name, members in ordered)


def _day_totals(costs: Sequence[NodeCost]) -> tuple[Total, ...]:
    seconds: dict[date, float] = defaultdict(float)
    usd: dict[date, float] = defaultdict(float)
    nodes: dict[date, int] = defaultdict(int)
    for cost in costs:
        for day in cost.days:
            seconds[day.day] += day.ready_seconds
            usd[day.day] += day.usd
            nodes[day.day] += 1
    return tuple(Total(day.isoformat(), nodes[day], seconds[day], usd[day]) for day in sorted(seconds))


def size_totals(costs: Sequence[NodeCost], catalog: Catalog) -> tuple[SizeTotal, ...]:
    """Per run whose nodes were of more than one accelerator (an elastic run's sizes; its probes are in the ledger
    under the run, ``naming.run_of``, and counted at their size), per accelerator, the largest first."""
    by_run: dict[str, dict[str, list[NodeCost]]] = defaultdict(lambda: defaultdict(list))
    for cost in costs:
        node = cost.history.node
        if node.run_id:
            by_run[node.run_id][node.accelerator].append(cost)
    totals = []
    for run_id, sizes in sorted(by_run.items()):
        if len(sizes) < 2:
            continue
        chips = {accelerator: catalog.offers.shape(accelerator).chips for accelerator in sizes}
        for accelerator in sorted(sizes, key=lambda a: -chips[a]):
            members = sizes[accelerator]
            totals.append(SizeTotal(run_id, accelerator, chips[accelerator], len(members),
                                    sum(c.ready_seconds for c in members), sum(c.usd for c in members)))
    return tuple(totals)


def build_report(
    histories: Sequence[NodeHistory], catalog: Catalog, now: datetime, since: datetime | None = None
) -> CostReport:
    """Price every incarnation and sum per run, sweep and UTC day.

    Nodes with no READY time from ``since`` on that are not READY now are left out.
    """
    costs = tuple(c for c in (node_cost(h, catalog, now, since) for h in histories) if c.days or c.ready_now)
    return CostReport(
        now=now, since=since, nodes=costs,
        runs=_totals(costs, lambda c: c.history.node.run_id),
        sweeps=_totals([c for c in costs if c.history.node.sweep_id], lambda c: c.history.node.sweep_id),
        days=_day_totals(costs), total=_total(None, costs), catalog=catalog, sizes=size_totals(costs, catalog),
    )


# -- budgets (pure) -------------------------------------------------------------------------------


def projected_cost(
    accelerator: str, capacity: str | Capacity, zone: str, hours: float, catalog: Catalog
) -> float:
    """USD that ``hours`` of one such node would cost at ``catalog``'s prices.

    Raises:
        UsageError: negative hours, or something the catalog cannot price.
    """
    if hours < 0:
        raise UsageError(f"hours = {hours!r} is not allowed: expected a number >= 0")
    return catalog.price_per_hour(accelerator, capacity, zone) * hours


def check_budget(spent: float, projected: float, budget: float) -> str | None:
    """Why a launch must not happen under ``budget`` (USD), or None when it fits.

    Refuses once spending has reached the cap, and when ``projected`` exceeds what is left.

    Raises:
        UsageError: a negative budget.
    """
    if budget < 0:
        raise UsageError(f"budget = {budget!r} is not allowed: expected USD >= 0")
    if spent >= budget:
        return f"spending reached the budget: {format_usd(spent)} spent of {format_usd(budget)}"
    left = budget - spent
    if projected > left:
        return (f"projected cost {format_usd(projected)} exceeds the {format_usd(left)} left of the "
                f"{format_usd(budget)} budget ({format_usd(spent)} spent)")
    return None


# -- reading the ledger ---------------------------------------------------------------------------


def parse_since(text: str) -> datetime:
    """``2024-05-01`` (UTC midnight) or an ISO time such as ``2024-05-01T12:00`` (UTC unless it says).

    Raises:
        UsageError: neither form.
    """
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"since {text!r} is not a date such as 2024-05-01 or a time such as "
                         "2024-05-01T12:00") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def spent(
    ledger: Ledger,
    catalog: Catalog,
    *,
    project: str | None = None,
    run_id: str | None = None,
    sweep_id: str | None = None,
    since: datetime | None = None,
    now: datetime | None = None,
) -> float:
    """USD spent (open intervals up to ``now``) by the nodes matching every filter given."""
    now = now or datetime.now(UTC)
    histories = ledger.histories(project, run_id=run_id, sweep_id=sweep_id, alive_since=since)
    return sum(node_cost(h, catalog, now, since).usd for h in histories)


def spent_by_run(ledger: Ledger, catalog: Catalog, *, project: str | None, sweep_id: str,
                 now: datetime | None = None) -> dict[str, float]:
    """USD spent by each run of a sweep (open intervals up to ``now``), from one read of the ledger.

    A sweep pass needs the sweep's total and every running trial's share: one read of the sweep's
    nodes instead of one per trial (a pass's main ledger cost at 50 trials in parallel).
    """
    now = now or datetime.now(UTC)
    by_run: dict[str, float] = {}
    for history in ledger.histories(project, sweep_id=sweep_id):
        run_id = history.node.run_id or ""
        by_run[run_id] = by_run.get(run_id, 0.0) + node_cost(history, catalog, now, None).usd
    return by_run


def catalog_for(settings: Settings) -> Catalog:
    """The configured provider's prices (``offers_of(settings.node_provider)``) with the ``prices`` table of
    tpuops.toml on top.

    Raises:
        UsageError: an unknown provider, or an override the catalog refuses.
    """
    return catalog_of(offers_of(settings.node_provider)).with_overrides(settings.prices)
