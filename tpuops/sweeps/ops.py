"""A sweep's documents in the store, next to its study and its runs: every read and write of them.

    sweeps/<sweep>/sweep.json   the ``SweepRecord``, written once (compare-and-swap on generation 0):
                                the validated spec, the frozen trial template (a run record and a
                                run spec, with the node request frozen at ``sweep start``), the
                                projected cost of one trial, when it started
    sweeps/<sweep>/state.json   the ``SweepState``: phase (active | stopping | finished), outcome,
                                reason, last pass; changed with compare-and-swap
    sweeps/<sweep>/journal/     the study, when it is kept in the store (``tpuops.sweeps.journal``)
    sweeps/<sweep>/state.json.damaged   a damaged state as it was, kept by ``tpuops sweep repair``
    sweeps-active/<sweep>       a marker while the sweep is unfinished: a pass lists this prefix
                                only, so its cost does not grow with finished sweeps or their trials

Trial N of sweep S is the run ``S-tNNNN`` (``tpuops.runs``), made by ``TrialTemplate.for_trial``;
its record carries ``sweep`` (node label, ledger rows). Declaring it is write-once: a pass that
died half way through declaring is finished by the next one, and a run that exists is never
declared again.
"""

from __future__ import annotations

import json
from typing import Any

from tpuops import runs
from tpuops.core.errors import DamagedDocument, NotFound, PreconditionFailed, TpuopsError, UsageError
from tpuops.core.naming import check_sweep_name
from tpuops.runs.models import parse
from tpuops.runs.repair import DAMAGED_SUFFIX
from tpuops.store import Store
from tpuops.sweeps.models import SweepOutcome, SweepPhase, SweepRecord, SweepState
from tpuops.sweeps.template import trial_run_id

ACTIVE = "sweeps-active/"
SWEEPS = "sweeps/"
RECORD = "sweep.json"
STATE = "state.json"


def record_key(name: str) -> str:
    return f"{SWEEPS}{name}/{RECORD}"


def state_key(name: str) -> str:
    return f"{SWEEPS}{name}/{STATE}"


def declare_sweep(store: Store, record: SweepRecord) -> None:
    """Write the sweep's record and state; a sweep of that name existing already is an error."""
    name = record.name
    try:
        store.write_if_generation_match(record_key(name), record.to_bytes(), 0)
    except PreconditionFailed:
        raise UsageError(f"a sweep named {name!r} exists already in {store.uri}: choose another name "
                         f"('tpuops sweep status {name}' shows it)") from None
    store.write_if_generation_match(state_key(name), SweepState().to_bytes(), 0)


def mark_active(store: Store, name: str) -> None:
    """Put the sweep on the list a pass advances (after its study exists)."""
    store.write_bytes(ACTIVE + name, b"")


def read_sweep(store: Store, name: str) -> SweepRecord:
    """The sweep's record; ``UsageError`` when the name breaks the naming rule, there is no such sweep or
    its record is malformed."""
    check_sweep_name(name)
    return runs.read_document(store, record_key(name), SweepRecord,
                              f"no sweep {name!r} in {store.uri} ('tpuops sweep list' lists them)")


def load_state(store: Store, name: str) -> tuple[SweepState, int]:
    """The sweep's state and its generation (a fresh state and 0 when there is none)."""
    key = state_key(name)
    try:
        data, generation = store.read_versioned(key)
    except NotFound:
        return SweepState(), 0
    return parse(SweepState, data, store.uri_of(key)), generation


def save_state(store: Store, name: str, state: SweepState, generation: int) -> int:
    """Compare-and-swap; PreconditionFailed when someone else (``sweep stop``) wrote it since."""
    new = store.write_if_generation_match(state_key(name), state.to_bytes(), generation)
    if state.finished and not any(notice.waiting for notice in state.notices):  # undelivered: stays in the passes
        store.delete(ACTIVE + name)
    return new


