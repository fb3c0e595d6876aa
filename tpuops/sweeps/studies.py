"""A sweep's Optuna study: its storage (store journal or database), sampler, pruner and search space.

Optuna runs on the control plane only, ask-and-tell (never ``optimize()``). The study is named
after the sweep, so ``optuna-dashboard`` over the same database (or a journal file exported with
``tpuops sweep report``) opens it.

Determinism: the sampler is rebuilt before every ask with a seed derived from the spec's seed
and the trial's number, so whichever pass (on whichever machine) asks for trial N, it draws the
same parameters given the same finished trials. Grids are enumerated by tpuops and enqueued once
(``spec.grid_points``), never left to Optuna's GridSampler.

Secrets: a database password comes from the environment variable or the owner-only file the
spec names, goes to the driver as a connect argument, and is never part of a URL, a message,
the store or a run spec.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuops.core.errors import TpuopsError, TransientError, UsageError
from tpuops.core.guards import Guard
from tpuops.store import Store
from tpuops.sweeps.spec import CategoricalParam, DatabaseStorage, FloatParam, SweepSpec

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.search_space import IntersectionSearchSpace
    from optuna.storages import BaseStorage

    from tpuops.sweeps.journal import StoreJournal


def journal_prefix(sweep: str) -> str:
    return f"sweeps/{sweep}/journal"


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)


def database_password(storage: DatabaseStorage, environ: Mapping[str, str] | None = None) -> str | None:
    """The password from ``password_file`` (mode 0600 or stricter) or ``password_env``; None when neither is set."""
    if storage.password_file:
        path = Path(storage.password_file).expanduser()
        try:
            info = path.stat()
        except FileNotFoundError:
            raise UsageError(f"storage.password_file {path}: no such file") from None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(f"storage.password_file {path} is readable by others "
                             f"(mode {stat.S_IMODE(info.st_mode):o}): chmod 600 {path}")
        return path.read_text().strip()
    env = os.environ if environ is None else environ
    if storage.password_env and env.get(storage.password_env):
        return env[storage.password_env]
    return None


def open_storage(spec: SweepSpec, store: Store, *, exclusive: bool = False,
                 environ: Mapping[str, str] | None = None) -> BaseStorage:
    """The sweep's Optuna storage; ``exclusive`` when the caller holds the sweep's lease (store journal)."""
    return open_journaled(spec, store, exclusive=exclusive, environ=environ)[0]


def open_journaled(spec: SweepSpec, store: Store, *, exclusive: bool = False,
                   environ: Mapping[str, str] | None = None) -> tuple[BaseStorage, StoreJournal | None]:
    """The storage and, when the study is kept in the store, its journal (which the lease holder compacts)."""
    _quiet_optuna()
    if isinstance(spec.storage, DatabaseStorage):
        return _database(spec.storage, environ), None
    from optuna.storages import JournalStorage

    from tpuops.sweeps.journal import StoreJournal

    journal = StoreJournal(store, journal_prefix(spec.name), exclusive=exclusive)
    return JournalStorage(journal), journal


class KeptStudies:
    """The store-journal studies one controller keeps open across its passes (``watch``, a simulation).

    Opening a journal study replays its whole log into Optuna's in-memory state: at a 1,000-trial
    sweep that replay, not the pass's work, was most of a pass. A controller that holds a sweep's
    lease for consecutive passes keeps the storage it opened instead, and at the start of each pass
    reads only the segments written since (one read that misses when nobody else wrote: the
    sweep's lease holder is the only writer, but ``sweep start`` or a non-exclusive reader may
    append too). What was kept is only good for the same tenure of the lease (``Leases.tenure``):
    a lease lost and taken again means another holder may have written and compacted, so the
    study is opened afresh. A pass that fails drops what it kept (``forget``).
    """

    def __init__(self) -> None:
        self._kept: dict[str, tuple[int, BaseStorage, StoreJournal]] = {}

    def open(self, spec: SweepSpec, store: Store, tenure: int | None,
             environ: Mapping[str, str] | None = None) -> tuple[BaseStorage, StoreJournal | None]:
        """The sweep's storage for a pass holding its lease in ``tenure`` (None: nothing is kept)."""
        kept = self._kept.get(spec.name)
        if kept is not None and tenure is not None and kept[0] == tenure:
            kept[2].catch_up()
            return kept[1], kept[2]
        self._kept.pop(spec.name, None)
        storage, journal = open_journaled(spec, store, exclusive=True, environ=environ)
        if journal is not None and tenure is not None:
            self._kept[spec.name] = (tenure, storage, journal)
        return storage, journal

    def forget(self, name: str) -> None:
        self._kept.pop(name, None)


