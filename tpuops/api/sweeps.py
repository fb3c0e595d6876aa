"""``tpuops sweep *`` as library calls: plan, start, status, stop, report and list sweeps.

Part of the front door (``tpuops.api`` re-exports every name here). Each call wires the store and
ledger from ``Settings`` itself; Optuna and matplotlib are imported only by the calls that use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuops.config import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuops.controller.reconcile import PassReport
    from tpuops.sweeps.models import SweepState
    from tpuops.sweeps.start import SweepPlan
    from tpuops.sweeps.status import SweepStatus


@dataclass(frozen=True)
class SweepStarted:
    """A declared sweep after the pass that launched its first trials."""

    plan: SweepPlan
    report: PassReport

    @property
    def launched(self) -> list[str]:
        return list(self.report.sweeps.get("launched", []))


def sweep_plan(settings: Settings, spec: Path) -> SweepPlan:
    """``tpuops sweep start SPEC --dry-run``: the validated sweep and its trials' run template; nothing written."""
    from tpuops.api.history import learner
    from tpuops.session import store
    from tpuops.sweeps.start import plan_sweep

    return plan_sweep(settings, spec, store(settings), learner=learner(settings))


def sweep_start(settings: Settings, spec: Path, *, progress: Callable[[str], None] | None = None) -> SweepStarted:
    """``tpuops sweep start SPEC``: declare the sweep, then one reconcile pass launches its first trials."""
    from tpuops.api import reconcile
    from tpuops.api.history import learner
    from tpuops.session import store
    from tpuops.sweeps.start import plan_sweep, start_sweep

    say = progress or (lambda _text: None)
    root = store(settings)
    plan = plan_sweep(settings, spec, root, learner=learner(settings))
    start_sweep(plan, root, say)
    report = reconcile(settings, progress=say)
    _launch_or_give_up(settings, plan, report, say)
    return SweepStarted(plan, report)


def _launch_or_give_up(settings: Settings, plan: SweepPlan, report: PassReport, say: Callable[[str], None]) -> None:
    """While the API fails every request and no trial of the new sweep asked for a node, pass again over its
    trials; past ``launch_give_up_s``, withdraw them and end the sweep failed, so that no later pass launches
    anything (``TransientError``, exit 1). A sweep whose trials got a create out goes on as usual."""
    import time

    from tpuops import runs
    from tpuops.api import controller
    from tpuops.controller.drive import failing, give_up, withdraw
    from tpuops.core.errors import PreconditionFailed
    from tpuops.sweeps.models import SweepOutcome
    from tpuops.sweeps.ops import load_state, save_state

    launched = list(report.sweeps.get("launched", []))
    zones, limit = plan.template.record.zones, settings.launch_give_up_s
    since = failing(None, report, zones, time.monotonic())
    if since is None or not launched:
        return
    control = controller(settings, say)
    try:
        while since is not None:
            memories = [runs.load_memory(control.store, run_id)[0] for run_id in launched]
            if not all(give_up(memory, since, time.monotonic(), limit) for memory in memories):
                if any(memory.attempts or memory.finished for memory in memories):
                    return  # a create went out: the sweep goes on, driven by watch or cron
                since = failing(since, control.run_pass(only=launched), zones, time.monotonic())
                continue
            error = withdraw(control, launched, limit)
            for _ in range(10):
                state, generation = load_state(control.store, plan.spec.name)
                state.finish(SweepOutcome.FAILED, str(error))
                try:
                    save_state(control.store, plan.spec.name, state, generation)
                    break
                except PreconditionFailed:
                    continue
            raise error
    finally:
        control.release()


def sweep_status(settings: Settings, name: str, *, importances: bool = False) -> SweepStatus:
    """``tpuops sweep status NAME``: trials, progress, spend (``importances``: Optuna's parameter importances)."""
    from tpuops.session import open_ledger, store
    from tpuops.sweeps.ops import read_sweep
    from tpuops.sweeps.status import sweep_status as status_of

    root = store(settings)
    sweep = read_sweep(root, name)  # an unknown sweep is refused before the ledger is opened (and created)
    return status_of(settings, root, open_ledger(settings), sweep, importances=importances)


def sweep_stop(settings: Settings, name: str) -> SweepState:
    """``tpuops sweep stop NAME``: no new trials; the next pass stops the running ones and ends the sweep."""
    from tpuops.session import store
    from tpuops.sweeps.ops import request_stop

    return request_stop(store(settings), name)


def sweep_report(settings: Settings, name: str, out: Path | None = None) -> tuple[SweepStatus, list[Path]]:
    """``tpuops sweep report NAME [--out DIR]``: the status with importances, and the PNG and HTML files written."""
    from tpuops.sweeps.report import write_report

    result = sweep_status(settings, name, importances=True)
    return result, write_report(result, out) if out is not None else []


def sweep_repair(settings: Settings, name: str, *, dry_run: bool = False) -> dict[str, Any]:
    """``tpuops sweep repair NAME``: which of the sweep's documents are damaged, and rebuild what can be
    (``tpuops.sweeps.ops.repair_sweep``; ``dry_run`` only says). ``repairable`` False: sweep.json was damaged."""
    from datetime import datetime

    from tpuops.core.clock import UTC
    from tpuops.session import store
    from tpuops.sweeps.ops import RECORD, diagnose_sweep, repair_sweep

    root = store(settings)
    damage = diagnose_sweep(root, name)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    done = [] if dry_run or not damage else repair_sweep(root, name, damage, now, project=settings.project,
                                                             store_root=settings.store_root)
    return {"sweep": name, "damaged": damage, "done": done, "dry_run": dry_run, "repairable": RECORD not in damage}


def sweep_list(settings: Settings) -> list[dict[str, Any]]:
    """``tpuops sweep list``: every sweep in the store with its phase, outcome and last pass; a sweep whose
    sweep.json or state.json cannot be read is listed with phase ``damaged`` and ``damaged`` saying why."""
    from tpuops.runs import parallel_map
    from tpuops.session import store
    from tpuops.sweeps.ops import all_sweeps, diagnose_sweep, load_state

    root = store(settings)

    def row(name: str) -> dict[str, Any]:
        damage = diagnose_sweep(root, name)
        if damage:
            return {"sweep": name, "phase": "damaged", "outcome": None, "last_pass": None,
                    "damaged": "; ".join(damage.values())}
        state = load_state(root, name)[0]
        return {"sweep": name, "phase": state.phase, "outcome": state.outcome, "last_pass": state.last_pass,
                "damaged": None}

    return parallel_map(row, all_sweeps(root))
