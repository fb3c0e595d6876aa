"""The invariants of a seed's sweep (``tpuops.sim.swarm.sweeps``): each a named checker whose docstring states it.

Like every checker (``tpuops.sim.swarm.invariants``) each reads the runner's ``Trace`` and returns one line per
violation; a seed without a sweep passes them all. What changes pass by pass is read cheaply after every pass (the
trial runs declared, the creates the cloud took); what only the study holds (its trials' states, values and params,
and its journal's every log) is read once the sweep is over, after the first pass that finds it finished, and at the
end, each time through the real journal in the store, as ``tpuops sweep status`` reads it. A sweep that one of its
trials' poisoned runs holds (its memory or record garbled: the sweep cannot judge it) is excused from ending.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from tpuops import runs
from tpuops.core.errors import TpuopsError
from tpuops.runs import ExitClass, Outcome
from tpuops.sim.engine import START
from tpuops.sim.swarm.sweeps import METRIC, NAME, SweepWatch
from tpuops.sweeps import studies
from tpuops.sweeps.decide import ENDED, TrialState
from tpuops.sweeps.models import SweepOutcome
from tpuops.sweeps.template import trial_run_id
from tpuops.sweeps.trials import RUN_ID_ATTR, state_of

if TYPE_CHECKING:
    from tpuops.sim.swarm.trace import Trace

_ENDED_EARLY = (SweepOutcome.STOPPED, SweepOutcome.BUDGET_EXHAUSTED)
"""How a sweep that may tell a trial without a run ended."""
_SET_STATE = 6
"""Optuna's journal operation code (``JournalOperation.SET_TRIAL_STATE_VALUES``) of a trial's state and values."""


def _declared(watch: SweepWatch) -> list[int]:
    """The trial numbers whose runs are declared (up to a wave past the requested trials), their params read once."""
    spec = watch.spec
    found = []
    for number in range(spec.trials + spec.parallel):
        if number in watch.params:
            found.append(number)
            continue
        run_id = trial_run_id(NAME, number)
        if not runs.run_exists(watch.sim.store, run_id):
            continue
        try:
            watch.params[number] = runs.read_run_spec(watch.sim.store, run_id).get("hparams") or {}
        except (TpuopsError, ValueError):
            continue  # a spec being written: read again next pass
        found.append(number)
    return found


def _poisoned(trace: Trace) -> bool:
    return any(run_id.startswith(f"{NAME}-t") for run_id in trace.poisoned)


# -- after every pass -------------------------------------------------------------------------------


def no_duplicate(trace: Trace) -> list[str]:
    """sweeps: no trial is run twice and no params draw is duplicated: no two declared trial runs hold the same
    params; once the sweep is over, in its study too: each trial's run id names its own run (``<sweep>-tNNNN``: no
    two runs for one trial, no run adopted by another trial), no two trials drew the same params, and each trial's
    declared run holds exactly its trial's draw."""
    watch = trace.sweep
    if watch is None:
        return []
    bad = []
    seen: dict[str, int] = {}
    for number in _declared(watch):
        key = repr(sorted(watch.params[number].items()))
        if key in seen:
            bad.append(f"trial runs {seen[key]} and {number} hold the same params {watch.params[number]}")
        seen.setdefault(key, number)
    final = watch.final()
    if final is None or watch.duplicates_checked:
        return bad
    watch.duplicates_checked = True
    drawn: dict[str, int] = {}
    for trial in final[0]:
        run_id = trial.user_attrs.get(RUN_ID_ATTR)
        if run_id not in (None, trial_run_id(NAME, trial.number)):
            bad.append(f"trial {trial.number} names run {run_id}")
        params = studies.trial_params(trial.params)
        key = repr(sorted(params.items()))
        if params and key in drawn:
            bad.append(f"trials {drawn[key]} and {trial.number} drew the same params {params}")
        drawn.setdefault(key, trial.number)
        held = watch.params.get(trial.number)
        if held is not None and held != params:
            bad.append(f"trial {trial.number}'s run holds {held}, its trial drew {params}")
    return bad


def nothing_after_stop(trace: Trace) -> list[str]:
    """sweeps: a stopped sweep starts nothing after the user's ``stop --sweep``: no node is created for any of its
    trials (nor a probe of one) once the stop is recorded, no run is declared for a trial its study did not hold at
    the stop, and, once it is over, its study holds no trial asked after the stop (nothing is created for an ended
    run or sweep)."""
    watch = trace.sweep
    if watch is None or watch.stopped_at is None:
        return []
    stopped = watch.stopped_at
    bad = [f"{name}: node created in {zone} at +{(at - START) / 60:.1f} min, after the sweep was stopped at "
           f"+{(stopped - START) / 60:.1f} min" for at, zone, name in trace.creates
           if at > stopped and name.startswith(f"{NAME}-t")]
    bad += [f"{trial_run_id(NAME, number)}: declared after the sweep was stopped with {watch.asked_at_stop} trials"
            for number in _declared(watch) if number >= watch.asked_at_stop]
    final = watch.final()
    if final is not None and len(final[0]) > watch.asked_at_stop:
        bad.append(f"the study holds {len(final[0])} trials, {watch.asked_at_stop} when the sweep was stopped")
    return bad


