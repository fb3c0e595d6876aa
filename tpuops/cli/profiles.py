"""``tpuops profile`` and ``tpuops tensorboard``: a TensorFlow profile of a running job, and TensorBoard on it."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING

import typer

from tpuops.cli.common import JSON, err_console, load_settings, print_json, print_table

if TYPE_CHECKING:
    from tpuops.api.profiles import Capture


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
    app.command("tensorboard")(tensorboard)


def _said(capture: Capture) -> str:
    hosts = ", ".join(capture.hosts) or "no host"
    return (f"profile of steps {capture.first_step}-{capture.last_step} (attempt {capture.attempt}, "
            f"{capture.seconds:g} s) from {len(capture.hosts)} host(s): {hosts}")


def profile(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., metavar="RUN", help="The running training run to profile."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Capture this many steps from the next call."),
    seconds: float | None = typer.Option(None, "--seconds", min=0.001, help="Capture this many seconds instead."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the capture is in the store."),
    timeout: float = typer.Option(900.0, "--timeout", min=1, help="Seconds to wait for the capture."),
    list_them: bool = typer.Option(False, "--list", help="List the run's captures instead; ask for none."),
    as_json: bool = JSON,
) -> None:
    """Capture a TensorFlow profile of a running job (every worker of a slice) into the run's store folder."""
    from tpuops import api

    settings = load_settings(ctx)
    if list_them:
        found = api.list_profiles(settings, run_id)
        if as_json:
            print_json([dataclasses.asdict(c) for c in found])
        else:
            print_table(f"profiles of {run_id}", ["capture", "request", "state", "steps", "hosts", "reason"],
                        [[c.name, c.request, c.state, f"{c.first_step}-{c.last_step}", len(c.hosts), c.reason or ""]
                         for c in found])
        return
    say = err_console()
    result = api.request_profile(settings, run_id, steps=steps, seconds=seconds, wait=wait, timeout_s=timeout,
                                 progress=lambda text: None if as_json else say.print(text, markup=False))
    if isinstance(result, str):
        if as_json:
            print_json({"run_id": run_id, "request": result})
        else:
            say.print(f"asked run {run_id} for profile {result}; 'tpuops profile {run_id} --list' shows it once "
                      "captured", markup=False)
        return
    if as_json:
        print_json(dataclasses.asdict(result))
    else:
        say.print(f"{_said(result)} in {result.folder}; 'tpuops tensorboard {run_id}' shows it", markup=False,
                  soft_wrap=True)


def tensorboard(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., metavar="RUN", help="The run whose profiles and scalars to show."),
    port: int = typer.Option(6006, "--port", min=1, max=65535, help="TensorBoard's port."),
    serve: bool = typer.Option(True, "--serve/--no-serve", help="Start TensorBoard (else only copy and say how)."),
    as_json: bool = JSON,
) -> None:
    """TensorBoard (Scalars, Profile tab) on a local copy of the run's complete profiles and event files."""
    from tpuops import api

    board = api.tensorboard(load_settings(ctx), run_id, port=port)
    if as_json:
        print_json({"logdir": str(board.logdir), "argv": board.argv,
                    "profiles": [dataclasses.asdict(c) for c in board.profiles]})
    else:
        err_console().print(f"{len(board.profiles)} profile(s) of {run_id} in {board.logdir}", markup=False)
    if serve:
        sys.stdout.flush()
        os.execv(board.argv[0], board.argv)