def _database(storage: DatabaseStorage, environ: Mapping[str, str] | None) -> BaseStorage:
    from optuna.storages import RDBStorage
    from sqlalchemy.exc import SQLAlchemyError

    password = database_password(storage, environ)
    connect_args = {"password": password} if password is not None else {}
    try:
        return RDBStorage(storage.url, engine_kwargs={"connect_args": connect_args, "pool_pre_ping": True})
    except ImportError as err:
        raise UsageError(f"study database {storage.url}: its driver is not installed ({err.name}); "
                         "pip install 'tpuops[postgres]' for PostgreSQL") from None
    except SQLAlchemyError as err:
        # The driver's message names host, user and database, never the password (it is not in the URL).
        first = str(getattr(err, "orig", err) or err).strip().splitlines()[0]
        raise TransientError(f"study database {storage.url}: {first}") from None


def distributions(spec: SweepSpec) -> dict[str, BaseDistribution]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if spec.grid:
        return {name: CategoricalDistribution(list(values)) for name, values in sorted(spec.grid.items())}
    out: dict[str, BaseDistribution] = {}
    for name, param in sorted(spec.space.items()):
        if isinstance(param, FloatParam):
            out[name] = FloatDistribution(param.low, param.high, log=param.log, step=param.step)
        elif isinstance(param, CategoricalParam):
            out[name] = CategoricalDistribution(list(param.choices))
        else:
            out[name] = IntDistribution(param.low, param.high, log=param.log, step=param.step)
    return out


SEED_PER_TRIAL = Guard("sweeps.seed_per_trial", "each trial's sampler is seeded by its number: two trials never draw "
                                                "the same params, a trial asked again draws its own")


def trial_seed(seed: int, number: int) -> int:
    """The sampler seed for trial ``number``: a function of the spec's seed and the number only."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{number if SEED_PER_TRIAL.on else 0}".encode()).digest()[:4], "big")


def sampler_for(spec: SweepSpec, number: int,
                space: IntersectionSearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """Trial ``number``'s sampler; ``space``: the TPE search space the samplers of a pass share (``sweeps.tpe``)."""
    import optuna

    seed = trial_seed(spec.sampler.seed, number)
    if spec.sampler.type == "tpe":
        if space is not None:
            from tpuops.sweeps.tpe import SharedSpaceTPE

            return SharedSpaceTPE(space, seed=seed, n_startup_trials=spec.sampler.startup_trials)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.sampler.startup_trials)
    return optuna.samplers.RandomSampler(seed=seed)  # random; a grid's trials are enqueued, fixed


def pruner_for(spec: SweepSpec) -> optuna.pruners.BasePruner:
    import optuna

    pruner = spec.pruner
    if pruner.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruner.startup_trials, n_warmup_steps=pruner.warmup_steps)
    if pruner.type == "successive-halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=pruner.min_resource,
                                                      reduction_factor=pruner.reduction_factor)
    if pruner.type == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1 if pruner.min_resource == "auto" else pruner.min_resource,
                                              reduction_factor=pruner.reduction_factor)
    return optuna.pruners.NopPruner()


def create_study(spec: SweepSpec, storage: BaseStorage) -> optuna.Study:
    """Create the sweep's study (an existing one with that name is an error: sweep names are unique)."""
    import optuna
    from optuna.exceptions import DuplicatedStudyError

    try:
        return optuna.create_study(storage=storage, study_name=spec.name, direction=spec.objective.direction,
                                   sampler=sampler_for(spec, 0), pruner=pruner_for(spec))
    except DuplicatedStudyError:
        raise UsageError(f"a study named {spec.name!r} exists already in the sweep's storage: "
                         "choose another sweep name") from None


def load_study(spec: SweepSpec, storage: BaseStorage) -> optuna.Study:
    import optuna

    try:
        return optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler_for(spec, 0),
                                 pruner=pruner_for(spec))
    except KeyError:
        raise TpuopsError(f"sweep {spec.name}: its study is missing from its storage") from None


def ask(study: optuna.Study, spec: SweepSpec, space: IntersectionSearchSpace | None = None) -> optuna.trial.Trial:
    """Ask for the next trial (an enqueued grid point first), its sampler seeded by the number it will get."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    waiting = [t.number for t in trials if t.state is TrialState.WAITING]  # not .name: a property, 0.2 ms a trial
    number = min(waiting) if waiting else len(trials)
    study.sampler = sampler_for(spec, number, space)
    return study.ask(distributions(spec))


def trial_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Params as the run's hparams get them (numpy scalars made plain)."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in params.items()}
