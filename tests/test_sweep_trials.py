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
