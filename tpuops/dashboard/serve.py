"""Serve the dashboard with uvicorn on 127.0.0.1 until interrupted.

The socket is bound and listening before ``on_ready`` is told the URL, so a caller (a test, the
benchmark, ``--open``) can connect the moment it hears of it. Only loopback is ever bound.
"""

from __future__ import annotations

import socket
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuops.core.errors import UsageError
from tpuops.dashboard.app import ACTION_PATHS, Dashboard
from tpuops.dashboard.auth import issue_token
from tpuops.dashboard.source import DashboardInfo, Source, bound_source

if TYPE_CHECKING:
    from tpuops.config import Settings

HOST = "127.0.0.1"
GRACE_S = 2
"""Seconds open pages get at Ctrl-C: a live stream never ends by itself, so shutdown does not wait for it."""


def listen(port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` (0: a free port); ``UsageError`` when it is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as err:
        sock.close()
        raise UsageError(f"cannot listen on {HOST}:{port} ({err.strerror}); pick another --port") from None
    sock.listen(128)
    return sock


def server(app: Any) -> Any:
    """uvicorn serving ``app`` quietly; run it with ``.run(sockets=[listen(port)])``, stop it with ``should_exit``."""
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                         timeout_graceful_shutdown=GRACE_S))


def serve(source: Source, *, token_file: Path, port: int, read_only: bool, refresh_s: float,
          open_browser: bool, on_ready: Callable[[DashboardInfo], None] | None) -> None:
    """Listen first (a taken port leaves nothing behind), then make the token and serve until interrupted."""
    sock = listen(port)
    token = issue_token(token_file)
    base = f"http://{HOST}:{sock.getsockname()[1]}"
    app = Dashboard(source, token=token, read_only=read_only, refresh_s=refresh_s).asgi()
    info = DashboardInfo(url=f"{base}/?token={token}", token=token, token_file=str(token_file),
                         read_only=read_only, routes=[] if read_only else list(ACTION_PATHS))
    if on_ready is not None:
        on_ready(info)
    if open_browser:
        webbrowser.open(info.url)
    server(app).run(sockets=[sock])

def dashboard(settings: Settings, *, port: int = 0, read_only: bool = False, open_browser: bool = False,
              refresh_s: float = 1.0, on_ready: Callable[[DashboardInfo], None] | None = None) -> None:
    """``tpuops dashboard``: serve the web app on 127.0.0.1 until interrupted (``port`` 0: a free one).

    The token is made once per start and kept in ``<home>/dashboard-token`` (mode 0600); ``on_ready``
    gets the URL carrying it. ``read_only`` serves no action route at all.
    """
    serve(bound_source(settings), token_file=settings.home.expanduser() / "dashboard-token", port=port,
          read_only=read_only, refresh_s=refresh_s, open_browser=open_browser, on_ready=on_ready)
