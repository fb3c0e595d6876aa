"""``tpuops cost``: what the nodes cost, per run and per UTC day, as tables, JSON or CSV."""

from __future__ import annotations

import csv
import sys
from typing import TYPE_CHECKING

import typer

from tpuops.cli.common import load_settings, print_json, print_table
from tpuops.core.formats import format_amount, format_seconds

if TYPE_CHECKING:
    from tpuops.api import CostAndGoodput, Goodput, Total

CSV_COLUMNS = ("day", "project", "zone", "node", "uid", "accelerator", "capacity", "run_id", "sweep_id",
               "ready_seconds", "usd")


def register(app: typer.Typer) -> None:
    app.command("cost")(cost)


def cost(
    ctx: typer.Context,
    run: str | None = typer.Option(None, "--run", help="Only the nodes of this run."),
    sweep: str | None = typer.Option(None, "--sweep", help="Only the nodes of this sweep."),
    since: str | None = typer.Option(None, "--since", help="Only time from this UTC date or time on "
                                                           "(2024-05-01 or 2024-05-01T12:00)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print one CSV row per node and UTC day."),
) -> None:
    """What the nodes in the ledger cost: time READY times price, per run and per UTC day."""
    from tpuops import api

    if as_json and as_csv:
        raise typer.BadParameter("choose one of --json, --csv")
    settings = load_settings(ctx)
    report = api.cost(settings, run_id=run, sweep_id=sweep, since=since)
    if as_json:
        print_json({"project": settings.project, **report.to_json()})
    elif as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(report.report.rows())
    else:
        _print_tables(settings.project, report)


def _cells(total: Total, label: str) -> list[str]:
    cells = [label, str(total.nodes), format_amount(total.ready_seconds / 3600), format_amount(total.usd)]
    if total.usd_per_hour_now is not None:
        cells.append(format_amount(total.usd_per_hour_now))
    return cells


def _goodput_cells(split: Goodput | None) -> list[str]:
    """Goodput of the whole run, the dollars interruptions cost it, and the seconds billed after its agent ended
    ('' when the agent did not say): a node left READY after its run (deletes failing in an API outage) shows
    there, and grows while it lasts."""
    if split is None:
        return ["", "", ""]
    return [split.ratio_text(), format_amount(split.lost_usd), format_seconds(split.idle_after_end_s)]


def _print_tables(project: str, found: CostAndGoodput) -> None:
    report = found.report
    since = f" since {report.since:%Y-%m-%d %H:%M} UTC" if report.since else ""
    currency = report.catalog.currency
    columns = ("nodes", "READY hours", currency)
    now = f"{currency}/h now"
    print_table(f"cost by run in {project}{since}", ("run", *columns, now, "goodput", f"lost to interruptions, "
                                                                                       f"{currency}",
                                                     "billed after its end, s"),
                [*(_cells(t, t.key or "-") + _goodput_cells(found.goodput.get(t.key or "")) for t in report.runs),
                 _cells(report.total, "total")])
    if report.sizes:  # elastic runs: what each size cost, each priced by its chips
        print_table("cost by run and size", ("run", "size", "chips", "nodes", "READY hours", currency),
                    [[s.run_id, s.accelerator, str(s.chips), str(s.nodes), format_amount(s.ready_seconds / 3600),
                      format_amount(s.usd)] for s in report.sizes])
    if report.sweeps:
        print_table("cost by sweep", ("sweep", *columns, now), [_cells(t, t.key or "-") for t in report.sweeps])
    grand = _cells(report.total, "total")[:len(columns) + 1]
    print_table("cost by UTC day", ("day", *columns), [*(_cells(t, t.key or "-") for t in report.days), grand])
