"""A pass's operations on its study's trials, through Optuna's public API (``tpuops.sweeps.trials``).

The trial states a sweep's rules use are Optuna's by name (this fails if Optuna renames one);
a pass reports, prunes, tells and draws the params an ask that died left undrawn.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tpuops.store import LocalStore
from tpuops.sweeps import studies
from tpuops.sweeps.decide import TrialState
from tpuops.sweeps.spec import SweepSpec
from tpuops.sweeps.trials import PassStudy, optuna_state, state_of

pytestmark = pytest.mark.unit


def _spec() -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "adapter", "experiment": "x.yaml", "trials": 10,
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}, "n": {"type": "int", "low": 1, "high": 9},
                  "opt": {"type": "categorical", "choices": ["adam", "sgd"]}},
        "sampler": {"type": "random", "seed": 3}, "pruner": {"type": "median", "startup_trials": 1}})


@pytest.fixture
def study(tmp_path: Path) -> PassStudy:
    store = LocalStore(tmp_path / "store")
    spec = _spec()
    studies.create_study(spec, studies.open_storage(spec, store))
    return PassStudy(spec, studies.open_storage(spec, store, exclusive=True))


def test_every_trial_state_of_the_rules_is_optunas_of_that_name() -> None:
    assert {optuna_state(state).name for state in TrialState} == {state.value for state in TrialState}
    assert all(isinstance(optuna_state(state), optuna.trial.TrialState) for state in TrialState)


def test_a_pass_reports_tells_and_prunes_by_trial_number(study: PassStudy) -> None:
    first, second = study.ask(), study.ask()
    for step, (a, b) in enumerate(((0.9, 0.1), (0.9, 0.1)), start=1):
        study.report(first, step, a)
        study.report(second, step, b)
    study.tell(first, TrialState.COMPLETE, 0.9, "succeeded: step 2", False)
    assert study.pruned_at(second) == (2, 0.1)  # below the median of the completed trial at step 2
    study.tell(second, TrialState.PRUNED, None, "pruned", True)
    trials = study.trials()
    assert [state_of(t) for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    assert (trials[0].value, trials[1].intermediate_values) == (0.9, {1: 0.1, 2: 0.1})
    assert (trials[0].user_attrs, trials[1].user_attrs) == ({"ended": "succeeded: step 2"},
                                                          {"ended": "pruned", "failure": True})


def test_params_an_ask_left_undrawn_are_drawn_once_with_the_trials_run_id(study: PassStudy) -> None:
    study.storage.create_new_trial(study.study_id)  # an ask that died before drawing its params
    params = study.params(0, "adapter-t0000")
    assert set(params) == {"x", "n", "opt"} and 0.0 <= params["x"] <= 1.0 and params["opt"] in ("adam", "sgd")
    assert isinstance(params["n"], int) and 1 <= params["n"] <= 9
    assert study.params(0, "adapter-t0000") == params
    assert study.trials()[0].user_attrs["run_id"] == "adapter-t0000"


def _segments(store: LocalStore, spec: SweepSpec) -> int:
    return sum(1 for o in store.list(studies.journal_prefix(spec.name) + "/") if "/seg-" in o.key)


def test_a_pass_writes_its_appends_as_one_segment_and_before_a_run_is_declared(tmp_path: Path) -> None:
    store, spec = LocalStore(tmp_path / "store"), _spec()
    studies.create_study(spec, studies.open_storage(spec, store))
    storage, journal = studies.open_journaled(spec, store, exclusive=True)
    assert journal is not None
    study, before = PassStudy(spec, storage, journal), _segments(store, spec)
    with journal.batched():
        number = study.ask()
        study.report(number, 1, 0.5)
        assert study.trials()[0].intermediate_values == {1: 0.5}  # this process reads its own appends at once
        assert _segments(store, spec) == before  # nothing written yet: another reader sees no trial
        assert studies.open_storage(spec, store).get_all_trials(study.study_id) == []
        study.durable()  # what a pass does before it declares the trial's run
        assert _segments(store, spec) == before + 1
        study.tell(number, TrialState.COMPLETE, 0.5, "succeeded", False)
    assert _segments(store, spec) == before + 2
    fresh = studies.open_storage(spec, store).get_all_trials(study.study_id)
    assert [(t.state.name, t.value, t.intermediate_values) for t in fresh] == [("COMPLETE", 0.5, {1: 0.5})]
    shared = studies.open_journaled(spec, store)[1]
    assert shared is not None
    with pytest.raises(ValueError, match="lease"):
        shared.batched().__enter__()  # only the lease holder batches


def test_a_kept_study_is_reused_for_the_same_tenure_and_catches_up_with_other_writers(tmp_path: Path) -> None:
    store, spec = LocalStore(tmp_path / "store"), _spec()
    studies.create_study(spec, studies.open_storage(spec, store))
    kept = studies.KeptStudies()
    first, _ = kept.open(spec, store, tenure=1)
    again, _ = kept.open(spec, store, tenure=1)
    assert again is first  # no replay of the journal
    other = studies.open_storage(spec, store)  # another writer (``sweep start``, a non-exclusive reader)
    study_id = other.get_study_id_from_name(spec.name)
    other.create_new_trial(study_id)
    caught, _ = kept.open(spec, store, tenure=1)
    assert caught is first and len(caught.get_all_trials(study_id)) == 1
    assert kept.open(spec, store, tenure=2)[0] is not first  # the lease was lost and taken again
    kept.forget(spec.name)
    assert kept.open(spec, store, tenure=2)[0] is not first
    assert kept.open(spec, store, tenure=None)[0] is not kept.open(spec, store, tenure=None)[0]
