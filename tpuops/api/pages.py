"""The read-only calls and guarded actions the dashboard's pages use, as library calls.

Part of the front door (``tpuops.api`` re-exports every name here), and no UI: the web app
(``tpuops.dashboard``) stands on top, beside the CLI, and binds these calls to one ``Settings``
(``tpuops.dashboard.source.bound_source``); nothing here imports it.

Cheap reads first: ``run_ids`` is one listing of the run index, ``watch_marks`` one listing of the
active index plus one stat of each active run's status: what the live pages poll. A run's files
are read only for the rows a page asks for (``run_rows``) and for one run's page (``run_detail``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from tpuops.config import Settings
from tpuops.core.clock import UTC
from tpuops.core.errors import NotFound, UsageError

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from tpuops.accounting.timeline import Timeline
    from tpuops.providers.nodes import NodeInfo
    from tpuops.runs import LogTail, Run
    from tpuops.store import Store



class RunDetail(NamedTuple):
    """One run's page: the run with its goodput, its timeline, and what its nodes cost."""

    run: Run
    timeline: Timeline
    cost_usd: float
    """What the run's node incarnations cost so far (the ledger's READY time at the catalog's prices)."""


class NodeRow(NamedTuple):
    """A node in view, with the run it belongs to, whether that run is unknown to the store (an orphan), and
    what is damaged of it (``Run.damage_note``; None: nothing, or no run)."""

    node: NodeInfo
    run_id: str | None
    orphan: bool
    damaged: str | None = None


def run_ids(settings: Settings, *, root: Store | None = None) -> list[str]:
    """Every run's id from the run index: one listing, no run's files read."""
    from tpuops import runs
    from tpuops.session import store

    return runs.all_run_ids(root or store(settings))


def run_rows(settings: Settings, ids: list[str], *, root: Store | None = None) -> list[Run]:
    """These runs (ids the store does not know are left out), with their goodput from one ledger read."""
    from tpuops import runs
    from tpuops.api.accounting import attach_goodput
    from tpuops.session import store

    root = root or store(settings)

    def one(run_id: str) -> Run | None:
        try:
            return runs.open_run(root, run_id)
        except (UsageError, NotFound):
            return None

    found = [run for run in runs.parallel_map(one, ids) if run is not None]
    return attach_goodput(settings, found)


def watch_marks(settings: Settings, *, root: Store | None = None) -> dict[str, int]:
    """What the live pages poll: each active run's status and memory generations as one number (0: neither yet),
    from one listing and two stats per active run. A change means the agent or the controller wrote something new:
    the controller's memory too, since a run's end (its ``finished`` event) is written a pass after the agent's last
    status, and a page that waited for the status alone showed the end only once the run left the index."""
    from tpuops import runs
    from tpuops.session import store

    root = root or store(settings)

    def stat(key: str) -> int:
        try:
            return root.stat(key).generation
        except NotFound:
            return 0

    def generation(run_id: str) -> int:
        return (stat(runs.status_key(run_id)) << 64) + stat(runs.memory_key(run_id))

    active = runs.active_index(root)
    return dict(zip(active, runs.parallel_map(generation, list(active)), strict=True))


def run_detail(settings: Settings, run_id: str, *, root: Store | None = None) -> RunDetail:
    """One run with its goodput and its life as a timeline (ledger intervals, memory events, attempt clocks)."""
    from tpuops import runs
    from tpuops.accounting.goodput import run_goodput
    from tpuops.accounting.timeline import build
    from tpuops.billing.cost import catalog_for, node_cost
    from tpuops.session import open_ledger, store

    run = runs.open_run(root or store(settings), run_id)
    histories = open_ledger(settings).histories(settings.project, run_id=run_id)
    catalog, now = catalog_for(settings), datetime.now(UTC)
    goodput = run_goodput(histories, run.status, catalog, now)
    return RunDetail(run=replace(run, goodput=goodput),
                     timeline=build(histories, run.memory.events, run.status, now.timestamp(), catalog.offers),
                     cost_usd=sum(node_cost(h, catalog, now).usd for h in histories))


def nodes(settings: Settings, *, root: Store | None = None) -> list[NodeRow]:
    """``tpuops status``'s nodes, each with its owner run, whether it is an orphan (its run unknown) and what is
    damaged of its run (an active run only: the one ``tpuops status`` reads)."""
    from tpuops import runs
    from tpuops.api import status
    from tpuops.core.naming import run_of
    from tpuops.session import store

    root = root or store(settings)
    overview = status(settings)
    damaged = {run.run_id: run.damage_note() for run in overview.runs if run.damage}
    rows = []
    for node in overview.nodes:
        run_id = run_of(node.labels)  # a probe is its run's, not an orphan of its own name
        rows.append(NodeRow(node, run_id, node.managed and run_id is not None and not runs.run_exists(root, run_id),
                            damaged.get(run_id or "")))
    return rows


def delete_orphan(settings: Settings, zone: str, name: str, *, root: Store | None = None) -> str:
    """Delete one node whose run the store does not know. ``UsageError`` (nothing deleted) for a node not in
    view, or one that belongs to a known run (stop the run instead) or to no tpuops run at all."""
    from tpuops.session import fleet

    found = [row for row in nodes(settings, root=root) if row.node.name == name and row.node.zone == zone]
    if not found:
        raise UsageError(f"no node {name} in {zone} (the Nodes page lists the nodes in view)")
    row = found[0]
    if row.run_id is None or not row.node.managed:
        raise UsageError(f"node {name} is not a tpuops run's node; the dashboard leaves it alone")
    if not row.orphan:
        raise UsageError(f"node {name} belongs to run {row.run_id}, which the store knows: stop the run instead")
    fleet(settings).delete(zone, name)
    return f"node {name} in {zone}: delete requested"



def log_tail(settings: Settings, run_id: str, *, root: Store | None = None) -> LogTail:
    """A reader of the run's new log lines, each once (``UsageError`` for an unknown run)."""
    from tpuops import runs
    from tpuops.session import store

    root = root or store(settings)
    runs.read_record(root, run_id)
    return runs.LogTail(root, run_id)


def sweep_storage(settings: Settings, name: str, *, root: Store | None = None) -> BaseStorage:
    """The sweep's own Optuna storage (the store journal, or its database): what optuna-dashboard opens."""
    from tpuops.session import store
    from tpuops.sweeps.ops import read_sweep
    from tpuops.sweeps.studies import open_storage

    root = root or store(settings)
    return open_storage(read_sweep(root, name).spec, root)

