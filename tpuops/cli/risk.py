"""``tpuops risk``: preemption risk learned from the ledger, per zone, accelerator and capacity."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from tpuops.cli.common import load_settings, print_json, print_table
from tpuops.core.formats import format_amount

if TYPE_CHECKING:
    from tpuops.api import Risk


def register(app: typer.Typer) -> None:
    app.command("risk")(risk)


def risk(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the table as JSON.")) -> None:
    """How often nodes were preempted per READY hour (95 % interval), how long creates took, stockouts."""
    from tpuops import api

    settings = load_settings(ctx)
    risks = api.risk(settings)
    if as_json:
        print_json({"project": settings.project, "assumed_spot_preemptions_per_hour":
                    settings.spot_preemptions_per_hour, "risks": [r.to_json() for r in risks]})
        return
    print_table(f"preemption risk in {settings.project} (from the ledger)",
                ("zone", "accelerator", "capacity", "nodes", "READY hours", "preemptions", "per READY hour",
                 "95 % interval", "create->READY p50/p90 s", "stockouts (failed creates)"),
                [_row(r) for r in risks])
    if any(r.assumed for r in risks) or not risks:
        typer.echo(f"assumed: {settings.spot_preemptions_per_hour:g} preemptions per READY hour for spot and "
                   "preemptible capacity without history (spot_preemptions_per_hour in tpuops.toml); "
                   "0 for on-demand")


def _row(risk: Risk) -> list[str]:
    latency = risk.latency_quantiles()
    interval = "" if risk.low is None or risk.high is None else \
        f"{format_amount(risk.low)} - {format_amount(risk.high)}"
    return [risk.key.zone, risk.key.accelerator, risk.key.capacity, str(risk.nodes), format_amount(risk.ready_hours),
            str(risk.preemptions), format_amount(risk.rate_per_hour) + (" (assumed)" if risk.assumed else ""),
            interval, "" if latency is None else f"{latency[0]:.0f} / {latency[1]:.0f}",
            f"{len(risk.stockouts)} ({risk.failed_creates})"]
