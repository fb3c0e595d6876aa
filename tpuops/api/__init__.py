"""The library entry points: one call per command, for Python callers and for the CLI alike.

Each function takes ``Settings`` (``load_settings``) and wires what it needs through
``tpuops.session``; the CLI parses its flags, calls exactly one of these and renders the result
(docs/library.md lists them; tests/test_cli_front_door.py holds the CLI to it). Runs and nodes are
here; ``sweeps``, ``data`` and ``tools`` (init, doctor, schedule, emulator, runtime) are re-exported
from their modules. Everything heavy is imported inside the calls, so importing this is cheap.

Callbacks report progress: ``progress`` gets one line of text (controller events, uploads),
``on_status`` the agent's status each pass, ``on_log`` each new log line. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tpuops.api.data import data_convert, data_ls, data_sample, data_upload, data_verify
from tpuops.api.pages import (
    NodeRow,
    RunDetail,
    delete_orphan,
    log_tail,
    nodes,
    run_detail,
    run_ids,
    run_rows,
    sweep_storage,
    watch_marks,
)
from tpuops.api.plan import Forecasted, forecast_sweep, forecast_train, risk, simulate
from tpuops.api.profiles import list_profiles as list_profiles
from tpuops.api.profiles import request_profile as request_profile
from tpuops.api.profiles import tensorboard as tensorboard
from tpuops.api.sweeps import (
    SweepStarted,
    sweep_list,
    sweep_plan,
    sweep_repair,
    sweep_report,
    sweep_start,
    sweep_status,
    sweep_stop,
)
from tpuops.api.tools import (
    WorkerRan,
    doctor,
    emulator_billing,
    emulator_fault,
    emulator_preempt,
    emulator_start,
    emulator_status,
    emulator_stop,
    exec_on,
    init,
    load_settings,
    notify_test,
    reachable_store,
    runtime_install,
    runtime_status,
    schedule_install,
    schedule_status,
    schedule_uninstall,
    slice_workers,
)
from tpuops.config import Settings
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey

__all__ = [
    "Forecasted", "Forgotten", "MetadataKey", "NodeRow", "Overview", "Repaired", "RunDetail",
    "Started", "SweepStarted", "WorkerRan", "controller", "cost", "create_body", "data_convert", "data_ls",
    "data_sample", "data_upload", "data_verify", "delete_orphan", "doctor", "down", "drive", "emulator_billing",
    "emulator_fault", "emulator_preempt", "emulator_start", "emulator_status", "emulator_stop", "events", "exec_on",
    "forecast_sweep", "forecast_train", "forget", "infer", "init", "launch", "list_runs", "load_settings", "log_tail",
    "logs", "nodes", "notify_test",
    "plan_infer", "plan_resume", "plan_stop", "plan_train", "plan_up", "plan_up_queued", "reachable_store",
    "reap_orphans", "reconcile", "repair", "resume", "risk", "run_detail", "run_ids", "run_rows", "runtime_install",
    "runtime_status",
    "schedule_install", "schedule_status", "schedule_uninstall", "simulate", "slice_workers", "status", "stop",
    "sweep_list",
    "sweep_plan", "sweep_repair", "sweep_report", "sweep_start", "sweep_status", "sweep_stop", "sweep_storage", "train",
    "up", "watch", "watch_marks",
]

if TYPE_CHECKING:
    # The types these calls return, named here too so that the CLI renders them importing only this module.
    from tpuops.api.accounting import CostAndGoodput as CostAndGoodput
    from tpuops.billing.cost import Total as Total
    from tpuops.billing.risk import Risk as Risk
    from tpuops.controller.drive import Finished
    from tpuops.controller.reconcile import Controller, PassReport
    from tpuops.controller.stop import Stopped
    from tpuops.data import UploadReport as UploadReport
    from tpuops.fleet import DownResult, UpResult
    from tpuops.launch.jobs import JobPlan
    from tpuops.launch.provision import UpPlan
    from tpuops.providers.nodes import NodeInfo
    from tpuops.runs import AgentStatus, Memory, Run, RunRecord
    from tpuops.runs import Goodput as Goodput
    from tpuops.runs.repair import Diagnosis
    from tpuops.sim.engine import SimReport as SimReport
    from tpuops.store import Store
    from tpuops.sweeps.status import SweepStatus as SweepStatus

Say = Callable[[str], None]


def _quiet(_text: str) -> None:
    return None


def controller(settings: Settings, progress: Say = _quiet) -> Controller:
    """A reconcile controller for the configured store and fleet, its passes advancing the sweeps too
    (``tpuops.sweeps.advance.SweepStep``: composed here, so that the controller imports no sweep); call
    ``release()`` when done."""
    from tpuops.controller.reconcile import Controller
    from tpuops.session import fleet, store
    from tpuops.sweeps.advance import SweepStep

    return Controller(settings, store(settings), fleet(settings), sweeps=SweepStep(), progress=progress)


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


@dataclass(frozen=True)
class Started:
    """A detached run after its first pass: ``tpuops watch`` (or cron ``tpuops reconcile``) drives it on."""

    run_id: str


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


@dataclass(frozen=True)
class Overview:
    """``tpuops status``: the nodes in view and the runs still going."""

    nodes: list[NodeInfo]
    runs: list[Run]


def status(settings: Settings) -> Overview:
    """Nodes in the zones in view (one ListNodes per zone) and the unfinished runs (the active index only)."""
    from tpuops import runs
    from tpuops.api.accounting import attach_goodput
    from tpuops.session import fleet, store

    active = runs.list_runs(store(settings), active_only=True)
    since = min((datetime.fromisoformat(r.record.created) for r in active if r.record.created), default=None)
    return Overview(nodes=fleet(settings).status(), runs=attach_goodput(settings, active, since=since))


def list_runs(settings: Settings) -> list[Run]:
    """``tpuops runs``: every run, oldest first, with its goodput."""
    from tpuops import runs
    from tpuops.api.accounting import attach_goodput
    from tpuops.session import store

    return attach_goodput(settings, runs.list_runs(store(settings)))


def logs(settings: Settings, run_id: str, *, follow: bool = False, worker: str = "0") -> Iterator[str]:
    """``tpuops logs RUN [-f] [--worker N|all]``: its log lines (worker 0's by default; ``all``: every worker's,
    each line prefixed with its worker); following goes on across preemptions until the run ends.

    Raises:
        UsageError: ``worker`` is not a worker of the run's accelerator (before anything is read).
    """
    from tpuops import runs
    from tpuops.session import store

    root = store(settings)
    workers = slice_workers(runs.read_record(root, run_id).node.accelerator, worker, f"run {run_id}")
    return runs.follow_logs(root, run_id, follow=follow, poll_s=max(settings.poll_interval_s, 0.5), workers=workers)


def events(settings: Settings, run_id: str) -> Memory:
    """``tpuops events RUN``: the controller's memory of the run, with its event log (``DamagedDocument`` naming
    what to do when its record or memory cannot be read)."""
    from tpuops import runs
    from tpuops.core.errors import DamagedDocument
    from tpuops.session import store

    root = store(settings)
    try:
        runs.read_record(root, run_id)
        return runs.load_memory(root, run_id)[0]
    except DamagedDocument as err:
        raise DamagedDocument(f"{err} ({runs.repair_hint(run_id)})", where=err.where) from None


@dataclass(frozen=True)
class Repaired:
    """``tpuops runs repair``: what is wrong with the run, and what was done about it (nothing on a dry run)."""

    diagnosis: Diagnosis
    done: list[str]
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        return {**self.diagnosis.to_json(), "done": self.done, "dry_run": self.dry_run}


@dataclass(frozen=True)
class Forgotten:
    """``tpuops runs forget``: the run taken out of the index, and its node deleted first if it had one."""

    diagnosis: Diagnosis
    forgotten: bool
    """False on a dry run, or when the confirmation was declined: nothing was done."""
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        return {**self.diagnosis.to_json(), "forgotten": self.forgotten, "dry_run": self.dry_run}


def repair(settings: Settings, run_id: str, *, dry_run: bool = False) -> Repaired:
    """``tpuops runs repair RUN``: which of the run's documents are damaged, and rebuild what can be rebuilt
    (``tpuops.runs.repair``); ``dry_run`` only says. A damaged run.json stays so (``Diagnosis.repairable``)."""
    import time

    from tpuops.runs import repair as mending
    from tpuops.session import store

    root = store(settings)
    diagnosis = mending.diagnose(root, run_id)  # an unknown run is refused before the cloud is asked
    diagnosis = replace(diagnosis, node=_node_of(settings, root, run_id))
    return Repaired(diagnosis, [] if dry_run else mending.repair(root, diagnosis, time.time()), dry_run)


def forget(settings: Settings, run_id: str, *, dry_run: bool = False,
           confirm: Callable[[Diagnosis], bool] = lambda _found: True) -> Forgotten:
    """``tpuops runs forget RUN``: delete a damaged run's node (waiting until it is gone) if it has one, then take
    the run out of the index. ``confirm`` is asked first when there is a node; ``UsageError`` for a run that is
    not damaged (nothing is done: such a run is stopped, not forgotten)."""
    from tpuops.core.errors import UsageError
    from tpuops.runs import repair as mending
    from tpuops.session import fleet, store

    root = store(settings)
    diagnosis = mending.diagnose(root, run_id)  # refused before the cloud is asked
    if not diagnosis.damaged:
        raise UsageError(f"run {run_id} is not damaged: only a damaged run is forgotten ('tpuops runs' shows it)")
    node = _node_of(settings, root, run_id)
    diagnosis = replace(diagnosis, node=node)
    if dry_run or (node is not None and not confirm(diagnosis)):
        return Forgotten(diagnosis, False, dry_run)
    if node is not None:
        fleet(settings).delete(node.zone, node.name, wait=True)
    mending.forget(root, run_id)
    return Forgotten(diagnosis, True, dry_run)


def _node_of(settings: Settings, root: Store, run_id: str) -> NodeInfo | None:
    """The node carrying the run's label in the zones in view and the run's own (when its record says them)."""
    import contextlib

    from tpuops import runs
    from tpuops.core.errors import DamagedDocument, UsageError
    from tpuops.core.naming import RUN_KEY, check_node_name
    from tpuops.session import fleet

    check_node_name(run_id, "run id")
    nodes = fleet(settings)
    zones = nodes.zones_in_view()
    with contextlib.suppress(DamagedDocument, UsageError):  # no readable record: the zones in view
        zones += [zone for zone in runs.read_record(root, run_id).zones if zone not in zones]
    listed, failed = nodes.list_zones(zones)
    if failed:
        raise next(iter(failed.values()))
    return next((node for zone in listed.values() for node in zone.values()
                 if node.managed and node.labels.get(RUN_KEY) == run_id), None)


def up(settings: Settings, name: str, *, accelerator: str | None = None, capacity: Capacity | None = None,
       zone: str | None = None, runtime: str | None = None, wait: bool = True, queued: bool = False,
       valid_for_s: float | None = None, progress: Say = _quiet) -> UpResult:
    """``tpuops up NAME``: create (or adopt) a node and wait until it is READY."""
    from tpuops.launch.provision import plan_up
    from tpuops.session import fleet

    plan = plan_up(settings, name, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime)
    nodes = fleet(settings, progress)
    return nodes.up_queued(plan, valid_for_s=valid_for_s, wait=wait) if queued else nodes.up(plan, wait=wait)


def plan_up(settings: Settings, name: str, *, accelerator: str | None = None, capacity: Capacity | None = None,
            zone: str | None = None, runtime: str | None = None) -> UpPlan:
    """``tpuops up NAME --dry-run``: the CreateNode request, the zones in order and the startup script; no call."""
    from tpuops.launch.provision import plan_up as plan

    return plan(settings, name, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime)


def create_body(settings: Settings, plan: UpPlan) -> dict[str, Any]:
    """What the configured node provider's create would send for ``plan`` (a dry run shows it); no call.

    Cloud TPU's is the REST body of a CreateNode; each provider says its own (``create_body`` of its class)."""
    from tpuops.providers.registry import provider_class

    return provider_class(settings.node_provider).create_body(settings.project, plan.zones[0], plan.request)


