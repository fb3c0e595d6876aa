"""Optuna's TPE with its search space worked out once per pass, not once per trial.

tpuops rebuilds the sampler before every ask, seeded by the trial's number (``studies.sampler_for``),
so that any pass on any machine draws trial N's params alike. A fresh ``TPESampler`` works out its
relative search space (the intersection of the distributions of every finished trial) from the
whole study, so a pass that launched a wave of trials at a 1,000-trial sweep did that for each, and
it was a fifth of the simulation's CPU time. Optuna's ``IntersectionSearchSpace`` caches what it has
seen of a study (finished trials stay finished); one instance shared by the samplers of a pass gives
the space a fresh one would, so the draws are the same. Imported only where a sweep samples (it
imports Optuna).
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution
from optuna.samplers import TPESampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import Study
from optuna.trial import FrozenTrial


def new_space() -> IntersectionSearchSpace:
    """What a ``TPESampler`` keeps for its relative search space (pruned trials included, as TPE counts them)."""
    return IntersectionSearchSpace(include_pruned=True)


class SharedSpaceTPE(TPESampler):
    """``TPESampler`` (its defaults: the multivariate TPE for one objective) whose relative search space comes
    from ``space``, shared with the other samplers of the same study."""

    def __init__(self, space: IntersectionSearchSpace, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.space = space

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if len(study.directions) > 1:  # TPE's default for several objectives is the independent TPE: no relative space
            return {}
        return {name: distribution for name, distribution in self.space.calculate(study, use_cache=True).items()
                if not distribution.single()}
