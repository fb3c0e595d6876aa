"""``tpuops doctor``: one line per readiness check (OK / WARN / FAIL, with the fix); exit 1 on any FAIL."""

from __future__ import annotations

import typer

from tpuops.cli.common import load_settings

_STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "red"}


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON.")) -> None:
    """Check credentials, project, APIs, permissions, store, zones, runtimes, clock and the emulator."""
    from tpuops import api

    checkup = api.doctor(load_settings(ctx))
    checks = checkup.checks
    if as_json:
        typer.echo(checkup.to_json())
    else:
        width = max(len(check.name) for check in checks)
        for check in checks:
            fix = f"  -> fix: {check.fix}" if check.fix else ""
            status = typer.style(f"{check.status:<4}", fg=_STYLE[check.status])
            typer.echo(f"{status} {check.name:<{width}}  {check.detail}{fix}")
    raise typer.Exit(checkup.exit_code)
