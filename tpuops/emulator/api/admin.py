"""The admin API under ``/_admin`` (same port as the v2 API): faults, truth, and control.

=======  =====================  ==============================================================
GET      /_admin/health         {"status": "ok", "pid", "nodes"}; readiness probe of ``control``
GET      /_admin/nodes          per node: state, sandbox dir, metadata host, pgid, script runs
POST     /_admin/preempt        {project, zone, node, grace_s?} -> the node (400 unless spot/
                                preemptible and READY)
GET      /_admin/faults         the faults in force
POST     /_admin/faults         {stockout_zones, error_rate, error_code, error_burst, latency_s,
                                preempt_rate_per_s, seed, hold_deletes, ...} (``faults``): keys
                                given replace those keys
DELETE   /_admin/faults         back to no faults
GET      /_admin/billing        {"intervals": [...]} READY intervals (see ``billing``)
GET      /_admin/stats          {"counts": {"ListNodes": 3, ...}}
POST     /_admin/stats/reset    zero the counts
POST     /_admin/shutdown       stop the emulator and every process it started, once this
                                answer is written (``Connection: close``)
=======  =====================  ==============================================================

Admin requests are never counted, delayed or failed by injected faults.

The shutdown is answered before it starts: ``handle`` hands back the stop for the server to run
once the answer is written. Started from inside ``handle``, it raced the answer: the stopping
process exits while the handler thread (a daemon) may not yet have written a byte, and the
caller saw "Remote end closed connection without response".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tpuops.emulator.apierror import ApiError, invalid
from tpuops.emulator.cloud.state import EmulatorState
from tpuops.emulator.faults import Faults
from tpuops.emulator.stats import RpcStats

ADMIN_PREFIX = "/_admin/"


AfterAnswer = Callable[[], None]
"""What the server runs once the answer is written (the shutdown); see the module docstring."""


class AdminApi:
    """Answer admin requests; ``on_shutdown`` stops the emulator, run by the server after the answer."""

    def __init__(self, state: EmulatorState, faults: Faults, stats: RpcStats, on_shutdown: Callable[[], None]) -> None:
        self._state = state
        self._faults = faults
        self._stats = stats
        self._on_shutdown = on_shutdown
        self._routes: dict[tuple[str, str], Callable[[Any], dict[str, Any]]] = {
            ("GET", "health"): self._health,
            ("GET", "nodes"): lambda _: {"nodes": state.describe_nodes()},
            ("POST", "preempt"): self._preempt,
            ("GET", "faults"): lambda _: {"faults": faults.snapshot()},
            ("POST", "faults"): self._set_faults,
            ("DELETE", "faults"): self._clear_faults,
            ("GET", "billing"): lambda _: {"intervals": state.billing.records()},
            ("GET", "stats"): lambda _: {"counts": stats.snapshot()},
            ("POST", "stats/reset"): self._reset_stats,
        }

    def handle(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any], AfterAnswer | None]:
        """The status and body to answer, and what to run once they are written (None: nothing).

        Nothing that stops the emulator runs in here: a shutdown is only handed back.
        """
        route = (method, path.removeprefix(ADMIN_PREFIX).rstrip("/"))
        if route == ("POST", "shutdown"):
            return 200, {"status": "shutting down"}, self._on_shutdown
        handler = self._routes.get(route)
        if handler is None:
            return 404, ApiError("NOT_FOUND", f"No admin endpoint {method} {path}.").http_body(), None
        try:
            return 200, handler(body if body is not None else {}), None
        except ApiError as err:
            return err.http_status, err.http_body(), None

    def _health(self, _: Any) -> dict[str, Any]:
        with self._state.lock:
            count = len(self._state.nodes)
        return {"status": "ok", "pid": os.getpid(), "nodes": count}

    def _preempt(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not all(body.get(key) for key in ("project", "zone", "node")):
            raise invalid("preempt needs {project, zone, node[, grace_s]}.")
        grace = body.get("grace_s")
        if grace is not None and (not isinstance(grace, int | float) or grace < 0):
            raise invalid("grace_s must be a non-negative number of seconds.")
        return self._state.preempt(body["project"], body["zone"], body["node"], grace)

    def _set_faults(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise invalid("faults must be a JSON object.")
        self._faults.update(body)
        return {"faults": self._faults.snapshot()}

    def _clear_faults(self, _: Any) -> dict[str, Any]:
        self._faults.clear()
        return {"faults": self._faults.snapshot()}

    def _reset_stats(self, _: Any) -> dict[str, Any]:
        self._stats.reset()
        return {"counts": {}}
