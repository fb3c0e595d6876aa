"""The TPE samplers of a pass share one search space (``tpuops.sweeps.tpe``): they draw what fresh ones draw."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from tpuops.sweeps.studies import trial_seed
from tpuops.sweeps.tpe import SharedSpaceTPE, new_space

pytestmark = pytest.mark.unit

SPACE = {"filters": CategoricalDistribution([8, 16, 32]), "learning_rate": FloatDistribution(1e-4, 0.3, log=True)}


def _draws(shared: bool, trials: int = 60, parallel: int = 5) -> list[dict]:
    """Ask ``trials`` trials, ``parallel`` at a time, each with a sampler seeded by its number (as a sweep does);
    the oldest running one is told (complete, or pruned at an intermediate value) before each new ask."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    space = new_space()
    running: list[optuna.trial.Trial] = []
    drawn = []
    for number in range(trials):
        seed = trial_seed(7, number)
        study.sampler = (SharedSpaceTPE(space, seed=seed, n_startup_trials=10) if shared
                         else optuna.samplers.TPESampler(seed=seed, n_startup_trials=10))
        trial = study.ask(SPACE)
        drawn.append(trial.params)
        running.append(trial)
        if len(running) >= parallel:
            done = running.pop(0)
            score = -abs(done.params["learning_rate"] - 0.01) + done.params["filters"] / 100
            done.report(score, step=1)
            if done.number % 3 == 0:
                study.tell(done, state=TrialState.PRUNED)
            else:
                study.tell(done, score)
    return drawn


def test_samplers_sharing_a_search_space_draw_what_fresh_samplers_draw() -> None:
    assert _draws(shared=True) == _draws(shared=False)