def plan_up_queued(settings: Settings, name: str, *, accelerator: str | None = None,
                   capacity: Capacity | None = None, zone: str | None = None, runtime: str | None = None,
                   valid_for_s: float | None = None) -> dict[str, Any]:
    """``tpuops up NAME --queued --dry-run``: the CreateQueuedResource call (zone, id, REST body); no call.

    Refused (``UsageError``) as ``up --queued`` itself is when the configured provider has no queued resources.
    """
    from tpuops.providers.base import QueuesNodes, require_queues
    from tpuops.providers.registry import provider_class

    provider = cast(type[QueuesNodes], provider_class(settings.node_provider))
    require_queues(provider)
    plan = plan_up(settings, name, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime)
    return {"zone": plan.zones[0], "queued_resource_id": name,
            "body": provider.queued_body(settings.project, plan.zones[0], plan.request, valid_until_s=valid_for_s)}


def down(settings: Settings, names: list[str] | None, *, wait: bool = True, progress: Say = _quiet,
         confirm_stop: Callable[[list[str]], bool] | None = None) -> list[DownResult]:
    """``tpuops down NAMES | --all``: delete nodes (``None``: every tpuops node in view).

    The node of a run still going is not simply deleted (its controller would make it again): its run is
    stopped as ``stop`` stops it, when ``confirm_stop`` (given those runs) says yes; otherwise ``UsageError``
    naming ``tpuops stop``, and nothing is deleted.
    """
    from tpuops import runs
    from tpuops.core.errors import UsageError
    from tpuops.core.naming import RUN_KEY, check_node_name
    from tpuops.fleet import Deleted, DownResult
    from tpuops.session import fleet, store

    for name in names or []:
        check_node_name(name)  # before the ledger or the API is touched
    nodes = fleet(settings, progress)
    root = store(settings)
    found = nodes.status() if names is None else [n for name in names for n in nodes.locate(name)]
    owned: dict[str, tuple[NodeInfo, Run]] = {}
    for node in found:
        run_id = node.labels.get(RUN_KEY)
        if node.managed and run_id is not None and runs.run_exists(root, run_id):
            run = runs.open_run(root, run_id)
            if not run.finished and run.record.node_name == node.name:
                owned[node.name] = (node, run)
    if not owned:
        return nodes.down(names, wait=wait)
    ids = sorted({run.run_id for _, run in owned.values()})
    if confirm_stop is None or not confirm_stop(ids):
        raise UsageError(f"{', '.join(sorted(owned))}: the node(s) of run(s) still going ({', '.join(ids)}), which "
                         f"their controller would make again; 'tpuops stop {' '.join(ids)}' stops them (each "
                         "checkpoints, then its node is deleted), as 'tpuops down --yes' does; nothing deleted")
    stopped = {s.run_id: s for s in _stop(settings, [run for _, run in owned.values()], "tpuops down of its node",
                                          wait=wait, progress=progress)}
    results = [DownResult(name, node.zone, Deleted.REQUESTED if stopped[run.run_id].outcome is None
                          else Deleted.STOPPED) for name, (node, run) in owned.items()]
    rest = [name for name in (names if names is not None else [n.name for n in found if n.managed])
            if name not in owned]
    return results + (nodes.down(rest, wait=wait) if rest else [])


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
    stops now. ``wait``: until each node is gone (``Timeout`` past the lease TTL plus the operation timeout)."""
    from tpuops.session import store
    from tpuops.sweeps.ops import request_stop

    root = store(settings)
    found = _stop_targets(root, run_ids, sweep)
    if sweep is not None:
        request_stop(root, sweep)
    return _stop(settings, found, reason, wait=wait, progress=progress)


def _stop(settings: Settings, found: list[Run], reason: str, *, wait: bool, progress: Say) -> list[Stopped]:
    from tpuops.controller.stop import stop_runs

    return stop_runs(controller(settings, progress), found, reason, wait=wait,
                     timeout_s=settings.lease_ttl_s + settings.operation_timeout_s,
                     poll_s=max(settings.poll_interval_s, 0.2))


def reap_orphans(settings: Settings, progress: Say = _quiet) -> list[str]:
    """``tpuops down --orphans``: delete tpuops nodes whose run the store does not know, now."""
    return controller(settings, progress).reap_orphans_now()


def cost(settings: Settings, *, run_id: str | None = None, sweep_id: str | None = None,
         since: datetime | str | None = None) -> CostAndGoodput:
    """``tpuops cost``: what the ledger's nodes cost per run, sweep and UTC day, with each run's goodput.

    ``since`` may be text as the command takes it (2024-05-01, 2024-05-01T12:00; UTC when no zone).
    """
    from tpuops.api.accounting import cost_report
    from tpuops.billing.cost import parse_since

    return cost_report(settings, run_id=run_id, sweep_id=sweep_id,
                       since=parse_since(since) if isinstance(since, str) else since)
