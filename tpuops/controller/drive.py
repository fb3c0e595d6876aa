"""Drive one run to its end with the same reconcile passes that ``tpuops watch`` runs.

This is what ``tpuops train`` does unless ``--detach``: it is the controller for its own run,
so a preemption while the user watches is recovered exactly as it would be by ``watch``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from tpuops import runs
from tpuops.accounting.goodput import run_goodput
from tpuops.billing.cost import catalog_for
from tpuops.controller.reconcile import Controller, PassReport
from tpuops.core.errors import DamagedDocument, TransientError
from tpuops.runs import AgentStatus, Goodput, Memory, Outcome, RunRecord


@dataclass
class Finished:
    """How a driven run ended: the controller's outcome and why, the agent's last status, the memory."""

    run_id: str
    outcome: Outcome
    reason: str
    status: AgentStatus
    memory: Memory
    seconds: float
    record: RunRecord
    goodput: Goodput | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome is Outcome.SUCCEEDED

    def target_met(self) -> bool | None:
        """Whether a succeeded training run reached its experiment's target (None: no target or no success)."""
        target = self.record.target
        if not target or self.outcome is not Outcome.SUCCEEDED:
            return None
        value = self.status.eval_metric(target["metric"])
        return value is not None and (target.get("at_least") is None or value >= target["at_least"]) and (
            target.get("at_most") is None or value <= target["at_most"])


def drive(
    controller: Controller,
    run_id: str,
    *,
    poll_s: float,
    on_status: Callable[[AgentStatus], None],
    on_log: Callable[[str], None] | None = None,
) -> Finished:
    """Run passes for ``run_id`` until its memory says finished (whatever the number of preemptions).

    A launch that the API answers nothing for gives up (``give_up``): the run is withdrawn and the error says so.

    A damaged document does not end the drive: a status that cannot be read is read again at the next pass
    (the agent rewrites it whole), and so is a damaged memory while the run's node lives (the pass leaves
    that node to its agent, ``damaged.damaged_verdict``, and ``tpuops runs repair`` may fix the memory
    meanwhile). A memory still damaged once the node is gone ends the drive with the ``DamagedDocument``.
    """
    started = time.monotonic()
    record = runs.read_record(controller.store, run_id)
    tail = runs.LogTail(controller.store, run_id) if on_log else None
    status: AgentStatus | None = None
    failing_since: float | None = None  # since when every pass failed to list the run's zones
    asked = runs.load_memory(controller.store, run_id)[0].attempts  # nodes asked for before this drive
    try:
        while True:
            report = controller.run_pass(only=run_id)
            failing_since = failing(failing_since, report, record.zones, time.monotonic())
            with contextlib.suppress(DamagedDocument):  # the pass said so; the next one reads it again
                status = runs.read_status(controller.store, run_id)
                if status is not None:
                    on_status(status)
            if tail is not None and on_log is not None:
                for line in tail.new_lines():
                    on_log(line)
            try:
                memory, _ = runs.load_memory(controller.store, run_id)
            except DamagedDocument as err:
                if any(controller.nodes.find(zone, record.node_name) for zone in record.zones):
                    time.sleep(poll_s)
                    continue
                raise DamagedDocument(f"{err}; its node is gone ({runs.repair_hint(run_id)})",
                                      where=err.where) from None
            if memory.finished and (record.keep or not node_left(controller, record.node_name, memory)):
                return Finished(run_id, Outcome(memory.outcome or Outcome.FAILED), memory.reason or "",
                                status or AgentStatus(), memory, time.monotonic() - started, record,
                                run_goodput(controller.ledger.histories(controller.settings.project, run_id=run_id),
                                            status, catalog_for(controller.settings)))
            if give_up(memory, failing_since, time.monotonic(), controller.settings.launch_give_up_s, asked=asked):
                raise withdraw(controller, [run_id], controller.settings.launch_give_up_s)
            time.sleep(poll_s)
    finally:
        controller.release()  # 'tpuops watch' may take over at once (after Ctrl-C too)


def node_left(controller: Controller, node: str, memory: Memory) -> bool:
    """Whether the finished run's node still exists (its deletion is still going on)."""
    return memory.zone is not None and controller.nodes.find(memory.zone, node) is not None


def failing(since: float | None, report: PassReport, zones: Collection[str], now: float) -> float | None:
    """Since when every pass failed to list ``zones`` (the API failing every request), given the pass after
    ``since``; None once a pass listed them."""
    return (since if since is not None else now) if set(zones) <= set(report.unlisted_zones) else None


def give_up(memory: Memory, failing_since: float | None, now: float, give_up_s: float, *, asked: int = 0) -> bool:
    """Whether a launch gives up: the API has failed every listing of the run's zones for ``give_up_s``
    (``launch_give_up_s``) and no create went out since the launch (``asked``: the nodes asked for before it, a
    resumed run's), while no node of the run is wanted (none ever asked for, or the last one let go: a stopped or
    finished run resumed). A run whose node may be working is never given up."""
    return (not memory.finished and memory.attempts == asked and (asked == 0 or memory.deleting)
            and failing_since is not None and now - failing_since >= give_up_s)


def withdraw(controller: Controller, run_ids: list[str], give_up_s: float) -> TransientError:
    """End runs that ``give_up`` gave up as FAILED, so that no later pass launches them; the error that says so in
    one line (exit 1). A run that never asked for a node leaves the active index at once (no node of it can
    exist); one resumed stays there until a pass that lists its zones has seen its old node gone. Call it holding
    the runs' leases (a pass of ``controller`` took them)."""
    reason = f"the Cloud TPU API failed every request for {give_up_s:.0f} s; withdrawn before a node was asked for"
    for run_id in run_ids:
        memory, generation = runs.load_memory(controller.store, run_id)
        if memory.finished:
            continue
        memory.finish(time.time(), Outcome.FAILED, reason)
        runs.save_memory(controller.store, run_id, memory, generation)
        if not memory.attempts:
            runs.drop_active(controller.store, run_id)
    return TransientError(f"{', '.join(run_ids)}: {reason} (nothing is billed, and no later pass launches it); "
                          "try again once the API answers ('tpuops doctor' checks it)")
