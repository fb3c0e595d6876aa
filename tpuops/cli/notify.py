"""``tpuops notify test``: one test message to every configured target, and per target what happened."""

from __future__ import annotations

import typer

from tpuops.cli.common import JSON, load_settings, print_json

app = typer.Typer(help="Notifications by webhook or email (docs/notifications.md).", no_args_is_help=True)


@app.command("test")
def test(ctx: typer.Context, as_json: bool = JSON) -> None:
    """Send one test message to every target of [notify.targets]; exit 1 if any failed."""
    from tpuops import api

    tested = api.notify_test(load_settings(ctx, starts=True))
    if as_json:
        print_json({"targets": tested.targets})
    else:
        for row in tested.targets:
            typer.echo(f"{row['target']} ({row['kind']}): {row['result']}")
    raise typer.Exit(tested.exit_code)
