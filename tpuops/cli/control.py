"""``tpuops reconcile``, ``watch`` and ``events``: the controller from the command line."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import typer

from tpuops.cli.common import err_console, load_settings, print_json, print_table

UTC = timezone.utc  # datetime.UTC exists from Python 3.11 only

if TYPE_CHECKING:
    from tpuops.controller.reconcile import Controller


def register(app: typer.Typer) -> None:
    app.command("reconcile")(reconcile)
    app.command("watch")(watch)
    app.command("events")(events)


def _controller(ctx: typer.Context, quiet: bool) -> Controller:
    from tpuops.controller.reconcile import Controller
    from tpuops.session import connect, open_ledger, store

    settings = load_settings(ctx)
    console = err_console()
    say = (lambda _text: None) if quiet else (lambda text: console.print(text, markup=False, soft_wrap=True))
    return Controller(settings, store(settings), connect(settings), open_ledger(settings), progress=say)


def reconcile(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the pass as JSON."),
) -> None:
    """One reconcile pass over every run: recover, restart, finish, reap. Safe to run from cron."""
    controller = _controller(ctx, as_json)
    try:
        report = controller.run_pass()
    finally:
        controller.release()
    if as_json:
        print_json(report.__dict__)
    else:
        err_console().print(f"{report.runs} run(s) looked at, {len(report.acted)} action(s), "
                            f"{len(report.reaped)} orphan(s) reaped, {len(report.skipped_leased)} leased elsewhere, "
                            f"{len(report.errors)} error(s)")
        for run_id, why in report.errors.items():
            err_console().print(f"{run_id}: {why}", markup=False, soft_wrap=True)
    if report.errors:
        raise typer.Exit(1)


def watch(
    ctx: typer.Context,
    interval: float = typer.Option(30.0, "--interval", min=0.1, help="Seconds between passes."),
    passes: int = typer.Option(0, "--passes", min=0, help="Stop after this many passes (0: run until Ctrl-C)."),
) -> None:
    """Reconcile in a loop: every preempted run comes back, every finished run's node goes."""
    controller = _controller(ctx, False)
    done = 0
    try:
        while True:
            started = time.monotonic()
            report = controller.run_pass()
            done += 1
            if report.acted or report.reaped:
                err_console().print(f"pass {done}: {len(report.acted)} action(s), {len(report.reaped)} reaped")
            if passes and done >= passes:
                return
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        err_console().print("stopped watching; runs go on, 'tpuops watch' again picks them up")
    finally:
        controller.release()


def events(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="Run name."),
    as_json: bool = typer.Option(False, "--json", help="Print events as JSON."),
) -> None:
    """Every decision the controller took for a run: creates, preemptions, restarts, the end."""
    from tpuops.controller import memory as memories
    from tpuops.jobs import read_record
    from tpuops.session import store

    root = store(load_settings(ctx))
    read_record(root, run_id)
    memory, _ = memories.load(root, run_id)
    if as_json:
        print_json({"run_id": run_id, "phase": memory.phase, "outcome": memory.outcome, "attempts": memory.attempts,
                    "preemptions": memory.preemptions, "restarts": memory.crashes, "events": memory.events})
        return
    print_table(f"events of {run_id} ({memory.phase}{', ' + memory.outcome if memory.outcome else ''})",
                ("time (UTC)", "event", "detail"),
                [(datetime.fromtimestamp(e["at"], UTC).strftime("%Y-%m-%d %H:%M:%S"), e["kind"], e["message"])
                 for e in memory.events])
