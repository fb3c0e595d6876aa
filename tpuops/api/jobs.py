"""Launching runs: plan a training or a prediction run (``--dry-run``), declare it and drive it, or resume one.

Each ``plan_*`` validates and writes nothing; ``train``, ``infer`` and ``resume`` declare (or reopen) the run and
hand it to the controller (``tpuops.api.control.drive``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops.api.callbacks import Say, _quiet
from tpuops.api.control import Started, drive
from tpuops.config import Settings
from tpuops.core.kinds import Capacity

if TYPE_CHECKING:
    from tpuops.controller.drive import Finished
    from tpuops.launch.jobs import JobPlan
    from tpuops.runs import AgentStatus, RunRecord


def plan_train(settings: Settings, spec: Path, *, name: str | None = None, accelerator: str | None = None,
               capacity: Capacity | None = None, keep: bool = False, budget_usd: float | None = None,
               sweep: str | None = None, base_dir: Path | None = None) -> JobPlan:
    """What ``train`` would declare and create (``--dry-run``): validated, nothing written."""
    from tpuops.api.history import learner
    from tpuops.launch import jobs
    from tpuops.session import store

    return jobs.plan_train(settings, spec, store(settings), run_id=name, accelerator=accelerator, capacity=capacity,
                           keep=keep, budget_usd=budget_usd, sweep=sweep, base_dir=base_dir,
                           learner=learner(settings))


def launch(settings: Settings, plan: JobPlan, *, detach: bool = False, progress: Say = _quiet,
           on_status: Callable[[AgentStatus], None] | None = None, on_log: Say | None = None) -> Finished | Started:
    """Refuse it if over budget, declare the run, then drive it to its end (or make its first pass: ``detach``)."""
    from tpuops.api.accounting import refuse_over_budget
    from tpuops.launch import jobs
    from tpuops.session import store

    refuse_over_budget(settings, plan)
    jobs.declare(plan, store(settings), settings, progress)
    return drive(settings, plan.run_id, detach=detach, progress=progress, on_status=on_status, on_log=on_log)


def train(settings: Settings, spec: Path, *, name: str | None = None, accelerator: str | None = None,
          capacity: Capacity | None = None, keep: bool = False, budget_usd: float | None = None,
          sweep: str | None = None, base_dir: Path | None = None, detach: bool = False, progress: Say = _quiet,
          on_status: Callable[[AgentStatus], None] | None = None, on_log: Say | None = None) -> Finished | Started:
    """``tpuops train SPEC``: plan (as ``plan_train``), declare and drive a training run."""
    plan = plan_train(settings, spec, name=name, accelerator=accelerator, capacity=capacity, keep=keep,
                      budget_usd=budget_usd, sweep=sweep, base_dir=base_dir)
    return launch(settings, plan, detach=detach, progress=progress, on_status=on_status, on_log=on_log)


def plan_resume(settings: Settings, run_id: str) -> RunRecord:
    """What ``train --resume RUN`` would drive again (``--dry-run``); refuses a run that ended for good."""
    from tpuops.launch import jobs
    from tpuops.session import store

    return jobs.plan_resume(store(settings), run_id)


def plan_infer(settings: Settings, spec: Path, *, checkpoint: str, inputs: str, output: str | None = None,
               name: str | None = None, accelerator: str | None = None, capacity: Capacity | None = None,
               num_shards: int = 1, batch_size: int = 256, keep: bool = False,
               base_dir: Path | None = None, deterministic: bool | None = None, latency: bool = False) -> JobPlan:
    """What ``infer`` would declare and create (``--dry-run``): validated, nothing written."""
    from tpuops.launch import jobs
    from tpuops.session import open_uri, store

    return jobs.plan_infer(settings, spec, store(settings), checkpoint=checkpoint, inputs=inputs, output=output,
                           run_id=name, accelerator=accelerator, capacity=capacity, num_shards=num_shards,
                           batch_size=batch_size, keep=keep, base_dir=base_dir, deterministic=deterministic,
                           latency=latency, open_uri=lambda uri: open_uri(settings, uri))


def infer(settings: Settings, spec: Path, *, checkpoint: str, inputs: str, output: str | None = None,
          name: str | None = None, accelerator: str | None = None, capacity: Capacity | None = None,
          num_shards: int = 1, batch_size: int = 256, keep: bool = False, base_dir: Path | None = None,
          deterministic: bool | None = None, latency: bool = False, progress: Say = _quiet,
          on_status: Callable[[AgentStatus], None] | None = None) -> Finished | Started:
    """``tpuops infer SPEC``: plan (as ``plan_infer``), declare and drive a batch prediction run."""
    plan = plan_infer(settings, spec, checkpoint=checkpoint, inputs=inputs, output=output, name=name,
                      accelerator=accelerator, capacity=capacity, num_shards=num_shards, batch_size=batch_size,
                      keep=keep, base_dir=base_dir, deterministic=deterministic, latency=latency)
    return launch(settings, plan, progress=progress, on_status=on_status)


def resume(settings: Settings, run_id: str, *, detach: bool = False, progress: Say = _quiet,
           on_status: Callable[[AgentStatus], None] | None = None, on_log: Say | None = None) -> Finished | Started:
    """``tpuops train --resume RUN``: reopen a run that did not end for good and drive it again."""
    from tpuops import runs
    from tpuops.session import store

    plan_resume(settings, run_id)
    runs.reopen(store(settings), run_id, "tpuops train --resume")
    return drive(settings, run_id, detach=detach, progress=progress, on_status=on_status, on_log=on_log)
