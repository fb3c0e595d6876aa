"""Sweep specs (``sweeps/*.yaml``): validated strictly, like experiments, before anything is written.

A sweep names a base experiment (a path relative to the sweep file), a search space (or a grid),
the objective, sampler, pruner, how many trials and how many at once, and its limits. Unknown keys
are refused with a "did you mean" hint. The same spec and seed give the same trial sequence.

Invariants: ``trials >= parallel >= 1``; a grid sweep has no search space and at most as many trials
as grid points; a database URL never carries a password (it comes from the environment or a file
only readable by its owner, see ``studies.database_password``).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, ValidationError, model_validator

from tpuops.core.documents import StrictModel, read_yaml_mapping
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import SPEC_NAME, URL
from tpuops.core.notices import NotifyChoice
from tpuops.launch.experiment import SEED_MAX, one_line

SWEEP_NAME = SPEC_NAME
"""Trial runs are named ``<sweep>-tNNNN``: the sweep name leaves room for that in a 63-character node name."""


class FloatParam(StrictModel):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _range(self) -> FloatParam:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("a log scale needs low > 0 and no step")
        return self


class IntParam(StrictModel):
    type: Literal["int"]
    low: StrictInt
    high: StrictInt
    log: bool = False
    step: StrictInt = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and (self.low <= 0 or self.step != 1):
            raise ValueError("a log scale needs low > 0 and step 1")
        return self


class CategoricalParam(StrictModel):
    type: Literal["categorical"]
    choices: list[str | int | float | bool] = Field(min_length=1)


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


class Objective(StrictModel):
    metric: str = "accuracy"
    """An eval metric the run reports (``metrics.eval`` of its status, and its ``evals`` history)."""
    direction: Literal["maximize", "minimize"] = "maximize"
    step: StrictInt | None = Field(default=None, gt=0)
    """The value at this step (its evaluation); None: at the end of the run (the final evaluation)."""


class Sampler(StrictModel):
    type: Literal["tpe", "random", "grid"] = "tpe"
    seed: StrictInt = Field(default=0, ge=0, le=SEED_MAX)
    """Optuna's samplers seed NumPy with it: 0 .. 2**32 - 1."""
    startup_trials: StrictInt = Field(default=4, ge=0)
    """TPE only: trials sampled at random before the model-based ones."""


class Pruner(StrictModel):
    type: Literal["none", "median", "successive-halving", "hyperband"] = "none"
    startup_trials: StrictInt = Field(default=2, ge=0)
    """median: no pruning until this many trials completed."""
    warmup_steps: StrictInt = Field(default=0, ge=0)
    """median: no pruning of a trial before this step."""
    min_resource: StrictInt | Literal["auto"] = "auto"
    """successive-halving, hyperband: the first rung (in steps)."""
    reduction_factor: StrictInt = Field(default=3, ge=2)


class StoreStorage(StrictModel):
    kind: Literal["store"] = "store"


class DatabaseStorage(StrictModel):
    kind: Literal["database"]
    url: str = Field(pattern=URL)
    """An SQLAlchemy URL without password, e.g. ``postgresql+psycopg://optuna@db.internal:5432/optuna``."""
    password_env: str | None = "TPUOPS_SWEEP_DB_PASSWORD"
    password_file: str | None = None
    """A file holding the password, readable by its owner only (mode 0600)."""

    @model_validator(mode="after")
    def _no_password(self) -> DatabaseStorage:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            parsed = make_url(self.url)
        except ArgumentError:
            raise ValueError("not an SQLAlchemy URL such as postgresql+psycopg://user@host:5432/db") from None
        if parsed.password is not None:
            raise ValueError("the URL carries a password: remove it and give password_env or password_file")
        return self


Storage = Annotated[StoreStorage | DatabaseStorage, Field(discriminator="kind")]


