"""The controller's calls: a reconcile controller for the configured store and fleet, its passes
(``reconcile``, ``watch``, driving one run) and what ends runs on request (``stop``, orphans).

The controller is composed here and nowhere else in the front door (``controller``): its fleet, the billing
observer that fleet reports to, the store and the sweeps' step, so that the controller imports no sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuops.api.callbacks import Say, _quiet
from tpuops.config import Settings

if TYPE_CHECKING:
    from tpuops.controller.drive import Finished
    from tpuops.controller.reconcile import Controller, PassReport
    from tpuops.controller.stop import Stopped
    from tpuops.runs import AgentStatus, Run
    from tpuops.store import Store


def controller(settings: Settings, progress: Say = _quiet) -> Controller:
    """A reconcile controller for the configured store and fleet, its passes advancing the sweeps too
    (``tpuops.sweeps.advance.SweepStep``: composed here, so that the controller imports no sweep); call
    ``release()`` when done."""
    from tpuops.controller.reconcile import Controller
    from tpuops.session import fleet, store
    from tpuops.sweeps.advance import SweepStep

    nodes = fleet(settings)
    return Controller(settings, store(settings), nodes, billing=nodes.billing, sweeps=SweepStep(), progress=progress)


@dataclass(frozen=True)
class Started:
    """A detached run after its first pass: ``tpuops watch`` (or cron ``tpuops reconcile``) drives it on."""

    run_id: str


def drive(settings: Settings, run_id: str, *, detach: bool = False, progress: Say = _quiet,
          on_status: Callable[[AgentStatus], None] | None = None, on_log: Say | None = None) -> Finished | Started:
    """Be the controller of one declared run until it ends; with ``detach`` make its first pass only."""
    from tpuops.controller.drive import drive as drive_run

    control = controller(settings, progress)
    if detach:
        try:
            control.run_pass(only=run_id)
        finally:
            control.release()
        return Started(run_id)
    return drive_run(control, run_id, poll_s=max(settings.poll_interval_s, 0.5),
                     on_status=on_status or (lambda _status: None), on_log=on_log)


def reconcile(settings: Settings, progress: Say = _quiet, *, wake: bool = True) -> PassReport:
    """``tpuops reconcile``: one pass over every unfinished run (safe from cron); then, with ``wake``, passes at
    the wake pace while a preempted agent's wake marker is fresh (``tpuops.controller.wake``)."""
    from tpuops.controller.wake import Waker
    from tpuops.session import store

    control = controller(settings, progress)
    try:
        report = control.run_pass()
        waker = Waker(store(settings)) if wake else None
        woken = waker.fresh() if waker is not None else []
        if waker is not None and woken:
            progress(f"woken by {', '.join(m.run_id for m in woken)}: passing every {waker.pace_s:.0f} s")
            waker.hurry(control, woken, report.add)
        return report
    finally:
        control.release()


def watch(settings: Settings, *, interval_s: float = 30.0, passes: int = 0, progress: Say = _quiet,
          on_pass: Callable[[int, PassReport], None] | None = None,
          sleep: Callable[[float], None] | None = None, wake: bool = True) -> int:
    """``tpuops watch``: reconcile every ``interval_s`` (``passes`` of them, 0: until interrupted); passes made.

    With ``wake``, between passes it looks for wake markers and hurries at once when a preempted agent
    left one (``tpuops.controller.wake``); its hurried passes count as passes too. A pass that fails on a
    transient error that outlasted its retries (the store or the API not answering) is said in one line and
    counted, and the next comes at its time: a watch that exited on it would leave paid nodes unwatched.
    Any other error ends the watch.
    """
    import time

    from tpuops.controller.wake import Waker
    from tpuops.core.errors import Timeout, TransientError
    from tpuops.session import store

    control = controller(settings, progress)
    waker = Waker(store(settings), sleep=sleep or time.sleep) if wake else None
    done = 0

    def report(result: PassReport) -> None:
        nonlocal done
        done += 1
        if on_pass is not None:
            on_pass(done, result)

    def one_pass() -> None:
        nonlocal done
        try:
            report(control.run_pass())
        except (TransientError, Timeout) as err:
            done += 1
            progress(f"pass {done} did not finish ({err}); the next one comes in {interval_s:.0f} s")

    try:
        while not passes or done < passes:
            started = time.monotonic()
            one_pass()
            if passes and done >= passes:
                break
            left = max(0.0, interval_s - (time.monotonic() - started))
            if waker is None:
                (sleep or time.sleep)(left)
                continue
            woken = waker.wait(left)
            if woken:
                progress(f"woken by {', '.join(m.run_id for m in woken)}: passing every {waker.pace_s:.0f} s")
                waker.hurry(control, woken, report)
    finally:
        control.release()
    return done