def request_stop(store: Store, name: str) -> SweepState:
    """``sweep stop``: no new trials; the next pass stops the running ones (they checkpoint) and ends the sweep."""
    read_sweep(store, name)
    for _ in range(10):
        state, generation = load_state(store, name)
        if state.phase is not SweepPhase.ACTIVE:
            return state
        state.phase = SweepPhase.STOPPING
        try:
            save_state(store, name, state, generation)
        except PreconditionFailed:
            continue  # a pass wrote it meanwhile: read again
        return state
    raise TpuopsError(f"sweep {name}: its state kept changing; try again")


def diagnose_sweep(store: Store, name: str) -> dict[str, str]:
    """Which of the sweep's documents are damaged: name (``sweep.json``, ``state.json``) -> what is wrong.
    ``UsageError`` when there is no such sweep (its record is not there at all, ``read_sweep``)."""
    damage: dict[str, str] = {}
    for document, read in ((RECORD, lambda: read_sweep(store, name)), (STATE, lambda: load_state(store, name))):
        try:
            read()
        except DamagedDocument as err:
            damage[document] = str(err)
    return damage


def repair_sweep(store: Store, name: str, damage: dict[str, str], now: str) -> list[str]:
    """Rebuild what ``diagnose_sweep`` found damaged, as far as the store allows; what was done.

    state.json is rebuilt from the sweep's active marker (an unfinished sweep has one): active, or finished
    with the reason that its state was lost; its pass count and the trials the endgame promoted are lost (the
    damaged bytes are kept as ``state.json.damaged``, compare-and-swap on them). sweep.json, the only copy of
    the frozen trial template, cannot be rebuilt: the sweep is taken off the passes' list, so that no pass
    fails on it again; its running trials go on as runs to their end (``tpuops sweep list`` still shows it).
    """
    done = []
    if STATE in damage:
        key = state_key(name)
        data, generation = store.read_versioned(key)
        store.write_bytes(key + DAMAGED_SUFFIX, data)
        state = SweepState(last_pass=now)
        if not store.exists(ACTIVE + name):
            state.finish(SweepOutcome.FAILED, "its state.json was damaged after it ended; how it ended is not known")
        try:
            store.write_if_generation_match(key, state.to_bytes(), generation)
        except PreconditionFailed:
            raise TpuopsError(f"sweep {name}: its state changed while it was repaired; run the repair again") from None
        done.append(f"state.json rebuilt: {state.phase}")
    if RECORD in damage:
        store.delete(ACTIVE + name)
        done.append("sweep.json cannot be rebuilt: the sweep is off the passes' list, its running trials go on "
                    "as runs")
    return done


def active_sweeps(store: Store) -> list[str]:
    return [obj.key[len(ACTIVE):] for obj in store.list(ACTIVE)]


def all_sweeps(store: Store) -> list[str]:
    return sorted({obj.key.split("/")[1] for obj in store.list(SWEEPS) if obj.key.endswith("/" + RECORD)})


def declare_trial_run(store: Store, sweep: SweepRecord, number: int, params: dict[str, Any]) -> bool:
    """Declare the trial's run unless it exists; True if this call declared it.

    ``runs.declare`` writes the spec, then the record, then the index markers. A run whose record
    exists was declared by an earlier pass, which may have died before the markers: they are
    written again (idempotent), so the controller sees it. Its spec must be the trial's (compared
    as JSON, not as bytes, so a run declared by an older version with other key order is adopted).
    """
    run_id = trial_run_id(sweep.name, number)
    trial = sweep.template.for_trial(number, params)
    spec = runs.spec_json(trial.spec)
    if runs.run_exists(store, run_id):
        if json.loads(store.read_bytes(runs.spec_key(run_id))) != spec:
            raise TpuopsError(f"run {run_id} exists with other parameters than trial {number} of "
                              f"sweep {sweep.name}: refusing to adopt it")
        store.write_bytes(runs.layout.INDEX_RUNS + run_id, b"")
        if not runs.load_memory(store, run_id)[0].finished:
            runs.mark_active(store, run_id)
        return False
    try:
        runs.declare(store, trial.record, spec)
    except UsageError as err:  # a spec with other bytes: never adopt a run of other params
        raise TpuopsError(f"run {run_id}: {err}") from None
    return True
