"""Experiment specs: what ``load_experiment`` accepts, and the one line it prints for what it does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import REPO

from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.launch.experiment import Batch, Experiment, load_experiment

pytestmark = pytest.mark.unit

MINIMAL = {"name": "tiny", "model": "models:tiny", "dataset": {"train": "data/x"}, "batch": {"per_replica": 8},
           "steps": 10}


def _spec(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


@pytest.mark.parametrize("name", ["digits_cnn.yaml", "cifar10_cnn.yaml"])
def test_the_shipped_experiments_validate(name: str) -> None:
    experiment = load_experiment(REPO / "experiments" / name)
    assert experiment.steps > 0 and ":" in experiment.model


def test_defaults_fill_what_a_minimal_spec_leaves_out(tmp_path: Path) -> None:
    experiment = load_experiment(_spec(tmp_path, MINIMAL))
    assert (experiment.steps_per_call, experiment.checkpoint.every_steps, experiment.checkpoint.keep) == (50, 1000, 3)
    assert experiment.eval.metrics == ["accuracy", "loss"] and experiment.target is None
    assert (experiment.accelerator, experiment.capacity, experiment.expected_hours) == (None, None, 1.0)
    assert load_experiment(_spec(tmp_path, {**MINIMAL, "capacity": "preemptible"})).capacity is Capacity.PREEMPTIBLE


@pytest.mark.parametrize(("change", "line"), [
    ({"check_point": {"every_steps": 5}}, "unknown key 'check_point' (did you mean 'checkpoint'?)"),
    ({"checkpoint": {"evry_steps": 5}}, "unknown key 'checkpoint.evry_steps' (did you mean 'every_steps'?)"),
    ({"steps": 0}, "steps = 0 is not allowed: Input should be greater than 0"),
    ({"name": "Digits CNN"}, "name = 'Digits CNN' is not allowed"),
    ({"model": "models.digits"}, "model = 'models.digits' is not allowed"),
    ({"batch": {"per_replica": 8, "global": 64}}, "give exactly one of batch.per_replica and batch.global"),
    ({"eval": {"metrics": ["f1"]}}, "eval.metrics.0 = 'f1' is not allowed"),
    ({"capacity": "cheap"}, "capacity = 'cheap' is not allowed"),
])
def test_a_bad_spec_is_one_line_naming_the_key(tmp_path: Path, change: dict, line: str) -> None:
    with pytest.raises(UsageError) as raised:
        load_experiment(_spec(tmp_path, {**MINIMAL, **change}))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'spec.yaml'}: ")
    assert line in message


def test_a_missing_key_is_named(tmp_path: Path) -> None:
    without_steps = {k: v for k, v in MINIMAL.items() if k != "steps"}
    with pytest.raises(UsageError, match=r"spec.yaml: a model run needs batch and steps$"):
        load_experiment(_spec(tmp_path, without_steps))


@pytest.mark.parametrize(("text", "line"), [
    ("name: [unclosed", "not valid YAML"),
    ("- a list\n- not a mapping\n", "expected a mapping of keys"),
])
def test_what_is_not_a_spec_is_one_line(tmp_path: Path, text: str, line: str) -> None:
    with pytest.raises(UsageError, match=line):
        load_experiment(_spec(tmp_path, text))
    with pytest.raises(UsageError, match="no such experiment spec"):
        load_experiment(tmp_path / "absent.yaml")


def test_a_global_batch_splits_over_replicas_or_says_what_would() -> None:
    assert Batch.model_validate({"global": 1024}).per_replica_for(8) == 128
    assert Batch.model_validate({"per_replica": 64}).per_replica_for(8) == 64
    with pytest.raises(UsageError, match=r"batch.global = 100 does not divide over 8 replicas .*e\.g\. 1024"):
        Batch.model_validate({"global": 100}).per_replica_for(8)


def test_an_experiment_is_frozen() -> None:
    experiment = Experiment.model_validate(MINIMAL)
    with pytest.raises(ValueError, match="frozen"):
        experiment.steps = 5  # type: ignore[misc]


@pytest.mark.parametrize(("change", "line"), [
    ({"seed": -5}, "seed = -5 is not allowed: Input should be greater than or equal to 0"),
    ({"seed": 2**32}, "seed = 4294967296 is not allowed: Input should be less than or equal to 4294967295"),
    ({"steps": 10**12 + 1}, "steps = 1000000000001 is not allowed: Input should be less than or equal to "
                            "1000000000000"),
    ({"target": {"metric": "accuracy", "at_least": 0.9, "at_most": 0.1}},
     "at_least 0.9 is above at_most 0.1: no value can meet it"),
    ({"target": {"metric": "accuracy"}}, "a target needs at_least or at_most (or both)"),
])
def test_numbers_that_would_fail_on_the_node_or_never_be_met_are_refused(tmp_path: Path, change: dict,
                                                                          line: str) -> None:
    """A seed outside NumPy's 0 .. 2**32 - 1 failed on the node; steps near 2**63 tracebacked in a forecast; a
    target no value can meet was reported "NOT met" after paying for the run."""
    with pytest.raises(UsageError) as refused:
        load_experiment(_spec(tmp_path, {**MINIMAL, **change}))
    assert line in str(refused.value)


def test_the_edges_of_the_ranges_are_allowed(tmp_path: Path) -> None:
    edges = {"seed": 2**32 - 1, "steps": 10**12, "target": {"metric": "loss", "at_least": 0.5, "at_most": 0.5}}
    experiment = load_experiment(_spec(tmp_path, {**MINIMAL, **edges}))
    assert (experiment.seed, experiment.steps) == (2**32 - 1, 10**12)
    assert load_experiment(_spec(tmp_path, {**MINIMAL, "seed": 0})).seed == 0
