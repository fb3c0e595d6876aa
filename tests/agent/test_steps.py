"""The training call is traced once: ``prepare`` creates the variables its first trace would create."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import tensorflow as tf
from tpuops.agent.steps import CompiledSteps, MultiStep, Steps, make_optimizer
from tpuops.contract.runspec import TrainSpec

from agentrun import REPO

pytestmark = pytest.mark.tf

BATCH = 8


def _batches() -> tf.data.Dataset:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4 * BATCH, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=4 * BATCH).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).repeat()


def _model(compiled: bool) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(11)
    model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="relu", input_shape=(5,)),
                                 tf.keras.layers.Dense(3, activation="softmax")])
    if compiled:
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _steps(compiled: bool) -> MultiStep:
    strategy = tf.distribute.get_strategy()
    model = _model(compiled)
    if compiled:
        return CompiledSteps(strategy, model)
    spec = TrainSpec(per_replica_batch_size=BATCH, steps=100, steps_per_call=2)
    return Steps(strategy, model, make_optimizer({"optimizer": "adam"}), spec, BATCH)


def _train(steps: MultiStep, prepare: bool) -> List[np.ndarray]:
    data = _batches()
    if prepare:
        steps.prepare(data.element_spec)
    iterator = iter(data)
    for size in (2, 3):
        steps.train_call(iterator, tf.constant(size, tf.int64))
    model: Any = steps._model
    return [value.numpy() for value in model.weights] + [steps.train_metrics.results()]


@pytest.mark.parametrize("compiled", [True, False])
def test_prepared_call_is_traced_once_and_trains_the_same(compiled: bool) -> None:
    prepared, unprepared = _steps(compiled), _steps(compiled)
    after = _train(prepared, prepare=True)
    before = _train(unprepared, prepare=False)
    assert prepared.train_call.experimental_get_tracing_count() == 1
    assert unprepared.train_call.experimental_get_tracing_count() == 2  # what prepare saves
    for mine, theirs in zip(after[:-1], before[:-1]):
        np.testing.assert_array_equal(mine, theirs)
    assert after[-1] == before[-1]
    if compiled:
        assert sorted(after[-1]) == ["accuracy", "loss"]


def test_accumulated_micro_batches_make_the_update_of_the_whole_batch() -> None:
    """4 micro-batches of 2 rows summed in the step's loop = one batch of 8, up to the order of float sums.

    Plain SGD, whose update scales with the gradient (Adam's would hide a gradient off by a constant
    factor). Tolerance: each gradient sums 8 per-example terms re-associated (at most ~8 x 6e-8
    relative), over 5 steps: rtol 1e-5 with a 1e-7 floor for weights near 0; one update on another
    batch, or a gradient off by a factor, moves the weights by ~1e-2 (the learning rate), far beyond it.
    """
    spec = TrainSpec(per_replica_batch_size=2, steps=100, steps_per_call=5, global_batch=BATCH)
    trained = []
    for accumulation in (1, 4):
        model = _model(compiled=False)
        optimizer = make_optimizer({"optimizer": "sgd", "learning_rate": 0.1})
        steps = Steps(tf.distribute.get_strategy(), model, optimizer, spec, BATCH, accumulation)
        data = _batches()
        steps.prepare(data.element_spec)
        steps.train_call(iter(data), tf.constant(5, tf.int64))
        assert steps.train_call.experimental_get_tracing_count() == 1
        trained.append(([value.numpy() for value in model.weights], steps.train_metrics.results()))
    (whole, whole_metrics), (micro, micro_metrics) = trained
    for mine, theirs in zip(micro, whole):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-7)
    assert micro_metrics == pytest.approx(whole_metrics, rel=1e-5)


def _central_storage(replicas: int, accumulation: int, *options: str) -> Dict[str, Any]:
    script = Path(__file__).with_name("central_storage.py")
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, str(script), str(replicas), str(accumulation), *options], check=False,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_accumulation_under_central_storage_trains_what_the_whole_batch_trains() -> None:
    """The emulator's multi-host slices run CentralStorageStrategy, whose metric updates are a
    synchronization point TensorFlow refuses inside the accumulation loop: the metrics are updated
    after it. Two replicas x four micro-batches of 2 train what two replicas x one batch of 8 train
    (tolerance: see the test above), with the same metrics, the call traced once."""
    whole, micro = _central_storage(2, 1), _central_storage(2, 4)
    assert micro["traced"] == whole["traced"] == 1
    for mine, theirs in zip(micro["weights"], whole["weights"]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-7)
    assert micro["metrics"] == pytest.approx(whole["metrics"], rel=1e-5)


def test_batch_normalization_moves_its_statistics_once_per_accumulated_step() -> None:
    """A BatchNormalization under accumulation normalizes each micro-batch by its own statistics, as a larger
    slice's replicas do, and moves its moving mean and variance once per step by the micro-batches' mean: one
    replica accumulating 4 micro-batches (MirroredStrategy) and 2 replicas accumulating 2 each (CentralStorage,
    where a move inside the loop is a merge TensorFlow refuses) train what 4 replicas train at once, moving
    statistics included (read as their mean over replicas, what a checkpoint holds). Moved once per
    micro-batch, the statistics decay by momentum**4 a step and are off by ~0.1 after five steps; tolerance:
    the test above."""
    whole = _central_storage(4, 1, "mirrored", "batchnorm")
    assert len(whole["weights"]) == 8  # two dense layers, gamma, beta, moving mean and moving variance
    for accumulated in (_central_storage(1, 4, "mirrored", "batchnorm"), _central_storage(2, 2, "batchnorm")):
        assert accumulated["traced"] == 1
        for mine, theirs in zip(accumulated["weights"], whole["weights"]):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-7)
        assert accumulated["metrics"] == pytest.approx(whole["metrics"], rel=1e-5)
