"""``tpuops sweep start|status|stop|report|list``: hyperparameter sweeps whose trials are runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tpuops.cli.common import DRY_RUN, JSON, err_console, load_settings, out_console, print_json, print_table
from tpuops.cli.forecasts import print_forecast

if TYPE_CHECKING:
    from tpuops.api import SweepStatus

NAME = typer.Argument(..., help="Sweep name.")
app = typer.Typer(help="Hyperparameter sweeps (Optuna) whose trials are spot TPU runs, advanced by reconcile passes.",
                  no_args_is_help=True)


@app.command("start")
def start(
    ctx: typer.Context,
    spec: Path = typer.Argument(..., help="Sweep spec, e.g. sweeps/digits_lr.yaml."),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Declare the sweep and launch its first trials; every reconcile pass (cron, watch) advances it."""
    from tpuops import api

    settings = load_settings(ctx, starts=True)
    if dry_run:
        found = api.forecast_sweep(settings, spec)
        summary, forecast = found.plan.summary(), found.forecast.to_json()
        if as_json:
            print_json({**summary, "dry_run": True, "forecast": forecast})
        else:
            _print_plan(summary, dry_run=True)
            print_forecast(forecast, f"sweep {summary['sweep']}")
        return
    say = (lambda _t: None) if as_json else (lambda t: err_console().print(t, markup=False, soft_wrap=True))
    started = api.sweep_start(settings, spec, progress=say)
    plan, launched = started.plan, started.launched
    summary = plan.summary()
    if as_json:
        print_json({**summary, "launched": launched, "advanced_by": "tpuops reconcile"})
        return
    _print_plan(summary, dry_run=False)
    err_console().print(f"launched {', '.join(launched) or 'nothing yet'}. The sweep advances with every "
                        "'tpuops reconcile' pass, from any machine sharing the store: 'tpuops schedule install' "
                        "runs one every 5 minutes (cron), or keep 'tpuops watch' running. "
                        f"Follow it with 'tpuops sweep status {plan.spec.name}'.", soft_wrap=True)


def _print_plan(summary: dict[str, object], *, dry_run: bool) -> None:
    title = f"sweep {summary['sweep']}" + (" (dry run: nothing created)" if dry_run else "")
    print_table(title, ("setting", "value"), [(k, v) for k, v in summary.items() if k != "sweep"])


@app.command("status")
def status(
    ctx: typer.Context,
    name: str = NAME,
    as_json: bool = JSON,
) -> None:
    """Trials (params, state, step, objective, preemptions, cost, goodput, lost to interruptions), progress, spend."""
    from tpuops import api

    result = api.sweep_status(load_settings(ctx), name)
    if as_json:
        print_json(result.to_json())
        return
    _print_trials(result)
    _print_progress(result)


def _print_trials(result: SweepStatus) -> None:
    from tpuops.core.formats import format_params, format_usd

    title = f"sweep {result.name}: {result.phase}" + (f", {result.outcome} ({result.reason})" if result.outcome else "")
    print_table(title, ("trial", "run", "params", "state", "step", result.metric, "preemptions", "cost", "goodput",
                        "lost"),
                [(r.number, r.run_id, format_params(r.params), r.state, r.step,
                  "" if r.value is None else f"{r.value:.4f}", r.preemptions, format_usd(r.cost_usd),
                  "" if r.goodput is None else f"{r.goodput:.2f}", format_usd(r.lost_usd)) for r in result.trials])


def _print_progress(result: SweepStatus) -> None:
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    from tpuops.core.formats import format_usd

    counts = result.counts
    ended = counts["COMPLETE"] + counts["PRUNED"] + counts["FAIL"]
    table = Table.grid(padding=(0, 2))
    table.add_row("trials ended", ProgressBar(total=result.wanted, completed=ended, width=30),
                  f"{ended}/{result.wanted}: {counts['COMPLETE']} complete, {counts['PRUNED']} pruned, "
                  f"{counts['FAIL']} failed; {counts['RUNNING']} running")
    if result.budget_usd:
        used = min(result.spent_usd, result.budget_usd)
        table.add_row("spend", ProgressBar(total=result.budget_usd, completed=used, width=30),
                      f"{format_usd(result.spent_usd)} of {format_usd(result.budget_usd)}")
    else:
        table.add_row("spend", "", format_usd(result.spent_usd))
    if result.best is not None:
        table.add_row("best", "", f"trial {result.best.number} {result.metric}={result.best.value:.4f} "
                                  f"({result.best_model})")
    if result.waiting:
        table.add_row("waiting", "", result.waiting)
    table.add_row("last pass", "", result.last_pass or "none yet")
    out_console().print(table)


@app.command("stop")
def stop(
    ctx: typer.Context,
    name: str = NAME,
    as_json: bool = JSON,
) -> None:
    """No new trials; the next pass stops the running ones (they checkpoint) and ends the sweep."""
    from tpuops import api

    state = api.sweep_stop(load_settings(ctx), name)
    if as_json:
        print_json({"sweep": name, "phase": state.phase, "outcome": state.outcome})
    elif state.finished:
        err_console().print(f"sweep {name} had already ended ({state.outcome})")
    else:
        err_console().print(f"sweep {name} is stopping: the next 'tpuops reconcile' pass stops its running trials")


@app.command("report")
def report(
    ctx: typer.Context,
    name: str = NAME,
    out: Path | None = typer.Option(None, "--out", help="Write PNG plots and report.html into this folder."),
    as_json: bool = JSON,
) -> None:
    """Trials, the best trial and its model, and plots (PNG + one self-contained HTML page)."""
    from tpuops import api

    result, files = api.sweep_report(load_settings(ctx), name, out)
    if as_json:
        print_json({**result.to_json(), "files": [str(f) for f in files]})
        return
    _print_trials(result)
    _print_progress(result)
    for path in files:
        err_console().print(f"wrote {path}", markup=False)


@app.command("list")
def list_sweeps(ctx: typer.Context, as_json: bool = JSON) -> None:
    """Every sweep in the store, with its phase and outcome."""
    from tpuops import api

    rows = api.sweep_list(load_settings(ctx))
    if as_json:
        print_json(rows)
    else:
        print_table("sweeps", ("sweep", "phase", "outcome", "last pass"),
                    [(r["sweep"], r["phase"], r["outcome"], r["last_pass"]) for r in rows])
        for r in rows:
            if r["damaged"]:
                err_console().print(f"{r['sweep']}: damaged: {r['damaged']}", markup=False, soft_wrap=True)


@app.command("repair")
def repair(
    ctx: typer.Context,
    name: str = NAME,
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what is damaged."),
    as_json: bool = JSON,
) -> None:
    """Rebuild a damaged sweep's state.json from its active marker, and upgrade a sweep.json of an older format with
    tpuops.toml's project and store root; a damaged sweep.json cannot be rebuilt, and the sweep is taken off the
    passes' list (its trials go on as runs; exit 1)."""
    from tpuops import api

    result = api.sweep_repair(load_settings(ctx), name, dry_run=dry_run)
    if as_json:
        print_json(result)
    elif not result["damaged"]:
        err_console().print(f"sweep {name} is not damaged: nothing to repair")
    else:
        for document, why in result["damaged"].items():
            err_console().print(f"{document}: {why}", markup=False, soft_wrap=True)
        for line in result["done"]:
            err_console().print(f"done: {line}", markup=False, soft_wrap=True)
    if not result["repairable"]:
        raise typer.Exit(1)


def register(app_: typer.Typer) -> None:
    app_.add_typer(app, name="sweep")
