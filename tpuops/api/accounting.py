"""Accounting for the service layer: the ledger's prices joined with what the store says the runs did.

The models below compute without I/O (``tpuops.billing.cost`` prices ledger rows, ``tpuops.accounting.goodput``
splits billed time by the agent's clocks); this module is the wiring around them that
``tpuops.api`` calls: it opens the ledger and the store, reads each run's status, and refuses
launches over budget. Nothing here prints or decides a price itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpuops import runs
from tpuops.config import Settings
from tpuops.core.clock import UTC
from tpuops.core.errors import DamagedDocument, UsageError
from tpuops.session import open_ledger, store

if TYPE_CHECKING:
    from tpuops.billing.cost import CostReport
    from tpuops.launch.jobs import JobPlan
    from tpuops.runs import Goodput



@dataclass(frozen=True)
class CostAndGoodput:
    """``tpuops cost``: the ledger's report, and where each run's whole billed time went."""

    report: CostReport
    goodput: dict[str, Goodput] = field(default_factory=dict)
    """Per run id (runs whose agent reported its time accounting)."""

    def to_json(self) -> dict[str, Any]:
        return {"goodput": {run_id: split.to_json() for run_id, split in sorted(self.goodput.items())},
                **self.report.to_json()}


def cost_report(settings: Settings, *, run_id: str | None = None, sweep_id: str | None = None,
                since: datetime | None = None, now: datetime | None = None) -> CostAndGoodput:
    """The cost of the configured project's nodes recorded in the local ledger, with each run's goodput."""
    from tpuops.accounting.goodput import by_run, run_goodput
    from tpuops.billing.cost import build_report, catalog_for

    ledger, catalog, now = open_ledger(settings), catalog_for(settings), now or datetime.now(UTC)
    histories = ledger.histories(settings.project, run_id=run_id, sweep_id=sweep_id, alive_since=since)
    report = build_report(histories, catalog, now, since)
    run_ids = [total.key for total in report.runs if total.key]
    if not run_ids:
        return CostAndGoodput(report)
    # Goodput covers each run whole: the nodes ``since`` leaves out count too (one more read only then).
    whole = by_run(histories if since is None else ledger.histories(settings.project, run_id=run_id,
                                                                      sweep_id=sweep_id))
    where = store(settings)

    def status_of(rid: str) -> runs.AgentStatus | None:  # a malformed status costs its goodput, not the report
        try:
            return runs.read_status(where, rid)
        except DamagedDocument:
            return None

    statuses = runs.parallel_map(status_of, run_ids)
    found = {rid: run_goodput(whole.get(rid, []), status, catalog, now)
             for rid, status in zip(run_ids, statuses, strict=True)}
    return CostAndGoodput(report, {rid: split for rid, split in found.items() if split is not None})


def attach_goodput(settings: Settings, found: list[runs.Run], *, since: datetime | None = None) -> list[runs.Run]:
    """``found`` with each run's goodput and cost, from one ledger read (nodes alive ``since``, when given), and the
    hosts of its node, as the catalog's provider says."""
    if not found:  # ``tpuops status`` with no run going: no prices, no ledger read
        return found
    from tpuops.accounting.goodput import by_run, run_goodput
    from tpuops.billing.cost import catalog_for, node_cost
    from tpuops.providers.offers import hosts_of

    histories = by_run(open_ledger(settings).histories(settings.project, alive_since=since))
    catalog, now = catalog_for(settings), datetime.now(UTC)
    return [replace(run, goodput=run_goodput(histories.get(run.run_id, []), run.status, catalog, now),
                    usd=sum(node_cost(history, catalog, now).usd for history in histories.get(run.run_id, [])),
                    hosts=hosts_of(catalog.offers, run.accelerator) if run.record_known else None)
            for run in found]


def refuse_over_budget(settings: Settings, plan: JobPlan) -> None:
    """Refuse a launch whose projected cost exceeds what is left of the run's or the project's budget.

    The projection is the node's hourly price times the experiment's ``expected_hours``.
    """
    from tpuops.billing.cost import catalog_for, check_budget, projected_cost, spent

    catalog = catalog_for(settings)
    projected = projected_cost(plan.up.request.accelerator, plan.up.request.capacity, plan.up.zones[0],
                               plan.experiment.expected_hours, catalog)
    limits = [("run", plan.record.budget_usd, 0.0),
              ("project", settings.budget_usd, spent(open_ledger(settings), catalog, project=settings.project))]
    for scope, budget, used in limits:
        if budget is None:
            continue
        reason = check_budget(used, projected, float(budget))
        if reason:
            raise UsageError(f"{scope} budget: {reason}; raise the budget or lower expected_hours in the experiment")
