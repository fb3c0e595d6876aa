"""``tpuops simulate SPEC|SWEEP``: the run or sweep on a virtual-time Cloud TPU, with the real controller."""

from __future__ import annotations

from pathlib import Path

import typer

from tpuops.cli.common import err_console, load_settings, print_json, print_table
from tpuops.core.formats import format_usd


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)


def simulate(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="An experiment (*.yaml) or a sweep file."),
    policy: str = typer.Option("spot", "--policy", help="Capacity policy of the runs: spot, on-demand, fallback "
                               "(on-demand from the first preemption) or deadline (tpuops.billing.deadline)."),
    runs: int = typer.Option(1, "--runs", help="Independent runs of the experiment to simulate (one world)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every random draw: the same seed, the same timeline."),
    cron_s: float = typer.Option(300.0, "--pass-every", help="Seconds between reconcile passes (cron: 300)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Simulate the experiment or sweep: cost, time to result and preemptions, with the real controller passes."""
    from tpuops import api

    settings = load_settings(ctx)
    say = None if as_json else (lambda text: err_console().print(text, markup=False))
    report = api.simulate(settings, path, policy=policy, runs=runs, seed=seed, cron_s=cron_s, progress=say)
    if as_json:
        print_json(report.to_json())
        return
    print_table(f"simulated {path.name} ({policy}, seed {seed})", ("run", "outcome", "preemptions", "hours to result",
                                                                   "cost"),
                [(r.run_id, r.outcome, str(r.preemptions),
                  "" if r.hours_to_result is None else f"{r.hours_to_result:,.2f}", format_usd(r.usd))
                 for r in report.runs])
    typer.echo(f"{report.simulated_s / 3600:,.1f} simulated hours in {report.wall_s:,.1f} s "
               f"({report.speedup:,.0f}x real time), {report.passes} passes, total {format_usd(report.usd)}")
