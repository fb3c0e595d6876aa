"""The example experiments' entry points build the documented models."""

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import models

pytestmark = pytest.mark.tf

layers = tf.keras.layers


@pytest.mark.parametrize(("build", "shape"), [(models.cifar10_cnn, (32, 32, 3)), (models.digits_cnn, (8, 8, 1))])
def test_entry_points_output_class_probabilities(build, shape) -> None:  # type: ignore[no-untyped-def]
    model = build({})
    outputs = model(np.random.default_rng(0).uniform(0, 16, size=(2, *shape)).astype(np.float32)).numpy()
    assert outputs.shape == (2, 10) and outputs.dtype == np.float32
    np.testing.assert_allclose(outputs.sum(axis=1), 1.0, rtol=1e-5)


def test_cifar10_cnn_is_the_tutorial_architecture() -> None:
    kinds = [type(layer) for layer in models.cifar10_cnn({}).layers]
    assert kinds == [
        layers.Rescaling,
        layers.Conv2D,
        layers.MaxPooling2D,
        layers.Conv2D,
        layers.GlobalAveragePooling2D,
        layers.Dense,
    ]


def test_mixed_bfloat16_keeps_the_output_in_float32() -> None:
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = models.cifar10_cnn({})
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert model.layers[1].compute_dtype == "bfloat16"
    assert model.layers[-1].compute_dtype == "float32"
