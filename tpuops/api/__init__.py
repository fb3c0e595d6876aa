"""The library entry points: one call per command, for Python callers and for the CLI alike.

Each function takes ``Settings`` (``load_settings``) and wires what it needs through
``tpuops.session``; the CLI parses its flags, calls exactly one of these and renders the result
(docs/library.md lists them; tests/cli/test_cli_front_door.py holds the CLI to it). This module is the face
only: every call lives in a module of its subject and is re-exported here, so ``tpuops.api.NAME`` is the one
name a caller needs. ``jobs`` launches runs (train, infer, resume), ``control`` holds the controller and its
passes (reconcile, watch, drive, stop), ``runs`` looks at runs and mends them (status, logs, events, cost,
repair, forget), ``provisioning`` makes and deletes nodes by hand (up, down), ``pages`` is what the
dashboard's pages read, ``sweeps``, ``data``, ``plan`` (risk, simulate, forecasts) and ``tools`` (init, doctor,
schedule, emulator, runtime) theirs; ``accounting`` and ``history`` serve them. Everything heavy is imported
inside the calls, so importing this is cheap.

Callbacks report progress: ``progress`` gets one line of text (controller events, uploads),
``on_status`` the agent's status each pass, ``on_log`` each new log line. Nothing here prints.

May import: every wing below it (``tpuops.core``, ``tpuops.config``, ``tpuops.store``, ``tpuops.runs``,
``tpuops.billing``, ``tpuops.accounting``, ``tpuops.providers``, ``tpuops.data``, ``tpuops.launch``,
``tpuops.notify``, ``tpuops.fleet``, ``tpuops.controller``, ``tpuops.sweeps``, ``tpuops.sim``), the
``tpuops.session`` wiring, ``tpuops.doctor``, ``tpuops.schedule``, the local runtime (``tpuops.tfenv``) and
the emulator's controls (``tpuops.emulator``) and the agent's contract (``tpuops.contract``: a profile
request's names). Never a UI: the CLI and the dashboard stand on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuops.api.control import Started, controller, drive, plan_stop, reap_orphans, reconcile, stop, watch
from tpuops.api.data import data_convert, data_ls, data_sample, data_upload, data_verify
from tpuops.api.jobs import infer, launch, plan_infer, plan_resume, plan_train, resume, train
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
from tpuops.api.profiles import list_profiles, request_profile, tensorboard
from tpuops.api.provisioning import create_body, down, plan_up, plan_up_queued, up
from tpuops.api.runs import Forgotten, Overview, Repaired, cost, events, forget, list_runs, logs, repair, status
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
    Executed,
    WorkerRan,
    doctor,
    emulator_billing,
    emulator_fault,
    emulator_preempt,
    emulator_start,
    emulator_status,
    emulator_stop,
    exec_on,
    held_back_lines,
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
from tpuops.core.naming import MetadataKey

__all__ = [
    "Executed", "Forecasted", "Forgotten", "MetadataKey", "NodeRow", "Overview", "Repaired", "RunDetail", "Started",
    "SweepStarted", "WorkerRan", "controller", "cost", "create_body", "data_convert", "data_ls", "data_sample",
    "data_upload", "data_verify", "delete_orphan", "doctor", "down", "drive", "emulator_billing", "emulator_fault",
    "emulator_preempt", "emulator_start", "emulator_status", "emulator_stop", "events", "exec_on", "forecast_sweep",
    "forecast_train", "forget", "held_back_lines", "infer", "init", "launch", "list_profiles", "list_runs",
    "load_settings", "log_tail", "logs", "nodes", "notify_test", "plan_infer", "plan_resume", "plan_stop",
    "plan_train", "plan_up", "plan_up_queued", "reachable_store", "reap_orphans", "reconcile", "repair",
    "request_profile", "resume", "risk", "run_detail", "run_ids", "run_rows", "runtime_install", "runtime_status",
    "schedule_install", "schedule_status", "schedule_uninstall", "simulate", "slice_workers", "status", "stop",
    "sweep_list", "sweep_plan", "sweep_repair", "sweep_report", "sweep_start", "sweep_status", "sweep_stop",
    "sweep_storage", "tensorboard", "train", "up", "watch", "watch_marks",
]

if TYPE_CHECKING:
    # The types these calls return, named here too so that the CLI renders them importing only this module.
    from tpuops.api.accounting import CostAndGoodput as CostAndGoodput
    from tpuops.billing.cost import Total as Total
    from tpuops.billing.risk import Risk as Risk
    from tpuops.controller.drive import Finished as Finished
    from tpuops.controller.reconcile import PassReport as PassReport
    from tpuops.data import UploadReport as UploadReport
    from tpuops.fleet import UpResult as UpResult
    from tpuops.runs import AgentStatus as AgentStatus
    from tpuops.runs import Goodput as Goodput
    from tpuops.sim.engine import SimReport as SimReport
    from tpuops.sweeps.status import SweepStatus as SweepStatus
