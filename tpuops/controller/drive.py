"""Drive one run to its end with the same reconcile passes that ``tpuops watch`` runs.

This is what ``tpuops train`` does unless ``--detach``: it is the controller for its own run,
so a preemption while the user watches is recovered exactly as it would be by ``watch``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuops.controller import memory as memories
from tpuops.controller.reconcile import Controller
from tpuops.jobs import LogTail, read_record, read_status


@dataclass
class Finished:
    run_id: str
    outcome: str
    reason: str
    status: dict[str, Any]
    memory: memories.Memory
    seconds: float


def drive(
    controller: Controller,
    run_id: str,
    *,
    poll_s: float,
    on_status: Callable[[dict[str, Any]], None],
    on_log: Callable[[str], None] | None = None,
) -> Finished:
    """Run passes for ``run_id`` until its memory says finished (whatever the number of preemptions)."""
    started = time.monotonic()
    record = read_record(controller.store, run_id)
    keep = bool(record.get("keep"))
    tail = LogTail(controller.store, run_id) if on_log else None
    try:
        while True:
            controller.run_pass(only=run_id)
            status = read_status(controller.store, run_id) or {}
            if status:
                on_status(status)
            if tail is not None and on_log is not None:
                for line in tail.new_lines():
                    on_log(line)
            memory, _ = memories.load(controller.store, run_id)
            if memory.phase == "finished" and (keep or not _node_left(controller, record["node"], memory)):
                return Finished(run_id, memory.outcome or "", memory.reason or "", status, memory,
                                time.monotonic() - started)
            time.sleep(poll_s)
    finally:
        controller.release()  # 'tpuops watch' may take over at once (after Ctrl-C too)


def _node_left(controller: Controller, node: str, memory: memories.Memory) -> bool:
    """Whether the finished run's node still exists (its deletion is still going on)."""
    return memory.zone is not None and controller.api.find_node(memory.zone, node) is not None
