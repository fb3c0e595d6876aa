"""optuna-dashboard, whole, over a sweep's own study storage, inside the dashboard's origin.

optuna-dashboard's browser bundle asks for root paths (``/dashboard``, ``/api/...``,
``/static/bundle.js``), so it cannot live under a prefix. It is served at those paths instead,
and which sweep's study it shows is chosen by visiting ``/sweeps/<name>/optuna``, which sets a
cookie (``SWEEP_COOKIE``). One WSGI app per sweep (``optuna_dashboard.wsgi(storage)``, adapted
to ASGI by a2wsgi) is built on first use and kept. The dashboard's own routes never start with
those root paths. Read-only dashboards pass only GET and HEAD to it (its notes and marks write).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.responses import PlainTextResponse

from tpuops.dashboard.auth import cookie

if TYPE_CHECKING:
    from optuna.storages import BaseStorage
    from starlette.types import ASGIApp, Receive, Scope, Send

SWEEP_COOKIE = "tpuops_optuna_sweep"
ROOT_PATHS = ("/dashboard", "/api/", "/static/", "/csv/", "/favicon.ico")
"""The paths optuna-dashboard's app and bundle use; everything else is the dashboard's own."""


class OptunaMount:
    """An ASGI app dispatching optuna-dashboard's paths to the app of the sweep named by the cookie."""

    def __init__(self, storage_of: Callable[[str], BaseStorage], *, read_only: bool) -> None:
        self.storage_of = storage_of
        self.read_only = read_only
        self._apps: dict[str, ASGIApp] = {}
        self._lock = threading.Lock()

    def app_for(self, sweep: str) -> ASGIApp:
        """The sweep's optuna-dashboard (opening its storage raises ``UsageError`` for an unknown sweep)."""
        with self._lock:
            if sweep not in self._apps:
                from a2wsgi import WSGIMiddleware
                from optuna_dashboard import wsgi

                self._apps[sweep] = WSGIMiddleware(wsgi(self.storage_of(sweep)))  # type: ignore[arg-type]
            return self._apps[sweep]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sweep = cookie(scope.get("headers", []), SWEEP_COOKIE)
        if sweep is None or sweep not in self._apps:
            await PlainTextResponse("no sweep chosen: open a sweep's Optuna link on the Sweeps page first",
                                    status_code=404)(scope, receive, send)
            return
        if self.read_only and scope.get("method") not in ("GET", "HEAD"):
            await PlainTextResponse("the dashboard is read-only", status_code=405)(scope, receive, send)
            return
        await self._apps[sweep](scope, receive, send)


def is_optuna_path(path: str) -> bool:
    return path.startswith(ROOT_PATHS) or path == "/dashboard"


def wrap(own: ASGIApp, mount: OptunaMount) -> Any:
    """One ASGI app: optuna-dashboard's root paths to ``mount``, the rest to the dashboard's own app."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_optuna_path(scope["path"]):
            await mount(scope, receive, send)
        else:
            await own(scope, receive, send)

    return app
