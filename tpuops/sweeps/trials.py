"""What a sweep pass does to its study's trials, through Optuna's public API only.

A pass names trials by number (the run of trial N is ``<sweep>-tNNNN``); Optuna's storage names
them by id. This module turns one into the other with the storage's own lookup
(``get_trial_id_from_study_id_trial_number``, cached for the pass) and keeps every other call to
Optuna public: ``BaseStorage`` methods for values and attributes, ``Study.tell``, the study's
``pruner``, ``Trial(study, trial_id)`` and its ``suggest_*`` methods to draw params that an ask
which died left undrawn. Trial states cross as ``TrialState`` (``tpuops.sweeps.decide``), by
Optuna's names; a test fails if Optuna renames one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuops.sweeps import studies
from tpuops.sweeps.decide import TrialState
from tpuops.sweeps.spec import SweepSpec

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.search_space import IntersectionSearchSpace
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

    from tpuops.sweeps.journal import StoreJournal

RUN_ID_ATTR = "run_id"
ENDED_ATTR = "ended"
FAILURE_ATTR = "failure"


def state_of(trial: FrozenTrial) -> TrialState:
    return TrialState(trial.state.name)


def optuna_state(state: TrialState) -> optuna.trial.TrialState:
    from optuna.trial import TrialState as OptunaTrialState

    return OptunaTrialState[state.value]


class PassStudy:
    """The sweep's study as one pass uses it (the caller holds the sweep's lease)."""

    def __init__(self, spec: SweepSpec, storage: BaseStorage, journal: StoreJournal | None = None) -> None:
        self.spec = spec
        self.storage = storage
        self.journal = journal
        """The store journal under ``storage`` when the study is kept in the store (its appends may be batched)."""
        self.study = studies.load_study(spec, storage)
        self.study_id = storage.get_study_id_from_name(spec.name)
        self._ids: dict[int, int] = {}
        self._space: IntersectionSearchSpace | None = None  # the TPE search space this pass's samplers share

    def _sampler_space(self) -> IntersectionSearchSpace | None:
        if self.spec.sampler.type != "tpe":
            return None
        if self._space is None:
            from tpuops.sweeps.tpe import new_space

            self._space = new_space()
        return self._space

    def durable(self) -> None:
        """Write what this pass told the study so far (before a trial's run is declared)."""
        if self.journal is not None:
            self.journal.flush()

    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def _id(self, number: int) -> int:
        if number not in self._ids:
            self._ids[number] = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self._ids[number]

    def frozen(self, number: int) -> FrozenTrial:
        """The trial as the storage holds it now (after a tell: its state, value and params)."""
        return self.storage.get_trial(self._id(number))

    def report(self, number: int, step: int, value: float) -> None:
        self.storage.set_trial_intermediate_value(self._id(number), step, value)

    def pruned_at(self, number: int) -> tuple[int, float] | None:
        """Whether the pruner stops the trial now: the (step, value) it judged, or None."""
        fresh = self.storage.get_trial(self._id(number))
        if not self.study.pruner.prune(self.study, fresh):
            return None
        step = max(fresh.intermediate_values)
        return step, fresh.intermediate_values[step]

    def tell(self, number: int, state: TrialState, value: float | None, why: str, failure: bool) -> None:
        """End the trial (a trial ended already stays as it was), saying why and whether it counts as a failure."""
        trial_id = self._id(number)
        self.storage.set_trial_user_attr(trial_id, ENDED_ATTR, why)
        if failure:
            self.storage.set_trial_user_attr(trial_id, FAILURE_ATTR, True)
        self.study.tell(number, value if state is TrialState.COMPLETE else None, state=optuna_state(state),
                        skip_if_finished=True)

    def ask(self) -> int:
        """A new trial (an enqueued grid point first); its number."""
        trial = studies.ask(self.study, self.spec, self._sampler_space())
        self._ids[trial.number] = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number)
        return trial.number

    def params(self, number: int, run_id: str) -> dict[str, Any]:
        """The trial's params, drawn now if the ask died before it drew them, with its run id attached."""
        import optuna

        trial_id = self._id(number)
        frozen = self.storage.get_trial(trial_id)
        missing = {k: d for k, d in studies.distributions(self.spec).items() if k not in frozen.params}
        if missing:
            self.study.sampler = studies.sampler_for(self.spec, number, self._sampler_space())
            live = optuna.trial.Trial(self.study, trial_id)
            for name, distribution in missing.items():
                _suggest(live, name, distribution)
            frozen = self.storage.get_trial(trial_id)
        if frozen.user_attrs.get(RUN_ID_ATTR) != run_id:
            self.storage.set_trial_user_attr(trial_id, RUN_ID_ATTR, run_id)
        return studies.trial_params(frozen.params)


def _suggest(trial: optuna.trial.Trial, name: str, distribution: BaseDistribution) -> None:
    """Draw one param with the public ``suggest_*`` that makes exactly ``distribution``."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(distribution, FloatDistribution):
        trial.suggest_float(name, distribution.low, distribution.high, step=distribution.step, log=distribution.log)
    elif isinstance(distribution, IntDistribution):
        trial.suggest_int(name, distribution.low, distribution.high, step=distribution.step, log=distribution.log)
    elif isinstance(distribution, CategoricalDistribution):
        trial.suggest_categorical(name, distribution.choices)
    else:  # pragma: no cover - studies.distributions makes only these three
        raise TypeError(f"param {name}: no suggest_* makes a {type(distribution).__name__}")