# -- at the end of the seed -------------------------------------------------------------------------


def exact_trials(trace: Trace) -> list[str]:
    """sweeps: a sweep ends (its state finished, off the passes' list) and every trial of its study ended (COMPLETE,
    PRUNED or FAIL) with its run declared and finished, none lost (but a trial a stopped or out-of-budget sweep told
    FAIL before its run was declared, which has none); no run is declared for a trial its study does not hold; it
    ran at most the requested number of trials, and one that ended ``completed`` (not stopped, out of budget or
    failed) exactly that many."""
    watch = trace.sweep
    if watch is None or _poisoned(trace):
        return []
    final = watch.final()
    if final is None:
        return [f"sweep {NAME} has not finished at +{(trace.now - START) / 60:.1f} min"]
    trials = final[0]
    spec = watch.spec
    state = watch.state()
    outcome = state.outcome if state is not None else None
    bad = []
    if len(trials) > spec.trials or (outcome is SweepOutcome.COMPLETED and len(trials) != spec.trials):
        bad.append(f"sweep {NAME} ended {outcome} with {len(trials)} trials, {spec.trials} requested")
    numbers = {trial.number for trial in trials}
    for trial in trials:
        run_id = trial_run_id(NAME, trial.number)
        memory = trace.memory(run_id)
        if state_of(trial) not in ENDED:
            bad.append(f"trial {trial.number} is still {state_of(trial)} after its sweep ended")
        if not runs.run_exists(watch.sim.store, run_id):
            if state_of(trial) is not TrialState.FAIL or outcome not in _ENDED_EARLY:
                bad.append(f"trial {trial.number} is {state_of(trial)} without a run ({run_id} was never declared; "
                           f"the sweep ended {outcome})")
        elif memory is not None and not memory.finished:
            bad.append(f"{run_id}: not finished after its sweep ended {outcome}")
    bad += [f"{trial_run_id(NAME, number)} was declared, its study holds no trial {number}"
            for number in _declared(watch) if number not in numbers]
    if watch.active():
        bad.append(f"sweep {NAME} ended but is still on the passes' list")
    return bad


def _objective(watch: SweepWatch, run_id: str) -> float | None:
    """The objective a succeeded run's status reported (its final evaluation); None when it cannot be read."""
    try:
        status = runs.read_status(watch.sim.store, run_id)
    except TpuopsError:
        return None
    if status is None or status.exit_class is not ExitClass.SUCCEEDED:
        return None
    return status.eval_metric(METRIC)


def study_matches_store(trace: Trace) -> list[str]:
    """sweeps: the Optuna study agrees with the store's records: a COMPLETE trial's run succeeded and its value is
    the objective the run's status reported; a trial whose run ended any other way (failed, stopped, pruned, out
    of budget) is never COMPLETE; a run that succeeded with a finite objective is its trial's COMPLETE value; and
    no trial's ending is told twice (the journal holds at most one finished state per trial, whatever kills and
    retries came between)."""
    watch = trace.sweep
    if watch is None:
        return []
    final = watch.final()
    if final is None:
        return []  # exact_trials says it never ended
    trials, logs = final
    bad = []
    for trial in trials:
        run_id = trial_run_id(NAME, trial.number)
        memory = trace.memory(run_id)
        if memory is None or run_id in trace.poisoned or not memory.finished:
            continue
        state, value = state_of(trial), trial.value
        succeeded = memory.outcome is Outcome.SUCCEEDED
        reported = _objective(watch, run_id) if succeeded else None
        if state is TrialState.COMPLETE and not succeeded:
            bad.append(f"trial {trial.number} told COMPLETE ({value}), its run ended {memory.outcome}")
        elif state is TrialState.COMPLETE and reported is not None and value != reported:
            bad.append(f"trial {trial.number} told COMPLETE with {value}, its run reported {reported}")
        elif reported is not None and math.isfinite(reported) and state is not TrialState.COMPLETE:
            bad.append(f"trial {trial.number} told {state}, its run succeeded with {METRIC} {reported}")
    told = _told(logs)
    bad += [f"trial {number}'s ending told {times} times in the journal" for number, times in sorted(told.items())
            if times > 1]
    return bad


def _told(logs: list[dict[str, Any]]) -> Counter[int]:
    """By trial number: how many finished states (COMPLETE, PRUNED, FAIL) the journal's logs set. One study per
    journal: a trial's id is its number (both count the trials created before it)."""
    from optuna.trial import TrialState as OptunaState

    return Counter(log["trial_id"] for log in logs
                   if log.get("op_code") == _SET_STATE and OptunaState(log["state"]).is_finished())
