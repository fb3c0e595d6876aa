"""A sweep's documents in the store, next to its study and its runs: every read and write of them.

    sweeps/<sweep>/sweep.json   the ``SweepRecord``, written once (compare-and-swap on generation 0):
                                the validated spec, the frozen trial template (a run record and a
                                run spec, with the node request frozen at ``sweep start``), the
                                projected cost of one trial, when it started
    sweeps/<sweep>/state.json   the ``SweepState``: phase (active | stopping | finished), outcome,
                                reason, last pass; changed with compare-and-swap
    sweeps/<sweep>/journal/     the study, when it is kept in the store (``tpuops.sweeps.journal``)
    sweeps/<sweep>/state.json.damaged   a damaged state as it was, kept by ``tpuops sweep repair``
    sweeps/<sweep>/sweep.json.older     a sweep.json of the older format as it was, kept by ``upgrade_sweep``
    sweeps-active/<sweep>       a marker while the sweep is unfinished: a pass lists this prefix
                                only, so its cost does not grow with finished sweeps or their trials

Trial N of sweep S is the run ``S-tNNNN`` (``tpuops.runs``), made by ``TrialTemplate.for_trial``;
its record carries ``sweep`` (node label, ledger rows). Declaring it is write-once: a pass that
died half way through declaring is finished by the next one, and a run that exists is never
declared again.

A sweep.json written before the trial template held the project and store root that its trials'
startup scripts are rendered with is of an older format: it is upgraded once (``upgrade_sweep``,
by the next pass or ``tpuops sweep repair``) with the config's project and store root, and
rewritten; no rendered startup script is read back for them.
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
OLDER = "sweep.json (older format)"
"""What ``diagnose_sweep`` calls a sweep.json of the older format, which ``repair_sweep`` upgrades."""
OLDER_SUFFIX = ".older"


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


def _older(data: bytes) -> dict[str, Any] | None:
    """A sweep.json of the older format (a template without ``project`` and ``store_root``), parsed; else None."""
    try:
        document = json.loads(data)
    except ValueError:
        return None
    template = document.get("template") if isinstance(document, dict) else None
    if not isinstance(template, dict) or "record" not in template or {"project", "store_root"} & set(template):
        return None
    return document


def upgrade_sweep(store: Store, name: str, *, project: str, store_root: str) -> bool:
    """Rewrite a sweep.json of the older format with ``project`` and ``store_root`` (the config's) frozen into its
    template; True when this call did. Its bytes as they were are kept as ``sweep.json.older``; compare-and-swap.

    Raises:
        DamagedDocument: the upgraded record is still not a sweep's (the file is damaged, not only older).
    """
    key = record_key(name)
    data, generation = store.read_versioned(key)
    document = _older(data)
    if document is None:
        return False
    upgraded = parse(SweepRecord, json.dumps({**document, "template": {
        **document["template"], "project": project, "store_root": store_root}}).encode(), store.uri_of(key))
    store.write_bytes(key + OLDER_SUFFIX, data)
    try:
        store.write_if_generation_match(key, upgraded.to_bytes(), generation)
    except PreconditionFailed:
        return False  # another pass or a repair upgraded it meanwhile
    return True


def diagnose_sweep(store: Store, name: str) -> dict[str, str]:
    """Which of the sweep's documents are damaged: name (``sweep.json``, ``state.json``, or ``OLDER``) -> what is
    wrong. ``UsageError`` when there is no such sweep (its record is not there at all, ``read_sweep``)."""
    damage: dict[str, str] = {}
    for document, read in ((RECORD, lambda: read_sweep(store, name)), (STATE, lambda: load_state(store, name))):
        try:
            read()
        except DamagedDocument as err:
            damage[document] = str(err)
    if RECORD in damage and _older(store.read_bytes(record_key(name))) is not None:
        del damage[RECORD]
        damage[OLDER] = ("written by an older tpuops: its trial template lacks the project and store root that its "
                         "trials are rendered with; a repair (or the next pass) freezes tpuops.toml's into it")
    return damage


def repair_sweep(store: Store, name: str, damage: dict[str, str], now: str, *, project: str,
                 store_root: str) -> list[str]:
    """Rebuild what ``diagnose_sweep`` found damaged, as far as the store allows; what was done.

    state.json is rebuilt from the sweep's active marker (an unfinished sweep has one): active, or finished
    with the reason that its state was lost; its pass count and the trials the endgame promoted are lost (the
    damaged bytes are kept as ``state.json.damaged``, compare-and-swap on them). sweep.json, the only copy of
    the frozen trial template, cannot be rebuilt: the sweep is taken off the passes' list, so that no pass
    fails on it again; its running trials go on as runs to their end (``tpuops sweep list`` still shows it).
    A sweep.json of the older format is upgraded (``upgrade_sweep``) with ``project`` and ``store_root``.
    """
    done = []
    if OLDER in damage:
        try:
            upgraded = upgrade_sweep(store, name, project=project, store_root=store_root)
        except DamagedDocument:
            damage[RECORD] = damage.pop(OLDER)
        else:
            done.append(f"sweep.json upgraded: its trial template holds project {project} and store root "
                        f"{store_root}" if upgraded else "sweep.json was upgraded meanwhile")
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
        runs.index_run(store, run_id)
        if not runs.load_memory(store, run_id)[0].finished:
            runs.mark_active(store, run_id)
        return False
    try:
        runs.declare(store, trial.record, spec)
    except UsageError as err:  # a spec with other bytes: never adopt a run of other params
        raise TpuopsError(f"run {run_id}: {err}") from None
    return True
