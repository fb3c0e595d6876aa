"""``tpuops reconcile``, ``watch``, ``events`` and ``stop``: the controller from the command line."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from tpuops.cli.common import JSON, err_console, load_settings, print_json, print_table, warn
from tpuops.core.formats import format_utc

if TYPE_CHECKING:
    from tpuops.api import PassReport, Run



def register(app: typer.Typer) -> None:
    app.command("reconcile")(reconcile)
    app.command("watch")(watch)
    app.command("events")(events)
    app.command("stop")(stop)


def _say(quiet: bool) -> Callable[[str], None]:
    console = err_console()
    return (lambda _text: None) if quiet else (lambda text: console.print(text, markup=False, soft_wrap=True))


def reconcile(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the pass as JSON."),
    wake: bool = typer.Option(True, "--wake/--no-wake",
                              help="After the pass, hurry while a preempted agent's wake marker is fresh."),
) -> None:
    """One reconcile pass over every run: recover, restart, finish, reap. Safe to run from cron."""
    from tpuops import api

    report = api.reconcile(load_settings(ctx), progress=_say(as_json), wake=wake)
    if as_json:
        print_json(report.__dict__)
    else:
        err_console().print(f"{report.runs} run(s) looked at in {report.passes} pass(es), "
                            f"{len(report.acted)} action(s), "
                            f"{len(report.reaped)} orphan(s) reaped, {len(report.skipped_leased)} leased elsewhere, "
                            f"{len(report.errors)} error(s)")
        for run_id, why in report.errors.items():
            err_console().print(f"{run_id}: {why}", markup=False, soft_wrap=True)
        sweeps = report.sweeps
        if sweeps.get("advanced") or sweeps.get("errors"):
            err_console().print(f"{len(sweeps['advanced'])} sweep(s) advanced: {len(sweeps['launched'])} trial(s) "
                                f"launched, {len(sweeps['told'])} told, {len(sweeps['stopped'])} stopped, "
                                f"{len(sweeps['errors'])} error(s)")
    if report.errors or report.sweeps.get("errors") or report.sweeps.get("unlisted"):
        raise typer.Exit(1)


def watch(
    ctx: typer.Context,
    interval: float = typer.Option(30.0, "--interval", min=0.1, max=86400, help="Seconds between passes."),
    passes: int = typer.Option(0, "--passes", min=0, max=1_000_000,
                               help="Stop after this many passes (0: run until Ctrl-C)."),
    wake: bool = typer.Option(True, "--wake/--no-wake",
                              help="Between passes, wake at once on a preempted agent's wake marker."),
) -> None:
    """Reconcile in a loop: every preempted run comes back, every finished run's node goes."""
    from tpuops import api

    settings = load_settings(ctx)  # a target held back is said here, before the first pass, and after each pass

    def shown(done: int, report: PassReport) -> None:
        if report.acted or report.reaped:
            err_console().print(f"pass {done}: {len(report.acted)} action(s), {len(report.reaped)} reaped")
        if not passes or done < passes:
            for line in api.held_back_lines(settings):
                warn(line)

    try:
        api.watch(settings, interval_s=interval, passes=passes, progress=_say(False), on_pass=shown, wake=wake)
    except KeyboardInterrupt:
        err_console().print("stopped watching; runs go on, 'tpuops watch' again picks them up")


def events(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="Run name."),
    as_json: bool = typer.Option(False, "--json", help="Print events as JSON."),
) -> None:
    """Every decision the controller took for a run: creates, preemptions, restarts, the end."""
    from tpuops import api

    memory = api.events(load_settings(ctx), run_id)
    if as_json:
        print_json({"run_id": run_id, "phase": memory.phase, "outcome": memory.outcome, "attempts": memory.attempts,
                    "preemptions": memory.preemptions, "restarts": memory.crashes, "events": memory.events,
                    "notices": [notice.summary() for notice in memory.notices]})
        return
    print_table(f"events of {run_id} ({memory.phase}{', ' + memory.outcome if memory.outcome else ''})",
                ("time (UTC)", "event", "detail"),
                [(format_utc(e["at"]), e["kind"], e["message"])
                 for e in memory.events])


def _print_stop_plan(found: list[Run], sweep: str | None, as_json: bool) -> None:
    """``stop --dry-run``: each run it would stop (or that ended already) and its node, as a table or JSON; with
    ``--sweep``, that the sweep would launch no more trials, also when none of its runs is still going."""
    rows = [{"run_id": r.run_id, "would_stop": not r.finished, "phase": r.phase,
             "outcome": r.outcome.value if r.outcome else None, "node": None if r.finished else r.record.node_name}
            for r in found]
    if as_json:
        print_json({"sweep": sweep, "runs": rows})
        return
    title = f"stop --dry-run: sweep {sweep} would launch no more trials" if sweep else "stop --dry-run"
    print_table(title, ("run", "would stop", "phase or ending", "node to delete"),
                [(row["run_id"], "yes" if row["would_stop"] else "no (ended)", row["outcome"] or row["phase"],
                  row["node"] or "") for row in rows])
    if not rows:
        err_console().print(f"sweep {sweep}: no run still going to stop" if sweep else "nothing to stop")


def stop(
    ctx: typer.Context,
    run_ids: list[str] | None = typer.Argument(None, help="Runs to stop."),
    sweep: str | None = typer.Option(None, "--sweep", help="Stop every run of this sweep still going (and the sweep)."),
    no_wait: bool = typer.Option(False, "--no-wait", help="Return once the stop is asked for."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would stop; write nothing."),
    as_json: bool = JSON,
) -> None:
    """Stop runs for good: each checkpoints and its node is deleted, whoever drives it; 'train --resume' goes on."""
    from tpuops import api

    settings = load_settings(ctx)
    if dry_run:
        _print_stop_plan(api.plan_stop(settings, list(run_ids or []), sweep=sweep), sweep, as_json)
        return
    stopped = api.stop(settings, list(run_ids or []), sweep=sweep, wait=not no_wait, progress=_say(as_json))
    if as_json:
        print_json({"runs": [s.to_json() for s in stopped]})
        return
    for s in stopped:
        err_console().print(s.text, markup=False, soft_wrap=True)
    if not stopped:
        err_console().print(f"sweep {sweep}: no run still going to stop")
