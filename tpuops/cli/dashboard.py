"""``tpuops dashboard``: serve the local web app (runs, sweeps, nodes, cost) on 127.0.0.1 until Ctrl-C.

The web app stands on top of ``tpuops.api``, beside the CLI: this command starts it (``tpuops.dashboard``)
rather than calling a front-door function, since the front door imports no UI."""

from __future__ import annotations

import typer

from tpuops.cli.common import load_settings


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)


def dashboard(
    ctx: typer.Context,
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port on 127.0.0.1 (default: a free one)."),
    open_browser: bool = typer.Option(False, "--open", help="Open it in the default browser."),
    read_only: bool = typer.Option(False, "--read-only", help="Serve pages only: no action route exists."),
) -> None:
    """See every run, sweep, node and dollar live in a browser; the URL carries the token, printed once."""
    from tpuops.dashboard.serve import dashboard as serve
    from tpuops.dashboard.source import DashboardInfo

    def ready(info: DashboardInfo) -> None:
        mode = " (read-only)" if info.read_only else ""
        typer.echo(f"tpuops dashboard{mode}: {info.url}\ntoken kept in {info.token_file} (mode 0600); Ctrl-C stops")

    serve(load_settings(ctx), port=port, read_only=read_only, open_browser=open_browser, on_ready=ready)
