"""What the web app reads and acts through: the ``tpuops.api`` calls, bound to one ``Settings``.

``tpuops.api.dashboard.bound_source`` builds it. The app holds only this, so it never imports the
front door (no import circle) and serves whatever store the calls were bound to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from tpuops.accounting import CostAndGoodput
    from tpuops.dashboard.timeline import Timeline
    from tpuops.providers.nodes import NodeInfo
    from tpuops.runs import LogTail, Run
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


@dataclass(frozen=True)
class DashboardInfo:
    """Where the dashboard listens, the token that opens it, and the file keeping the token."""

    url: str
    token: str
    token_file: str
    read_only: bool
    routes: list[str] = field(default_factory=list)
