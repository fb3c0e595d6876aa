"""Looking at runs and mending them: the overview, the listing, logs and events of a run, what the runs cost
(``cost``: the ledger's report with each run's goodput), and the repair or forgetting of a damaged run
(``tpuops.runs.repair``), with the node that carries its label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpuops.api.tools import slice_workers
from tpuops.config import Settings

if TYPE_CHECKING:
    from tpuops.api.accounting import CostAndGoodput
    from tpuops.providers.nodes import NodeInfo
    from tpuops.runs import Memory, Run
    from tpuops.runs.repair import Diagnosis
    from tpuops.store import Store


@dataclass(frozen=True)
class Overview:
    """``tpuops status``: the nodes in view and the runs still going."""

    nodes: list[NodeInfo]
    runs: list[Run]


def status(settings: Settings) -> Overview:
    """Nodes in the zones in view (one ListNodes per zone) and the unfinished runs (the active index only)."""
    from tpuops import runs
    from tpuops.api.accounting import attach_goodput
    from tpuops.session import fleet, store

    active = runs.list_runs(store(settings), active_only=True)
    since = min((datetime.fromisoformat(r.record.created) for r in active if r.record.created), default=None)
    return Overview(nodes=fleet(settings).status(), runs=attach_goodput(settings, active, since=since))


def list_runs(settings: Settings) -> list[Run]:
    """``tpuops runs``: every run, oldest first, with its goodput."""
    from tpuops import runs
    from tpuops.api.accounting import attach_goodput
    from tpuops.session import store

    return attach_goodput(settings, runs.list_runs(store(settings)))


def logs(settings: Settings, run_id: str, *, follow: bool = False, worker: str = "0") -> Iterator[str]:
    """``tpuops logs RUN [-f] [--worker N|all]``: its log lines (worker 0's by default; ``all``: every worker's,
    each line prefixed with its worker); following goes on across preemptions until the run ends.

    Raises:
        UsageError: ``worker`` is not a worker of the run's accelerator, or of any size of an elastic run (before
            anything is read).
    """
    from tpuops import runs
    from tpuops.session import store

    root = store(settings)
    sizes = [node.accelerator for node in runs.read_record(root, run_id).sizes]
    workers = slice_workers(settings, sizes, worker, f"run {run_id}")
    return runs.follow_logs(root, run_id, follow=follow, poll_s=max(settings.poll_interval_s, 0.5), workers=workers)


def events(settings: Settings, run_id: str) -> Memory:
    """``tpuops events RUN``: the controller's memory of the run, with its event log (``DamagedDocument`` naming
    what to do when its record or memory cannot be read)."""
    from tpuops import runs
    from tpuops.core.errors import DamagedDocument
    from tpuops.session import store

    root = store(settings)
    try:
        runs.read_record(root, run_id)
        return runs.load_memory(root, run_id)[0]
    except DamagedDocument as err:
        raise DamagedDocument(f"{err} ({runs.repair_hint(run_id)})", where=err.where) from None


@dataclass(frozen=True)
class Repaired:
    """``tpuops runs repair``: what is wrong with the run, and what was done about it (nothing on a dry run)."""

    diagnosis: Diagnosis
    done: list[str]
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        return {**self.diagnosis.to_json(), "done": self.done, "dry_run": self.dry_run}


@dataclass(frozen=True)
class Forgotten:
    """``tpuops runs forget``: the run taken out of the index, and its node deleted first if it had one."""

    diagnosis: Diagnosis
    forgotten: bool
    """False on a dry run, or when the confirmation was declined: nothing was done."""
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        return {**self.diagnosis.to_json(), "forgotten": self.forgotten, "dry_run": self.dry_run}


def repair(settings: Settings, run_id: str, *, dry_run: bool = False) -> Repaired:
    """``tpuops runs repair RUN``: which of the run's documents are damaged, and rebuild what can be rebuilt
    (``tpuops.runs.repair``); ``dry_run`` only says. A damaged run.json stays so (``Diagnosis.repairable``)."""
    import time

    from tpuops.runs import repair as mending
    from tpuops.session import store

    root = store(settings)
    diagnosis = mending.diagnose(root, run_id)  # an unknown run is refused before the cloud is asked
    diagnosis = replace(diagnosis, node=_node_of(settings, root, run_id))
    return Repaired(diagnosis, [] if dry_run else mending.repair(root, diagnosis, time.time()), dry_run)


def forget(settings: Settings, run_id: str, *, dry_run: bool = False,
           confirm: Callable[[Diagnosis], bool] = lambda _found: True) -> Forgotten:
    """``tpuops runs forget RUN``: delete a damaged run's node (waiting until it is gone) if it has one, then take
    the run out of the index. ``confirm`` is asked first when there is a node; ``UsageError`` for a run that is
    not damaged (nothing is done: such a run is stopped, not forgotten)."""
    from tpuops.core.errors import UsageError
    from tpuops.runs import repair as mending
    from tpuops.session import fleet, store

    root = store(settings)
    diagnosis = mending.diagnose(root, run_id)  # refused before the cloud is asked
    if not diagnosis.damaged:
        raise UsageError(f"run {run_id} is not damaged: only a damaged run is forgotten ('tpuops runs' shows it)")
    node = _node_of(settings, root, run_id)
    diagnosis = replace(diagnosis, node=node)
    if dry_run or (node is not None and not confirm(diagnosis)):
        return Forgotten(diagnosis, False, dry_run)
    if node is not None:
        fleet(settings).delete(node.zone, node.name, wait=True)
    mending.forget(root, run_id)
    return Forgotten(diagnosis, True, dry_run)


def _node_of(settings: Settings, root: Store, run_id: str) -> NodeInfo | None:
    """The node carrying the run's label in the zones in view and the run's own (when its record says them)."""
    import contextlib

    from tpuops import runs
    from tpuops.core.errors import DamagedDocument, UsageError
    from tpuops.core.naming import RUN_KEY, check_node_name
    from tpuops.session import fleet

    check_node_name(run_id, "run id")
    nodes = fleet(settings)
    zones = nodes.zones_in_view()
    with contextlib.suppress(DamagedDocument, UsageError):  # no readable record: the zones in view
        zones += [zone for zone in runs.read_record(root, run_id).zones if zone not in zones]
    listed, failed = nodes.list_zones(zones)
    if failed:
        raise next(iter(failed.values()))
    return next((node for zone in listed.values() for node in zone.values()
                 if node.managed and node.labels.get(RUN_KEY) == run_id), None)


def cost(settings: Settings, *, run_id: str | None = None, sweep_id: str | None = None,
         since: datetime | str | None = None) -> CostAndGoodput:
    """``tpuops cost``: what the ledger's nodes cost per run, sweep and UTC day, with each run's goodput.

    ``since`` may be text as the command takes it (2024-05-01, 2024-05-01T12:00; UTC when no zone).
    """
    from tpuops.api.accounting import cost_report
    from tpuops.billing.cost import parse_since

    return cost_report(settings, run_id=run_id, sweep_id=sweep_id,
                       since=parse_since(since) if isinstance(since, str) else since)
