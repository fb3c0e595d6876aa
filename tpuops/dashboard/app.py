"""The dashboard's web app (Starlette): pages, the data API, live streams and, unless read-only, actions.

Routes (all behind ``TokenGuard``: 401 without the token):

- pages: ``/runs`` (first paint from the run index alone: ids, then rows fetched in pages with a
  progress line), ``/runs/<id>`` (the shell at once, its timeline panel fetched with progress),
  ``/sweeps`` and ``/sweeps/<name>`` (the shell at once, the list or the trials table fetched with
  progress: a sweep's status reads every trial's run and ledger intervals), ``/nodes``, ``/cost``;
- data: ``/data/runs?ids=a,b``, ``/data/runs/<id>/panel``, ``/data/sweeps``, ``/data/sweeps/<name>``,
  ``/data/nodes``, ``/data/cost``;
- live (server-sent events): ``/live/runs`` (an active run's status or marker changed),
  ``/live/runs/<id>`` (its new log lines, and ``changed`` when its status did);
- actions, POST with the CSRF header and a confirmation repeating the target, absent with
  ``read_only``: ``/actions/sweeps/<name>/stop``, ``/actions/runs/<id>/stop``,
  ``/actions/nodes/<zone>/<name>/delete``;
- optuna-dashboard over a sweep's study: ``/sweeps/<name>/optuna`` chooses it (``optuna_mount``).

Every store read runs in a worker thread; live streams poll at ``refresh_s`` only while a page is
open, so an idle dashboard reads nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from tpuops.core.clock import UTC
from tpuops.core.errors import NotFound, TpuopsError, UsageError
from tpuops.core.formats import strict_json
from tpuops.dashboard import svg, views
from tpuops.dashboard.auth import CSRF_HEADER, csrf_value, same
from tpuops.dashboard.guard import TokenGuard
from tpuops.dashboard.optuna_mount import SWEEP_COOKIE, OptunaMount, wrap
from tpuops.dashboard.source import Source

HERE = Path(__file__).parent
PAGE_ROWS = 200
"""Rows the Runs page asks for per request: enough to fill the screen fast, small enough to show progress."""
ACTION_PATHS = ("/actions/sweeps/{name}/stop", "/actions/runs/{run_id}/stop", "/actions/nodes/{zone}/{name}/delete")


class _JSON(JSONResponse):
    """Strict JSON whatever a run reported: NaN and infinities as null, named in ``non_finite`` (``strict_json``)."""

    def render(self, content: Any) -> bytes:
        return super().render(strict_json(content))


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(strict_json(data), allow_nan=False)}\n\n"


class Dashboard:
    """The routes over one ``Source``; ``asgi()`` is the app to serve."""

    def __init__(self, source: Source, *, token: str, read_only: bool, refresh_s: float) -> None:
        self.source = source
        self.token = token
        self.read_only = read_only
        self.refresh_s = refresh_s
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.optuna = OptunaMount(source.sweep_storage, read_only=read_only)

    # -- pages ----------------------------------------------------------------------------------

    def _page(self, request: Request, name: str, **context: Any) -> Response:
        return self.templates.TemplateResponse(request, name, {
            "csrf": csrf_value(self.token), "read_only": self.read_only, "page_rows": PAGE_ROWS, **context})

    async def runs_page(self, request: Request) -> Response:
        ids = await run_in_threadpool(self.source.run_ids)
        return self._page(request, "runs.html", ids=ids, sweep=request.query_params.get("sweep", ""),
                          phase=request.query_params.get("phase", ""))

    async def run_page(self, request: Request) -> Response:
        return self._page(request, "run.html", run_id=request.path_params["run_id"])

    async def sweeps_page(self, request: Request) -> Response:
        return self._page(request, "sweeps.html")

    async def sweep_page(self, request: Request) -> Response:
        return self._page(request, "sweep.html", sweep=request.path_params["name"])

    async def nodes_page(self, request: Request) -> Response:
        return self._page(request, "nodes.html", nodes=await self._nodes())

    async def cost_page(self, request: Request) -> Response:
        report = (await run_in_threadpool(self.source.cost)).report
        return self._page(request, "cost.html", report=report)

    async def choose_optuna(self, request: Request) -> Response:
        name = request.path_params["name"]
        await run_in_threadpool(self.optuna.app_for, name)
        response = RedirectResponse("/dashboard", status_code=303)
        response.set_cookie(SWEEP_COOKIE, name, httponly=True, samesite="strict")
        return response

    # -- data -----------------------------------------------------------------------------------

    async def runs_data(self, request: Request) -> Response:
        ids = [i for i in request.query_params.get("ids", "").split(",") if i][:PAGE_ROWS]
        found = await run_in_threadpool(self.source.run_rows, ids)
        now = datetime.now(UTC)
        return _JSON([views.run_row(run, now) for run in found])

    async def run_panel(self, request: Request) -> Response:
        detail = await run_in_threadpool(self.source.run_detail, request.path_params["run_id"])
        goodput = detail.run.goodput
        parts = [(name[:-2], getattr(goodput, name)) for name in goodput.PARTS] if goodput else []
        return _JSON({
            "row": views.run_row(detail.run, datetime.now(UTC)),
            "timeline": svg.timeline_svg(detail.timeline),
            "goodput": svg.stacked_bar_svg(parts),
            "goodput_text": goodput.summary() if goodput else "no billed time yet",
            "recoveries": [round(r.seconds, 1) for r in detail.timeline.recoveries],
            "cost_usd": round(detail.cost_usd, 6),
            "events": [{"at": datetime.fromtimestamp(e["at"], UTC).isoformat(timespec="seconds"),
                        "kind": e["kind"], "message": e["message"]} for e in detail.run.memory.events],
            "notices": [views.notice_row(notice) for notice in detail.run.memory.notices],
        })

    async def sweeps_data(self, _request: Request) -> Response:
        return _JSON(await run_in_threadpool(self.source.sweeps))

    async def sweep_data(self, request: Request) -> Response:
        status = await run_in_threadpool(self.source.sweep, request.path_params["name"])
        return _JSON(status.to_json())

    async def _nodes(self) -> list[dict[str, Any]]:
        now = datetime.now(UTC)
        return [views.node_row(row, now) for row in await run_in_threadpool(self.source.nodes)]

    async def nodes_data(self, _request: Request) -> Response:
        return _JSON(await self._nodes())

    async def cost_data(self, _request: Request) -> Response:
        return _JSON((await run_in_threadpool(self.source.cost)).to_json())

    # -- live -----------------------------------------------------------------------------------

    def _stream(self, events: AsyncIterator[str]) -> Response:
        """An event stream; Starlette ends it (and so its polling) when the page goes away."""
        async def opened() -> AsyncIterator[str]:
            yield ": connected\n\n"
            async for chunk in events:
                yield chunk

        return StreamingResponse(opened(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def live_runs(self, _request: Request) -> Response:
        async def changes() -> AsyncIterator[str]:
            seen: dict[str, int] = {}
            while True:
                marks = await run_in_threadpool(self.source.watch_marks)
                changed = [run_id for run_id, gen in marks.items() if seen.get(run_id) != gen]
                gone = [run_id for run_id in seen if run_id not in marks]
                if seen and (changed or gone):
                    yield _sse("runs", {"changed": changed + gone})
                else:
                    yield ": tick\n\n"
                seen = marks
                await asyncio.sleep(self.refresh_s)

        return self._stream(changes())

    async def live_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        tail = await run_in_threadpool(self.source.log_tail, run_id)

        async def changes() -> AsyncIterator[str]:
            seen: int | None = None
            while True:
                lines = await run_in_threadpool(tail.new_lines)
                if lines:
                    yield _sse("log", lines)
                marks = await run_in_threadpool(self.source.watch_marks)
                generation = marks.get(run_id, -1)
                if seen is not None and generation != seen:
                    yield _sse("changed", {"run_id": run_id})
                elif not lines:
                    yield ": tick\n\n"
                seen = generation
                await asyncio.sleep(self.refresh_s)

        return self._stream(changes())

    # -- actions --------------------------------------------------------------------------------

    async def _act(self, request: Request, target: str, act: Callable[[], str]) -> Response:
        if not same(request.headers.get(CSRF_HEADER), csrf_value(self.token)):
            return _JSON({"error": f"missing or wrong {CSRF_HEADER} header (reload the page)"},
                                status_code=403)
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("confirm") != target:
            return _JSON({"error": f"confirm by sending {{\"confirm\": \"{target}\"}}: the name of what "
                                          "you act on, repeated"}, status_code=400)
        return _JSON({"done": await run_in_threadpool(act)})

    async def stop_sweep(self, request: Request) -> Response:
        name = request.path_params["name"]
        return await self._act(request, name, lambda: self.source.stop_sweep(name))

    async def stop_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        return await self._act(request, run_id, lambda: self.source.stop_run(run_id))

    async def delete_node(self, request: Request) -> Response:
        zone, name = request.path_params["zone"], request.path_params["name"]
        return await self._act(request, name, lambda: self.source.delete_orphan(zone, name))

    # -- the app --------------------------------------------------------------------------------

    def routes(self) -> list[Route | Mount]:
        found = [
            Route("/", lambda _r: RedirectResponse("/runs", status_code=303)),
            Route("/runs", self.runs_page), Route("/runs/{run_id}", self.run_page),
            Route("/sweeps", self.sweeps_page), Route("/sweeps/{name}", self.sweep_page),
            Route("/sweeps/{name}/optuna", self.choose_optuna),
            Route("/nodes", self.nodes_page), Route("/cost", self.cost_page),
            Route("/data/runs", self.runs_data), Route("/data/runs/{run_id}/panel", self.run_panel),
            Route("/data/sweeps", self.sweeps_data), Route("/data/sweeps/{name}", self.sweep_data),
            Route("/data/nodes", self.nodes_data), Route("/data/cost", self.cost_data),
            Route("/live/runs", self.live_runs), Route("/live/runs/{run_id}", self.live_run),
            Mount("/assets", StaticFiles(directory=str(HERE / "static")), name="assets"),
        ]
        if not self.read_only:
            found += [Route(path, handler, methods=["POST"]) for path, handler in
                      zip(ACTION_PATHS, (self.stop_sweep, self.stop_run, self.delete_node), strict=True)]
        return found

    def asgi(self) -> Any:
        own = Starlette(routes=self.routes(), exception_handlers={
            UsageError: _bad_input, NotFound: _not_found, TpuopsError: _failed})
        return TokenGuard(wrap(own, self.optuna), self.token)


async def _bad_input(_request: Request, err: Exception) -> Response:
    return _JSON({"error": str(err)}, status_code=400)


async def _not_found(_request: Request, err: Exception) -> Response:
    return _JSON({"error": str(err)}, status_code=404)


async def _failed(_request: Request, err: Exception) -> Response:
    return _JSON({"error": str(err)}, status_code=502)
