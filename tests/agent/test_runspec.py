"""The run spec parser: strict about keys and types, with paths in its messages."""

import copy
import json
from typing import Any, Dict

import pytest
from tpuops.contract.runspec import RunSpec, SpecError, parse_spec

pytestmark = pytest.mark.tf

FULL: Dict[str, Any] = {
    "version": 1,
    "run_id": "digits-0001",
    "store_root": "gs://bucket/prefix/",
    "entry_point": "models:digits_cnn",
    "experiments_dir": "experiments",
    "hparams": {"optimizer": "momentum", "learning_rate": 0.1, "filters": 8},
    "seed": 11,
    "mixed_precision": True,
    "deterministic": None,
    "allow_cpu_fallback": False,
    "heartbeat_seconds": 5,
    "dataset": {
        "features": {"image": {"dtype": "float32", "shape": [8, 8, 1]}, "label": {"dtype": "int64"}},
        "label": "label",
        "train": ["gs://bucket/data/digits/train-*.tfrecord"],
        "eval": ["gs://bucket/data/digits/test-*.tfrecord"],
        "shuffle_buffer": 2048,
        "cache": True,
    },
    "train": {
        "per_replica_batch_size": 128,
        "steps": 5000,
        "steps_per_call": 50,
        "checkpoint_every_steps": 1000,
        "checkpoint_every_seconds": 300.5,
        "keep_checkpoints": 2,
        "eval_every_steps": 1000,
        "eval_steps": 10,
        "metrics": ["accuracy", "top5_accuracy"],
        "loss": "sparse_categorical_crossentropy_from_logits",
    },
    "infer": {
        "input": ["gs://bucket/data/digits/test-*.tfrecord"],
        "model": "gs://bucket/prefix/runs/digits-0001/model",
        "output_prefix": "gs://bucket/prefix/runs/digits-0001/predictions",
        "num_shards": 4,
        "batch_size": 512,
    },
}


def _with(path: str, value: Any) -> Dict[str, Any]:
    """FULL with the dotted ``path`` set to ``value`` (or removed when value is ...)."""
    spec = copy.deepcopy(FULL)
    *parents, last = path.split(".")
    node = spec
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return spec


def test_full_spec_parses_into_typed_sections() -> None:
    spec = parse_spec(json.dumps(FULL))
    assert spec.store_root == "gs://bucket/prefix"
    assert spec.dataset.features["image"].shape == (8, 8, 1) and spec.dataset.features["label"].shape == ()
    assert spec.dataset.inputs == ["image"]
    train = spec.require_train()
    assert train.checkpoint_every_seconds == 300.5 and train.metrics == ("accuracy", "top5_accuracy")
    assert spec.require_infer().num_shards == 4


def test_minimal_train_spec_gets_the_documented_defaults() -> None:
    spec = RunSpec.from_json(
        {
            "run_id": "r1",
            "store_root": "/tmp/store",
            "entry_point": "m:f",
            "dataset": {"features": {"x": {"dtype": "float32"}, "y": {"dtype": "int64"}}, "label": "y", "train": ["a"]},
            "train": {"per_replica_batch_size": 8, "steps": 10},
        }
    )
    train = spec.require_train()
    assert (train.steps_per_call, train.checkpoint_every_steps, train.keep_checkpoints) == (50, 1000, 3)
    assert train.metrics == ("accuracy", "loss") and train.loss == "sparse_categorical_crossentropy"
    assert spec.allow_cpu_fallback is False and spec.deterministic is None and spec.heartbeat_seconds == 10.0
    assert spec.dataset.shuffle_buffer == 10000 and spec.dataset.cache is False and spec.infer is None
    assert train.global_batch is None  # the slice's: per_replica_batch_size x replicas, no accumulation
    assert RunSpec.from_json(_with("train.global_batch", 512)).require_train().global_batch == 512


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("trian", {}, "spec: unknown key(s) ['trian']"),
        ("train.stpes", 3, "train: unknown key(s) ['stpes']"),
        ("dataset.features.image.shap", [1], "dataset.features.image: unknown key(s) ['shap']"),
        ("train.steps", "100", "train.steps: expected int, got str"),
        ("train.steps", True, "train.steps: expected int, got a boolean"),
        ("train.steps", 0, "train.steps: must be > 0"),
        ("train.global_batch", 0, "train.global_batch: must be > 0"),
        ("train.global_batch", 64.0, "train.global_batch: expected int, got float"),
        ("train.steps", ..., "train: missing required key 'steps'"),
        ("train.metrics", ["accuracy", "f1"], "'f1' is not one of"),
        ("dataset.label", "target", "dataset.label: 'target' is not one of the features"),
        ("dataset.features.image.dtype", "float64", "'float64' is not one of"),
        ("dataset.features.image.shape", [8, -1], "expected a list of positive integers"),
        ("dataset.features.image.dtype", "uint8", 'dataset.features.image.dtype: uint8 needs "encoding": "raw"'),
        ("dataset.features.image.encoding", "png", "dataset.features.image.encoding: 'png' is not one of ['raw']"),
        ("dataset.features.label", {"dtype": "string", "encoding": "raw"}, "raw needs a numeric dtype, not string"),
        ("entry_point", "models.digits_cnn", "is not 'module:function'"),
        ("run_id", "../escape", "spec.run_id"),
        ("version", 2, "this agent reads version 1"),
        ("hparams.optimizer", "adamw", "'adamw' is not one of"),
        ("hparams.learning_rate", "fast", "spec.hparams.learning_rate: expected int or float, got str"),
        ("infer.input", [], "infer.input: needs at least one file pattern"),
        ("input_fn", "inputs.tokens", "spec.input_fn: 'inputs.tokens' is not 'module:function'"),
        ("script", {"command": []}, "script.command: needs at least the program to run"),
        ("script", {"command": ["python", "t.py"], "every": 1}, "script: unknown key(s) ['every']"),
        ("dataset.features.image", {"dtype": "uint8", "shape": [-1], "encoding": "raw"}, "a raw feature has a fixed"),
    ],
)
def test_invalid_specs_name_the_offending_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        RunSpec.from_json(_with(path, value))
    assert message in str(caught.value)


def test_commands_require_their_sections() -> None:
    spec = RunSpec.from_json(_with("train", ...))
    with pytest.raises(SpecError, match="needs a 'train' section"):
        spec.require_train()
    spec = RunSpec.from_json(_with("dataset.label", ...))
    with pytest.raises(SpecError, match="needs a label feature"):
        spec.require_train()


def test_not_json_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="not valid JSON"):
        parse_spec("{'run_id': 1")


def test_script_and_input_fn_sections() -> None:
    spec = RunSpec.from_json(
        dict(_with("train", ...), script={"command": ["python", "train.py"], "hparams_as_flags": True})
    )
    assert spec.script is not None and spec.script.command == ["python", "train.py"]
    assert (spec.script.checkpoint_every_steps, spec.script.keep_checkpoints, spec.script.total_steps) == (
        1000,
        3,
        None,
    )
    tokens = {"tokens": {"dtype": "int64", "shape": [-1]}, "label": {"dtype": "int64"}}
    varlen = RunSpec.from_json(_with("dataset.features", tokens))
    assert varlen.dataset.features["tokens"].variable_length
    with pytest.raises(SpecError, match=r"\['tokens'\] are variable-length: .* name an input_fn"):
        varlen.require_train()
    with_input_fn = RunSpec.from_json(dict(_with("dataset.features", tokens), input_fn="inputs:tokens"))
    assert with_input_fn.require_train().steps == 5000