def reap_orphans(settings: Settings, progress: Say = _quiet) -> list[str]:
    """``tpuops down --orphans``: delete tpuops nodes that no run claims, now (each under its run's lease, which
    is dropped after)."""
    control = controller(settings, progress)
    try:
        return control.reap_orphans_now()
    finally:
        control.release()


def _stop_targets(root: Store, run_ids: list[str], sweep: str | None) -> list[Run]:
    """The runs a stop acts on: those named (each must exist: ``UsageError`` otherwise, before anything is written)
    and every unfinished run of ``sweep`` (which must exist too), in that order, each once."""
    from tpuops import runs
    from tpuops.core.errors import UsageError
    from tpuops.sweeps.ops import read_sweep

    if not run_ids and sweep is None:
        raise UsageError("name the runs to stop, or give --sweep SWEEP ('tpuops runs' lists them)")
    found = {run_id: runs.open_run(root, run_id) for run_id in dict.fromkeys(run_ids)}
    if sweep is not None:
        read_sweep(root, sweep)
        found.update((run.run_id, run) for run in runs.list_runs(root, active_only=True)
                     if run.record.sweep == sweep and run.run_id not in found)
    return list(found.values())


def plan_stop(settings: Settings, run_ids: list[str], *, sweep: str | None = None) -> list[Run]:
    """``tpuops stop RUN... [--sweep S] --dry-run``: the runs a stop would stop (and those that ended already);
    nothing written. ``UsageError`` for an unknown run or sweep, or when neither runs nor a sweep are named."""
    from tpuops.session import store

    return _stop_targets(store(settings), run_ids, sweep)


def stop(settings: Settings, run_ids: list[str], *, sweep: str | None = None, wait: bool = True,
         reason: str = "tpuops stop", progress: Say = _quiet) -> list[Stopped]:
    """``tpuops stop RUN... [--sweep S]``: end each run STOPPED and delete its node, whoever drives it
    (``tpuops.controller.stop``); the agent checkpoints on its node's notice, and ``train --resume`` goes on from
    there. With ``sweep``, the sweep launches no new trial either (as ``sweep stop``) and every trial still going
    stops now. ``wait``: until each node is gone (``Timeout`` past the lease TTL plus the operation timeout). A
    failing API or a damaged memory never fails a stop once it is recorded (``tpuops.controller.stop``)."""
    from tpuops.session import store
    from tpuops.sweeps.ops import request_stop

    root = store(settings)
    found = _stop_targets(root, run_ids, sweep)
    if sweep is not None:
        request_stop(root, sweep)
    return _stop(settings, found, reason, wait=wait, progress=progress)


NO_WAIT_API_S = 5.0
"""How long ``stop --no-wait`` gives each Cloud TPU call of its one pass, retries included (each call's own timeout
too): the stop is recorded before, so a failing or hanging API costs it seconds, never the minutes it blocked."""


def _stop(settings: Settings, found: list[Run], reason: str, *, wait: bool, progress: Say) -> list[Stopped]:
    from tpuops.controller.stop import stop_runs

    # Without wait, the stop is recorded first and the pass after it gets the API for seconds, not the retry policy's
    # minutes (``NO_WAIT_API_S``): what it cannot do is said, and left to the next pass.
    brief = settings if wait else settings.model_copy(update={"api_deadline_s": min(settings.api_deadline_s,
                                                                                     NO_WAIT_API_S)})
    return stop_runs(controller(brief, progress), found, reason, wait=wait,
                     timeout_s=settings.lease_ttl_s + settings.operation_timeout_s,
                     poll_s=max(settings.poll_interval_s, 0.2), progress=progress)
