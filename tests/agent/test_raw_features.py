"""Raw-bytes features (``"encoding": "raw"``), as ``tpuops data convert --format images`` writes them.

Each record holds one C-order uint8 image in a bytes_list; the model must get float32 pixels
0..255 in the same layout, in training and in inference, and a record of the wrong byte length
must end the run as a user error that names the feature.
"""

import json
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import tensorflow as tf
from tpuops.agent.inputs import Parser, padded_batches
from tpuops.contract.exits import UserError
from tpuops.contract.runspec import DatasetSpec

from agentrun import EXPERIMENTS, run_agent

pytestmark = pytest.mark.tf

SHAPE = (32, 32, 3)
CLASSES = 2
TRAIN_EXAMPLES = 96
EVAL_EXAMPLES = 40  # not a multiple of the batch: the padded last batch must decode too
STEPS = 12
USER_ERROR_EXIT = 3
WRONG_LENGTH = "feature image (uint8[32, 32, 3] raw): every record must hold 3072 bytes"


def _example(image: bytes, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path: Path, images: List[bytes], labels: np.ndarray) -> str:
    with tf.io.TFRecordWriter(str(path)) as out:
        for image, label in zip(images, labels):
            out.write(_example(image, int(label)))
    return str(path)


def _images(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """Dark images for class 0, bright ones for class 1: a task a few steps can learn."""
    low = np.where(labels == 0, 0, 156)[:, None, None, None]
    return (low + rng.integers(0, 100, size=(len(labels), *SHAPE))).astype(np.uint8)


def _features(dtype: str = "uint8") -> Dict[str, Any]:
    """The dataset features exactly as the control plane passes a converted image dataset on."""
    return {"image": {"dtype": dtype, "shape": list(SHAPE), "encoding": "raw"}, "label": {"dtype": "int64"}}


@pytest.fixture(scope="module")
def raw_data(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    directory = tmp_path_factory.mktemp("raw")
    rng = np.random.default_rng(11)
    train_labels = rng.integers(0, CLASSES, size=TRAIN_EXAMPLES)
    eval_labels = rng.integers(0, CLASSES, size=EVAL_EXAMPLES)
    train_images, eval_images = _images(rng, train_labels), _images(rng, eval_labels)
    eval_bytes = [image.tobytes() for image in eval_images]
    grayscale = eval_bytes[1][: 32 * 32]  # a record of a third of the length
    return {
        "train": _write(directory / "train-00000.tfrecord", [i.tobytes() for i in train_images], train_labels),
        "eval": _write(directory / "eval-00000.tfrecord", eval_bytes, eval_labels),
        "short_first": _write(directory / "short-first.tfrecord", [grayscale, *eval_bytes[1:]], eval_labels),
        # passes the first-record check: only the stream itself can catch it
        "short_later": _write(
            directory / "short-later.tfrecord", [eval_bytes[0], grayscale, *eval_bytes[2:]], eval_labels
        ),
        "eval_images": eval_images,
        "eval_labels": eval_labels,
    }


def _batches(files: List[str], features: Dict[str, Any]) -> List[Any]:
    spec = DatasetSpec.from_json({"features": features, "label": "label"}, "dataset")
    return list(padded_batches(files, spec, global_batch=16, with_label=True).as_numpy_iterator())


def test_raw_uint8_images_reach_the_model_as_float_pixels_in_c_order(raw_data: Dict[str, Any]) -> None:
    spec = DatasetSpec.from_json({"features": _features(), "label": "label"}, "dataset")
    assert Parser(spec, with_label=False).input_signature(16) == tf.TensorSpec((16, *SHAPE), tf.float32)
    batches = _batches([raw_data["eval"]], _features())
    images = np.concatenate([image[mask == 1] for image, _, mask in batches])
    labels = np.concatenate([label[mask == 1] for _, label, mask in batches])
    assert images.dtype == np.float32 and images.shape == (EVAL_EXAMPLES, *SHAPE)
    np.testing.assert_array_equal(images, raw_data["eval_images"].astype(np.float32))
    np.testing.assert_array_equal(labels, raw_data["eval_labels"])


def test_the_byte_length_follows_the_declared_dtype(raw_data: Dict[str, Any]) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"every record must hold 12288 bytes"):
        _batches([raw_data["eval"]], _features("float32"))


def test_a_short_first_record_fails_the_check_with_the_feature(raw_data: Dict[str, Any]) -> None:
    spec = DatasetSpec.from_json({"features": _features(), "label": "label"}, "dataset")
    with pytest.raises(UserError) as caught:
        Parser(spec, with_label=True).check([raw_data["short_first"]], "dataset.train")
    assert "do not match dataset.features {'image': 'uint8[32, 32, 3] raw', 'label': 'int64[]'}" in str(caught.value)
    assert WRONG_LENGTH in str(caught.value)
    Parser(spec, with_label=True).check([raw_data["short_later"]], "dataset.train")


def _spec(make_spec: Callable[..., Path], run_id: str, train: str, eval: str, **overrides: Any) -> Path:
    return make_spec(
        run_id,
        entry_point="models:cifar10_cnn",
        experiments_dir=str(EXPERIMENTS),
        hparams={"optimizer": "adam", "learning_rate": 0.01},
        dataset={"features": _features(), "label": "label", "train": [train], "eval": [eval]},
        train={"per_replica_batch_size": 16, "steps": STEPS, "steps_per_call": 4, "checkpoint_every_steps": 0},
        **overrides,
    )


def test_train_and_infer_on_raw_images(make_spec: Callable[..., Path], raw_data: Dict[str, Any]) -> None:
    trained = run_agent(_spec(make_spec, "raw-train", raw_data["train"], raw_data["eval"]))
    assert trained.process.returncode == 0, trained.output
    status = trained.status()
    assert status["exit_class"] == "succeeded" and status["step"] == STEPS
    assert status["metrics"]["eval"]["accuracy"] >= 0.9

    prefix = trained.run_dir.parent / "raw-infer" / "out"
    infer = {"input": [raw_data["eval"]], "model": str(trained.run_dir / "model"), "output_prefix": str(prefix)}
    predicted = run_agent(
        _spec(make_spec, "raw-infer", raw_data["train"], raw_data["eval"], infer=infer), command="infer"
    )
    assert predicted.process.returncode == 0, predicted.output
    manifest = json.loads((prefix / "manifest.json").read_text())
    assert manifest["total"] == EVAL_EXAMPLES
    rows = [json.loads(line) for line in (prefix / manifest["shards"][0]["path"]).read_text().splitlines()]
    outputs = np.array([row["output"] for row in sorted(rows, key=lambda row: row["index"])], dtype=np.float32)
    model = tf.keras.models.load_model(str(trained.run_dir / "model"), compile=False)
    expected = model.predict(raw_data["eval_images"].astype(np.float32), verbose=0)
    np.testing.assert_allclose(outputs, expected, rtol=1e-4, atol=1e-5)


def test_a_short_record_in_the_stream_is_a_user_error(make_spec: Callable[..., Path], raw_data: Dict[str, Any]) -> None:
    run = run_agent(_spec(make_spec, "raw-short", raw_data["short_later"], raw_data["eval"]))
    assert run.process.returncode == USER_ERROR_EXIT, run.output
    status = run.status()
    assert status["exit_class"] == "user-error" and status["step"] < STEPS
    assert status["message"].startswith("InvalidArgumentError")
    assert WRONG_LENGTH in status["traceback"] and WRONG_LENGTH in run.logs()