class Endgame(StrictModel):
    """Move the leading trials from spot to on-demand at their next checkpoint near the end of the sweep."""

    leaders: StrictInt = Field(default=1, ge=1)
    at_budget_fraction: float = Field(default=0.8, gt=0, le=1)
    """Promote once this fraction of the budget is spent ..."""
    at_trials_fraction: float = Field(default=0.75, gt=0, le=1)
    """... or once this fraction of the trials has finished."""


class SweepSpec(StrictModel):
    name: str = Field(pattern=SWEEP_NAME)
    experiment: str
    """The base experiment, relative to the sweep file."""
    space: dict[str, Param] = Field(default_factory=dict)
    grid: dict[str, list[str | int | float | bool]] = Field(default_factory=dict)
    objective: Objective = Field(default_factory=Objective)
    sampler: Sampler = Field(default_factory=Sampler)
    pruner: Pruner = Field(default_factory=Pruner)
    trials: StrictInt = Field(gt=0, le=9999)
    parallel: StrictInt = Field(default=1, gt=0)
    eval_every_steps: StrictInt | None = Field(default=None, gt=0)
    """How often trials evaluate (the intermediate values the pruner sees); default: the experiment's."""
    capacity: Capacity | None = None
    accelerator: str | None = None
    budget_usd: float | None = Field(default=None, gt=0)
    storage: Storage = Field(default_factory=StoreStorage)
    max_preemptions: StrictInt = Field(default=20, ge=0)
    """Preemptions one trial may take (recovered from its checkpoint each time) before it is given up."""
    max_failures: StrictInt = Field(default=3, ge=1)
    """Failed trials (user errors, crashes past the restarts) after which the sweep launches no more."""
    endgame: Endgame | None = None
    notify: NotifyChoice | None = None
    """Which ``[notify]`` targets (by name) hear how the sweep ended, and of what (docs/notifications.md)."""

    @model_validator(mode="after")
    def _shape(self) -> SweepSpec:
        if bool(self.space) == bool(self.grid):
            raise ValueError("give exactly one of space (sampled) and grid (every combination)")
        if self.grid and self.sampler.type != "grid":
            raise ValueError("a grid needs sampler.type: grid")
        if self.space and self.sampler.type == "grid":
            raise ValueError("sampler.type grid needs a grid, not a space")
        if self.grid and self.trials > len(grid_points(self.grid)):
            raise ValueError(f"trials ({self.trials}) exceeds the {len(grid_points(self.grid))} grid points")
        if self.parallel > self.trials:
            raise ValueError(f"parallel ({self.parallel}) exceeds trials ({self.trials})")
        return self

    @property
    def params(self) -> list[str]:
        return sorted(self.grid or self.space)


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination, in a fixed order (keys sorted, values as written): what tpuops enqueues."""
    if not grid:
        return []
    keys = sorted(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def load_sweep(path: Path) -> SweepSpec:
    """Read and validate a sweep YAML; every problem is one ``UsageError`` line."""
    raw = read_yaml_mapping(path, "sweep spec", "name, experiment, space, trials")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        if tuple(first.get("loc", ()))[:1] == ("storage",) and first.get("type") != "extra_forbidden":
            # Never echo the value: a URL given with a password must not be printed back.
            message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
            raise UsageError(f"{path}: storage is not allowed: {message}") from None
        raise UsageError(one_line(err, str(path), SweepSpec)) from None
    if experiment_path(path, spec).is_dir():
        raise UsageError(f"{path}: experiment = {spec.experiment!r} is a folder ({experiment_path(path, spec)}); "
                         "name the experiment's YAML file in it, relative to the sweep file")
    if not experiment_path(path, spec).is_file():
        raise UsageError(f"{path}: experiment = {spec.experiment!r}: no such file "
                         f"({experiment_path(path, spec)}); it is relative to the sweep file")
    return spec


def experiment_path(sweep_path: Path, spec: SweepSpec) -> Path:
    return (sweep_path.resolve().parent / spec.experiment).resolve()
