"""``tpuops dashboard``: serve the local web app (runs, sweeps, nodes, cost) on 127.0.0.1 until Ctrl-C.

The web app stands on top of ``tpuops.api``, beside the CLI, and neither imports the other: this module
parses the command and prints where the app listens, and the program (``tpuops/__main__.py``) hands it
the server when it composes the two. The front door imports no UI, so serving it is not an ``api`` call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import typer

from tpuops.cli.common import load_settings


class Listening(Protocol):
    """What the server tells once it listens (``tpuops.dashboard.source.DashboardInfo``)."""

    url: str
    token_file: str
    read_only: bool


Serve = Callable[..., None]
"""Serves until interrupted: ``serve(settings, port=, read_only=, open_browser=, on_ready=)``."""


def register(app: typer.Typer, serve: Serve) -> None:
    """Add ``tpuops dashboard`` to ``app``, serving through ``serve``."""

    def dashboard(
        ctx: typer.Context,
        port: int = typer.Option(0, "--port", min=0, max=65535, help="Port on 127.0.0.1 (default: a free one)."),
        open_browser: bool = typer.Option(False, "--open", help="Open it in the default browser."),
        read_only: bool = typer.Option(False, "--read-only", help="Serve pages only: no action route exists."),
    ) -> None:
        """See every run, sweep, node and dollar live in a browser; the URL carries the token, printed once."""

        def ready(info: Listening) -> None:
            mode = " (read-only)" if info.read_only else ""
            typer.echo(f"tpuops dashboard{mode}: {info.url}\ntoken kept in {info.token_file} (mode 0600); Ctrl-C stops")

        serve(load_settings(ctx), port=port, read_only=read_only, open_browser=open_browser, on_ready=ready)

    app.command("dashboard")(dashboard)
