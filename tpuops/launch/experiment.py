"""Experiment specs (``experiments/*.yaml``): validated here, turned into the agent's run spec.

The YAML is what a person writes; the run spec (``tpuops/contract/runspec.py``) is what the
agent executes. Validation is strict and happens before anything is uploaded or created:
an unknown key is rejected with a "did you mean" hint, because a misspelt ``check_point``
that silently falls back to a default costs a preempted run its progress.

Three ways to say what runs (``mode``):

* ``model: module:function`` (the built-in loop; the entry point may return a compiled model,
  whose own train_step, loss, metrics and optimizer then apply), with the built-in TFRecord
  parser for the dataset's fixed-length features;
* the same plus ``input: module:function``: the user's input function reads the records
  (any schema, variable-length features padded by the function);
* ``command: [argv...]`` (or the ``script: "train.py --flag x"`` shorthand for
  ``["python", "train.py", "--flag", "x"]``): the user's own program in script mode, with
  ``hparams_as_flags`` to pass hparams as ``--name=value``; ``model``, ``batch`` and ``steps``
  are then not used (``steps``, when given, is shown as the run's total).

Which functions and files those names point at is checked before launch by ``usercode``.
"""

from __future__ import annotations

import difflib
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictInt, ValidationError, field_validator, model_validator

from tpuops.core.clock import UTC
from tpuops.core.documents import StrictModel, read_yaml_mapping
from tpuops.core.errors import UsageError, excerpt
from tpuops.core.kinds import Capacity
from tpuops.core.naming import FUNCTION, METRIC, SPEC_NAME, rule_in_words
from tpuops.core.notices import NotifyChoice

METRICS = ("accuracy", "loss", "top5_accuracy")

SEED_MAX = 2**32 - 1
"""The largest seed: the agent seeds NumPy with it, which takes 0 .. 2**32 - 1 (docs/cli.md, ranges)."""

MAX_STEPS = 10**12
"""The most steps a run may have: a year at over 30,000 steps a second, and far enough from 2**63 that no step
counter (the agent's int64 step plus a call's steps, a forecast's clock) can overflow (docs/cli.md, ranges)."""


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration_s(text: str) -> float:
    """``36h``, ``90m``, ``2d``, ``3600s`` in seconds (ValueError: not such a duration, or not > 0)."""
    number, unit = text[:-1], text[-1:]
    try:
        seconds = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError("expected a duration like 36h, 90m or 2d") from None
    if not 0 < seconds < float("inf"):
        raise ValueError("expected a duration > 0, like 36h")
    return seconds


class Elastic(StrictModel):
    """``elastic:``: how a run with several sizes (``accelerator: [v3-32, v3-8]``) moves between them
    (docs/experiments.md, "Elastic sizes"; the controller's rules: ``tpuops.controller.decide``)."""

    wait: str | None = None
    """How long the run waits for its largest size, stocked out in every zone, before it starts on a smaller
    one (``10m``); none: at once."""
    probe_every: str = "10m"
    """How often, while on a smaller size, the controller asks for the larger one in a zone (a probe create: free
    when it stocks out; a node it gets is deleted at once and the run moves up at its next checkpoint)."""

    @field_validator("wait", "probe_every")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            duration_s(value)
        return value

    @property
    def wait_s(self) -> float:
        return duration_s(self.wait) if self.wait is not None else 0.0

    @property
    def probe_every_s(self) -> float:
        return duration_s(self.probe_every)


class DatasetRef(StrictModel):
    """Where the records are: a dataset (a folder or store prefix with manifest.json), or globs."""

    train: str
    eval: str | None = None
    label: str = "label"
    shuffle_buffer: StrictInt = Field(default=10000, ge=0)
    cache: bool = False


class Batch(StrictModel):
    per_replica: StrictInt | None = Field(default=None, gt=0)
    global_: StrictInt | None = Field(default=None, gt=0, alias="global")

    @model_validator(mode="after")
    def _one_of(self) -> Batch:
        if (self.per_replica is None) == (self.global_ is None):
            raise ValueError("give exactly one of batch.per_replica and batch.global")
        return self

    def per_replica_for(self, replicas: int) -> int:
        if self.per_replica is not None:
            return self.per_replica
        assert self.global_ is not None
        if self.global_ % replicas:
            raise UsageError(f"batch.global = {self.global_} does not divide over {replicas} replicas "
                             f"(use a multiple of {replicas}, e.g. {replicas * 128})")
        return self.global_ // replicas


