"""The one home of a run: its store layout, its typed documents, and every way to read or move it.

A run is declared (``declare``), driven by the controller (which keeps its ``Memory``), reported
on by the agent (``AgentStatus``) and looked at by people (``open_run``, ``list_runs``,
``follow_logs``). ``layout`` says which file is where, who writes it and when; ``models`` and
``memory`` hold the typed forms; ``ops`` reads and writes them. ``jobs``, the controller, the
sweeps and the front door (``tpuops.api``, which the CLI calls) use only this package to touch a
run's files.

Invariants: run.json and spec.json are written once and never change; only the controller's lease
holder (and ``reopen``, and ``repair`` of a damaged one) writes memory.json, with compare-and-swap; a
run is finished when the controller says so (``Memory.phase``) or the agent ended it for good
(succeeded, user-error) — ``is_finished`` is the one test of that. A document that cannot be read
makes its run damaged (``Run.damage``), never the listing that met it (``repair`` says what is done
about it).

May import: ``tpuops.core``, ``tpuops.store``, the provider-neutral node vocabulary (``tpuops.providers``) and
the contract shared with the agent (``tpuops.contract``). Never money: runs and billing stand side by side,
neither imports the other, and what joins a run with its price (goodput, the timeline) lives above both, in
``tpuops.accounting``.
"""

from tpuops.runs.layout import logs_prefix, memory_key, record_key, spec_key, status_key
from tpuops.runs.memory import Event, Memory, PendingCreate
from tpuops.runs.models import (
    AgentStatus,
    EvalPoint,
    ExitClass,
    Goodput,
    NodeSpec,
    Outcome,
    Phase,
    RunKind,
    RunPhase,
    RunRecord,
    StopRequest,
    spec_json,
)
from tpuops.runs.ops import (
    DAMAGED,
    MAX_READERS,
    LogTail,
    Run,
    active_index,
    active_run_ids,
    all_run_ids,
    declare,
    drop_active,
    ensure_index,
    follow_logs,
    index_run,
    is_finished,
    list_runs,
    load_memory,
    mark_active,
    open_run,
    parallel_map,
    read_document,
    read_record,
    read_run_spec,
    read_state,
    read_status,
    read_status_versioned,
    read_stop,
    rebuild_index,
    reopen,
    repair_hint,
    request_stop,
    run_exists,
    save_memory,
    whole_run,
    write_status,
)

__all__ = [
    "DAMAGED",
    "MAX_READERS",
    "AgentStatus",
    "EvalPoint",
    "Event",
    "ExitClass",
    "Goodput",
    "LogTail",
    "Memory",
    "NodeSpec",
    "Outcome",
    "PendingCreate",
    "Phase",
    "Run",
    "RunKind",
    "RunPhase",
    "RunRecord",
    "StopRequest",
    "active_index",
    "active_run_ids",
    "all_run_ids",
    "declare",
    "drop_active",
    "ensure_index",
    "follow_logs",
    "index_run",
    "is_finished",
    "list_runs",
    "load_memory",
    "logs_prefix",
    "mark_active",
    "memory_key",
    "open_run",
    "parallel_map",
    "read_document",
    "read_record",
    "read_run_spec",
    "read_state",
    "read_status",
    "read_status_versioned",
    "read_stop",
    "rebuild_index",
    "record_key",
    "reopen",
    "repair_hint",
    "request_stop",
    "run_exists",
    "save_memory",
    "spec_json",
    "spec_key",
    "status_key",
    "whole_run",
    "write_status",
]
