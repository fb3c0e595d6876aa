"""What the web app reads and acts through: the ``tpuops.api`` calls, bound to one ``Settings``.

``bound_source`` builds it. The dashboard stands on top of the front door, beside the CLI: it
imports ``tpuops.api``, never the other way round. The app holds only the bound calls, so it
serves whatever store they were bound to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from tpuops.api.accounting import CostAndGoodput
    from tpuops.api.pages import NodeRow, RunDetail
    from tpuops.config import Settings
    from tpuops.runs import LogTail, Run
    from tpuops.store import Store
    from tpuops.sweeps.status import SweepStatus


@dataclass(frozen=True)
class Source:
    run_ids: Callable[[], list[str]]
    run_rows: Callable[[list[str]], list[Run]]
    watch_marks: Callable[[], dict[str, int]]
    run_detail: Callable[[str], RunDetail]
    log_tail: Callable[[str], LogTail]
    sweeps: Callable[[], list[dict[str, Any]]]
    sweep: Callable[[str], SweepStatus]
    sweep_storage: Callable[[str], BaseStorage]
    nodes: Callable[[], list[NodeRow]]
    cost: Callable[[], CostAndGoodput]
    stop_sweep: Callable[[str], str]
    stop_run: Callable[[str], str]
    delete_orphan: Callable[[str, str], str]




@dataclass(frozen=True)
class DashboardInfo:
    """Where the dashboard listens, the token that opens it, and the file keeping the token."""

    url: str
    token: str
    token_file: str
    read_only: bool
    routes: list[str] = field(default_factory=list)

def bound_source(settings: Settings, *, root: Store | None = None) -> Source:
    """The calls above bound to ``settings`` and one store client (``root``, default the configured store, opened
    once here rather than per request): what the web app reads and acts through."""
    from tpuops import api
    from tpuops.api import pages
    from tpuops.session import store

    root = root or store(settings)
    return Source(
        run_ids=lambda: pages.run_ids(settings, root=root),
        run_rows=lambda ids: pages.run_rows(settings, ids, root=root),
        watch_marks=lambda: pages.watch_marks(settings, root=root),
        run_detail=lambda run_id: pages.run_detail(settings, run_id, root=root),
        log_tail=lambda run_id: pages.log_tail(settings, run_id, root=root),
        sweeps=lambda: api.sweep_list(settings),
        sweep=lambda name: api.sweep_status(settings, name),
        sweep_storage=lambda name: pages.sweep_storage(settings, name, root=root),
        nodes=lambda: pages.nodes(settings, root=root),
        cost=lambda: api.cost(settings),
        stop_sweep=lambda name: f"sweep {name}: {api.sweep_stop(settings, name).phase}",
        stop_run=lambda run_id: api.stop(settings, [run_id], wait=False, reason="stopped from the dashboard")[0].text,
        delete_orphan=lambda zone, name: pages.delete_orphan(settings, zone, name, root=root),
    )