class Checkpoint(StrictModel):
    every_steps: StrictInt = Field(default=1000, ge=0)
    every_seconds: StrictInt = Field(default=600, ge=0)
    every: Literal["auto"] | None = None
    """``auto``: by time only, every Young/Daly interval for the save cost the agent measures and the
    ``lost_work_per_hour`` of ``tpuops.toml`` (``tpuops/contract/interval.py``); every_steps/every_seconds unused."""
    keep: StrictInt = Field(default=3, gt=0)


class Eval(StrictModel):
    metrics: list[Literal["accuracy", "loss", "top5_accuracy"]] = Field(default_factory=lambda: ["accuracy", "loss"])
    every_steps: StrictInt = Field(default=0, ge=0)
    steps: StrictInt | None = Field(default=None, gt=0)


class ProfileWindow(StrictModel):
    """One TensorFlow profile window the run captures by itself (``tpuops/agent/profiles.py``)."""

    at_step: StrictInt = Field(ge=0)
    steps: StrictInt = Field(default=10, gt=0)


class Target(StrictModel):
    """A result the experiment promises; ``tpuops train`` reports whether it was met.

    ``metric`` is an eval metric name: one of METRICS for the built-in loss, or any name the
    user's compiled model or script reports (e.g. ``mae``).
    """

    metric: str = Field(default="accuracy", pattern=METRIC)
    at_least: float | None = None
    at_most: float | None = None

    @model_validator(mode="after")
    def _bounds(self) -> Target:
        if self.at_least is None and self.at_most is None:
            raise ValueError("a target needs at_least or at_most (or both)")
        if self.at_least is not None and self.at_most is not None and self.at_least > self.at_most:
            raise ValueError(f"at_least {self.at_least:g} is above at_most {self.at_most:g}: no value can meet it")
        return self


class Experiment(StrictModel):
    """One experiment: model, data, hyperparameters, schedule, and where it would like to run."""

    name: str = Field(pattern=SPEC_NAME)
    model: str | None = Field(default=None, pattern=FUNCTION)
    input: str | None = Field(default=None, pattern=FUNCTION)
    command: list[str] | None = Field(default=None, min_length=1)
    script: str | None = Field(default=None, min_length=1)
    hparams_as_flags: bool = False
    dataset: DatasetRef
    hparams: dict[str, Any] = Field(default_factory=dict)
    batch: Batch | None = None
    steps: StrictInt | None = Field(default=None, gt=0, le=MAX_STEPS)
    steps_per_call: StrictInt = Field(default=50, gt=0)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    eval: Eval = Field(default_factory=Eval)
    profile: ProfileWindow | None = None
    """A profile window of ``steps`` from ``at_step`` (a model run's; ``tpuops profile`` asks for one later)."""
    mixed_precision: bool = False
    deterministic: Literal[True, False, "auto"] = "auto"
    """TF op determinism: true keeps a resumed run bit-identical to an uninterrupted one (at a cost in
    speed: docs/benchmarks.md, "Your own code"), false trades that for speed, auto is on without a TPU
    and off on one."""
    seed: StrictInt = Field(default=0, ge=0, le=SEED_MAX)
    accelerator: str | list[str] | None = None
    """One accelerator type, or the sizes the run may use, largest first (``[v3-32, v3-8]``: an elastic run)."""
    elastic: Elastic | None = None
    """How an elastic run waits for and moves between its sizes (defaults: ``Elastic()``)."""
    capacity: Capacity | None = None
    target: Target | None = None
    expected_hours: float = Field(default=1.0, gt=0)
    """How long one run is expected to take at on-demand speed: what a budget and a deadline are checked against."""
    deadline: datetime | None = None
    """When the run must be done (ISO time; UTC when it names no zone): spot while it fits, on-demand when not."""
    finish_within: str | None = None
    """The same, from the launch: ``36h``, ``90m``, ``2d``."""
    notify: NotifyChoice | None = None
    """Which ``[notify]`` targets (by name) hear about this run, and of what (docs/notifications.md)."""

    @field_validator("finish_within")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            duration_s(value)
        return value

    @field_validator("accelerator")
    @classmethod
    def _sizes(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list):
            if not value:
                raise ValueError("expected one accelerator type, or a list of sizes largest first ([v3-32, v3-8])")
            if len(set(value)) != len(value):
                raise ValueError(f"{value} names a size twice (expected each size once, largest first)")
        return value

    @property
    def sizes(self) -> list[str] | None:
        """The accelerator types the run may use, largest first; None when the experiment names none."""
        if self.accelerator is None:
            return None
        return [self.accelerator] if isinstance(self.accelerator, str) else list(self.accelerator)

    def deadline_at(self, now: float) -> float | None:
        """The deadline in epoch seconds for a run launched at ``now``; None without one."""
        if self.finish_within is not None:
            return now + duration_s(self.finish_within)
        if self.deadline is None:
            return None
        when = self.deadline if self.deadline.tzinfo else self.deadline.replace(tzinfo=UTC)
        return when.timestamp()

    @model_validator(mode="after")
    def _one_mode(self) -> Experiment:
        if self.deadline is not None and self.finish_within is not None:
            raise ValueError("give deadline or finish_within, not both")
        if self.elastic is not None and len(self.sizes or []) < 2:
            raise ValueError("elastic: needs accelerator to list two sizes or more, largest first ([v3-32, v3-8])")
        if self.command is not None and self.script is not None:
            raise ValueError("give command or script, not both")
        if self.program is not None:
            if self.model is not None or self.input is not None:
                raise ValueError("a script runs on its own: drop model and input, or drop command/script")
            if self.profile is not None:
                raise ValueError("profile: is for a model run (the agent's loop); a script profiles itself")
            return self
        if self.model is None:
            raise ValueError("give model (module:function), or command/script to run your own program")
        if self.batch is None or self.steps is None:
            raise ValueError("a model run needs batch and steps")
        return self

    @property
    def program(self) -> list[str] | None:
        """Script mode's argv (``script`` expanded), or None when a model entry point runs."""
        if self.script is not None:
            return ["python", *shlex.split(self.script)]
        return list(self.command) if self.command is not None else None

    def what_runs(self) -> str:
        """One line for ``--dry-run``: the program, or the model and how it is fed."""
        program = self.program
        if program is not None:
            flags = f" plus --name=value for each of {sorted(self.hparams)}" if self.hparams_as_flags else ""
            return f"script: {shlex.join(program)}{flags} (in experiments/, with the TPUOPS_* environment)"
        feed = f"input function {self.input}" if self.input else "the built-in TFRecord parser"
        return (f"model {self.model}: its own train_step, loss and metrics if it comes back compiled, "
                f"else the spec's loss and metrics; fed by {feed}; {self.steps} steps")

    @property
    def mode(self) -> str:
        """``script``, ``model+input_fn`` or ``model``: what the agent runs."""
        if self.program is not None:
            return "script"
        return "model+input_fn" if self.input else "model"


