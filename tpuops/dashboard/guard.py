"""The outermost layer of the dashboard: no token, no byte (401), for pages, data, live streams and actions.

A request proves the token with the session cookie (set by ``/?token=...``, which then redirects
to the same path without it, so the token leaves the address bar and the history), or with
``Authorization: Bearer <token>`` (scripts, the benchmark). See ``tpuops.dashboard.auth``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode

from starlette.responses import PlainTextResponse, RedirectResponse

from tpuops.dashboard.auth import COOKIE, cookie, same

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send


class TokenGuard:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    def _bearer(self, scope: Scope) -> str | None:
        for key, value in scope.get("headers", []):
            if key == b"authorization":
                kind, _, given = value.decode("latin-1").partition(" ")
                return given if kind.lower() == "bearer" else None
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        offered = dict(query).get("token")
        if offered is not None and same(offered, self.token):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            response = RedirectResponse(scope["path"] + (f"?{rest}" if rest else ""), status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            await response(scope, receive, send)
            return
        if same(cookie(scope.get("headers", []), COOKIE), self.token) or same(self._bearer(scope), self.token):
            await self.app(scope, receive, send)
            return
        await PlainTextResponse("401: this dashboard needs its token (printed by 'tpuops dashboard' at start, "
                                "and kept in ~/.tpuops/dashboard-token)", status_code=401)(scope, receive, send)
