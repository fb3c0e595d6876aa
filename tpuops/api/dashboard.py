"""``tpuops dashboard`` and the read-only calls and guarded actions its pages use, as library calls.

Part of the front door (``tpuops.api`` re-exports every name here). The pages read through these
calls only; the web app (``tpuops.dashboard``) gets them bound to one ``Settings`` as a
``tpuops.dashboard.source.Source`` and imports nothing of ``tpuops.api`` itself, so there is no
import circle between the two.

Cheap reads first: ``run_ids`` is one listing of the run index, ``watch_marks`` one listing of the
active index plus one stat of each active run's status: what the live pages poll. A run's files
are read only for the rows a page asks for (``run_rows``) and for one run's page (``run_detail``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from tpuops.clock import UTC
from tpuops.config import Settings
from tpuops.dashboard.source import DashboardInfo, NodeRow, RunDetail, Source
from tpuops.errors import NotFound, UsageError

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from tpuops.runs import LogTail, Run
    from tpuops.store import Store



def run_ids(settings: Settings, *, root: Store | None = None) -> list[str]:
    """Every run's id from the run index: one listing, no run's files read."""
    from tpuops import runs
    from tpuops.session import store

    return runs.all_run_ids(root or store(settings))


def run_rows(settings: Settings, ids: list[str], *, root: Store | None = None) -> list[Run]:
    """These runs (ids the store does not know are left out), with their goodput from one ledger read."""
    from tpuops import runs
    from tpuops.accounting import attach_goodput
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
    """What the live pages poll: each active run's status generation (0: none yet), from one listing and
    one stat per active run. A change means the agent or the controller wrote something new."""
    from tpuops import runs
    from tpuops.session import store

    root = root or store(settings)

    def generation(run_id: str) -> int:
        try:
            return root.stat(runs.status_key(run_id)).generation
        except NotFound:
            return 0

    active = runs.active_index(root)
    return dict(zip(active, runs.parallel_map(generation, list(active)), strict=True))


def run_detail(settings: Settings, run_id: str, *, root: Store | None = None) -> RunDetail:
    """One run with its goodput and its life as a timeline (ledger intervals, memory events, attempt clocks)."""
    from tpuops import runs
    from tpuops.cost import catalog_for, node_cost
    from tpuops.dashboard.timeline import build
    from tpuops.runs.goodput import run_goodput
    from tpuops.session import open_ledger, store

    run = runs.open_run(root or store(settings), run_id)
    histories = open_ledger(settings).histories(settings.project, run_id=run_id)
    catalog, now = catalog_for(settings), datetime.now(UTC)
    goodput = run_goodput(histories, run.status, catalog, now)
    return RunDetail(run=replace(run, goodput=goodput),
                     timeline=build(histories, run.memory.events, run.status, now.timestamp()),
                     cost_usd=sum(node_cost(h, catalog, now).usd for h in histories))


def nodes(settings: Settings, *, root: Store | None = None) -> list[NodeRow]:
    """``tpuops status``'s nodes, each with its owner run, whether it is an orphan (its run unknown) and what is
    damaged of its run (an active run only: the one ``tpuops status`` reads)."""
    from tpuops import runs
    from tpuops.api import status
    from tpuops.naming import RUN_KEY
    from tpuops.session import store

    root = root or store(settings)
    overview = status(settings)
    damaged = {run.run_id: run.damage_note() for run in overview.runs if run.damage}
    rows = []
    for node in overview.nodes:
        run_id = node.labels.get(RUN_KEY)
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


def dashboard(settings: Settings, *, port: int = 0, read_only: bool = False, open_browser: bool = False,
              refresh_s: float = 1.0, on_ready: Callable[[DashboardInfo], None] | None = None) -> None:
    """``tpuops dashboard``: serve the web app on 127.0.0.1 until interrupted (``port`` 0: a free one).

    The token is made once per start and kept in ``<home>/dashboard-token`` (mode 0600); ``on_ready``
    gets the URL carrying it. ``read_only`` serves no action route at all.
    """
    from tpuops.dashboard.serve import serve

    serve(bound_source(settings), token_file=settings.home.expanduser() / "dashboard-token", port=port,
          read_only=read_only, refresh_s=refresh_s, open_browser=open_browser, on_ready=on_ready)


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


def bound_source(settings: Settings, *, root: Store | None = None) -> Source:
    """The calls above bound to ``settings`` and one store client (``root``, default the configured store, opened
    once here rather than per request): what the web app reads and acts through."""
    from tpuops import api
    from tpuops.session import store

    root = root or store(settings)
    return Source(
        run_ids=lambda: run_ids(settings, root=root),
        run_rows=lambda ids: run_rows(settings, ids, root=root),
        watch_marks=lambda: watch_marks(settings, root=root),
        run_detail=lambda run_id: run_detail(settings, run_id, root=root),
        log_tail=lambda run_id: log_tail(settings, run_id, root=root),
        sweeps=lambda: api.sweep_list(settings),
        sweep=lambda name: api.sweep_status(settings, name),
        sweep_storage=lambda name: sweep_storage(settings, name, root=root),
        nodes=lambda: nodes(settings, root=root),
        cost=lambda: api.cost(settings),
        stop_sweep=lambda name: f"sweep {name}: {api.sweep_stop(settings, name).phase}",
        stop_run=lambda run_id: api.stop(settings, [run_id], wait=False, reason="stopped from the dashboard")[0].text,
        delete_orphan=lambda zone, name: delete_orphan(settings, zone, name, root=root),
    )