def _hint(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (allowed: {', '.join(allowed)})" if allowed else ""


def _allowed_at(loc: tuple[Any, ...], root: type[BaseModel]) -> list[str]:
    model = root
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None) if field else None
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            return []
    return [f.alias or name for name, f in model.model_fields.items()]


def one_line(err: ValidationError, where: str, root: type[BaseModel]) -> str:
    """The first problem of a spec validated against ``root``, as one line ("did you mean" for unknown keys).

    An unknown key goes first: a misspelt ``trails`` is also why ``trials`` is missing.
    """
    errors = err.errors()
    first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = tuple(first.get("loc", ()))
    key = ".".join(str(part) if str(part).isprintable() else excerpt(part) for part in loc) or "spec"
    if first.get("type") == "extra_forbidden":
        return f"{where}: unknown key {excerpt(key)}{_hint(str(loc[-1]), _allowed_at(loc, root))}"
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if first.get("type") == "string_pattern_mismatch":
        message = rule_in_words(str(first.get("ctx", {}).get("pattern", "")))
    if not loc:  # a rule over several keys: the whole spec is no value to echo
        return f"{where}: {message}"
    if first.get("type") == "missing":
        return f"{where}: {key} is required"
    if not loc:  # a rule across keys (which mode runs): the message says it all
        return f"{where}: {message}"
    return f"{where}: {key} = {excerpt(first.get('input'))} is not allowed: {message}"


def load_experiment(path: Path) -> Experiment:
    """Read and validate an experiment YAML; every problem is one ``UsageError`` line."""
    raw = read_yaml_mapping(path, "experiment spec", "model, dataset, batch, steps")
    try:
        experiment = Experiment.model_validate(raw)
    except ValidationError as err:
        raise UsageError(one_line(err, str(path), Experiment)) from None
    _check_deadline(experiment, path, datetime.now(UTC).timestamp())
    return experiment


def _check_deadline(experiment: Experiment, path: Path, now: float) -> None:
    """A run launched ``now`` must be able to meet its deadline on on-demand (``expected_hours``); one line if not."""
    due = experiment.deadline_at(now)
    if due is None:
        return
    when = datetime.fromtimestamp(due, UTC).isoformat(timespec="minutes")
    if due <= now:
        raise UsageError(f"{path}: deadline {when} has passed: give a later one, or finish_within: 36h")
    if due - now < experiment.expected_hours * 3600:
        raise UsageError(f"{path}: deadline {when} is {(due - now) / 3600:.1f} h away, shorter than the run at "
                         f"on-demand speed (expected_hours: {experiment.expected_hours:g}): give a later deadline")
