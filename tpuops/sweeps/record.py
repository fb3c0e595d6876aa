"""A sweep's own state in the store, next to its study and its runs.

    sweeps/<sweep>/sweep.json   written once (compare-and-swap on generation 0): the validated spec,
                                the run template (the agent's run spec and the run record every
                                trial copies), the projected cost of one trial, when it started
    sweeps/<sweep>/state.json   phase (active | stopping | finished), outcome, reason, last pass;
                                changed with compare-and-swap
    sweeps-active/<sweep>       a marker while the sweep is unfinished: a pass lists this prefix
                                only, so its cost does not grow with finished sweeps or their trials

Trial N of sweep S is the run ``S-tNNNN`` (``tpuops.runs``); its run spec is the template's with the
trial's params over the experiment's hparams, its record carries ``sweep`` (node label, ledger rows).
Declaring it is write-once: a pass that died half way through declaring is finished by the next
one, and a run that exists is never declared again.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from tpuops import runs
from tpuops.config import Settings
from tpuops.errors import NotFound, PreconditionFailed, TpuopsError, UsageError
from tpuops.naming import check_sweep_name
from tpuops.runs import NodeSpec, RunRecord
from tpuops.store import Store

UTC = timezone.utc  # datetime.UTC exists from Python 3.11 only
ACTIVE = "sweeps-active/"


@dataclass
class SweepState:
    phase: str = "active"  # active | stopping | finished
    outcome: str | None = None  # completed | stopped | budget-exhausted | failed
    reason: str | None = None
    passes: int = 0
    last_pass: str | None = None
    waiting: str | None = None
    """Why the last pass launched nothing although trials were left (the budget), if it did."""
    promoted: list[int] = field(default_factory=list)
    """Trials the endgame moved to on-demand."""

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1, sort_keys=True) + "\n").encode()


def trial_run_id(sweep: str, number: int) -> str:
    return f"{sweep}-t{number:04d}"


def _dump(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def declare_sweep(store: Store, name: str, record: dict[str, Any]) -> None:
    """Write the sweep's record, state and active marker; a sweep of that name existing already is an error."""
    try:
        store.write_if_generation_match(f"sweeps/{name}/sweep.json", _dump(record), 0)
    except PreconditionFailed:
        raise UsageError(f"a sweep named {name!r} exists already in {store.uri}: choose another name "
                         f"('tpuops sweep status {name}' shows it)") from None
    store.write_if_generation_match(f"sweeps/{name}/state.json", SweepState().to_bytes(), 0)


def mark_active(store: Store, name: str) -> None:
    """Put the sweep on the list a pass advances (after its study exists)."""
    store.write_bytes(ACTIVE + name, b"")


def read_record(store: Store, name: str) -> dict[str, Any]:
    check_sweep_name(name)
    try:
        return json.loads(store.read_bytes(f"sweeps/{name}/sweep.json"))
    except NotFound:
        raise UsageError(f"no sweep {name!r} in {store.uri} ('tpuops sweep list' lists them)") from None


def load_state(store: Store, name: str) -> tuple[SweepState, int]:
    try:
        data, generation = store.read_versioned(f"sweeps/{name}/state.json")
    except NotFound:
        return SweepState(), 0
    known = set(SweepState.__dataclass_fields__)
    return SweepState(**{k: v for k, v in json.loads(data).items() if k in known}), generation


def save_state(store: Store, name: str, state: SweepState, generation: int) -> int:
    """Compare-and-swap; PreconditionFailed when someone else (``sweep stop``) wrote it since."""
    new = store.write_if_generation_match(f"sweeps/{name}/state.json", state.to_bytes(), generation)
    if state.phase == "finished":
        store.delete(ACTIVE + name)
    return new


def request_stop(store: Store, name: str) -> SweepState:
    """``sweep stop``: no new trials; the next pass stops the running ones (they checkpoint) and ends the sweep."""
    read_record(store, name)
    for _ in range(10):
        state, generation = load_state(store, name)
        if state.phase != "active":
            return state
        state.phase = "stopping"
        try:
            save_state(store, name, state, generation)
        except PreconditionFailed:
            continue  # a pass wrote it meanwhile: read again
        return state
    raise TpuopsError(f"sweep {name}: its state kept changing; try again")


def active_sweeps(store: Store) -> list[str]:
    return [obj.key[len(ACTIVE):] for obj in store.list(ACTIVE)]


def all_sweeps(store: Store) -> list[str]:
    return sorted({obj.key.split("/")[1] for obj in store.list("sweeps/") if obj.key.endswith("/sweep.json")})


def trial_run(settings: Settings, store: Store, template: dict[str, Any], sweep: str, number: int,
              params: dict[str, Any]) -> tuple[RunRecord, dict[str, Any]]:
    """The record and run spec of trial ``number``: the template's, renamed, with the trial's params.

    The spec is a pure function of its inputs (so a repeated declare writes the same bytes); the
    record's node request is rendered again for the trial's name, like ``jobs`` renders a run's.
    """
    from tpuops.jobs import job_argv
    from tpuops.provision import plan_up

    run_id = trial_run_id(sweep, number)
    spec = copy.deepcopy(template["spec"])
    spec["run_id"] = run_id
    spec["hparams"] = {**spec.get("hparams", {}), **params}
    base = RunRecord.model_validate(template["record"])
    up = plan_up(settings, run_id, accelerator=base.node.accelerator, capacity=base.node.capacity,
                 runtime=base.node.runtime, run_id=run_id, sweep_id=sweep,
                 job=job_argv(store, base.bundle_sha256 or "", run_id, base.kind.value))
    record = base.model_copy(update={"run_id": run_id, "node": NodeSpec.of(up.request, base.node.zones),
                                     "created": datetime.now(UTC).isoformat(timespec="seconds"), "sweep": sweep})
    return record, spec


def declare_trial_run(settings: Settings, store: Store, template: dict[str, Any], sweep: str, number: int,
                      params: dict[str, Any]) -> bool:
    """Declare the trial's run unless it exists; True if this call declared it.

    ``runs.declare`` writes the spec, then the record, then the index markers. A run whose record
    exists was declared by an earlier pass, which may have died before the markers: they are
    written again (idempotent), so the controller sees it.
    """
    run_id = trial_run_id(sweep, number)
    record, spec = trial_run(settings, store, template, sweep, number, params)
    if runs.run_exists(store, run_id):
        if store.read_bytes(runs.spec_key(run_id)) != (json.dumps(spec, indent=2) + "\n").encode():
            raise TpuopsError(f"run {run_id} exists with other parameters than trial {number} of "
                              f"sweep {sweep}: refusing to adopt it")
        store.write_bytes(runs.layout.INDEX_RUNS + run_id, b"")
        if not runs.load_memory(store, run_id)[0].finished:
            runs.mark_active(store, run_id)
        return False
    try:
        runs.declare(store, record, spec)
    except UsageError as err:  # a spec with other bytes: never adopt a run of other params
        raise TpuopsError(f"run {run_id}: {err}") from None
    return True
