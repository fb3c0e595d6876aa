"""Model entry points for the example experiments (run by the agent under TF 2.9, Python 3.8).

Every entry point has the signature the run spec names as ``entry_point: "models:<function>"``:
``build(hparams: dict) -> tf.keras.Model``. The models output class probabilities in float32
(the last layer's dtype is pinned, so they also work under the mixed_bfloat16 policy) and pair
with the agent's default loss, sparse categorical cross-entropy on integer labels.

Inputs are raw pixel values as float32; each model rescales them itself (hparam
``input_scale``), so the TFRecords can hold the data exactly as published.
"""

from typing import Any, Dict

import tensorflow as tf

layers = tf.keras.layers


def cifar10_cnn(hparams: Dict[str, Any]) -> tf.keras.Model:
    """The CNN of the Cloud TPU Keras tutorial, for CIFAR-10 (32x32x3 pixels 0..255, 10 classes).

    Conv2D 32 relu -> MaxPool -> Conv2D 64 relu -> GlobalAveragePooling -> Dense 10 softmax.
    """
    return tf.keras.Sequential(
        [
            layers.InputLayer(input_shape=(32, 32, 3)),
            layers.Rescaling(float(hparams.get("input_scale", 1 / 255))),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(10, activation="softmax", dtype="float32"),
        ],
        name="cifar10_cnn",
    )


def digits_cnn(hparams: Dict[str, Any]) -> tf.keras.Model:
    """A small CNN for scikit-learn's 8x8 digits (8x8x1 pixels 0..16, 10 classes).

    Reaches about 97-98 % test accuracy after 600 Adam steps of batch 64 (lr 3e-3), about
    half a minute on one CPU core. hparams: ``filters`` (= 16), ``dense`` (= 64).
    """
    filters = int(hparams.get("filters", 16))
    return tf.keras.Sequential(
        [
            layers.InputLayer(input_shape=(8, 8, 1)),
            layers.Rescaling(float(hparams.get("input_scale", 1 / 16))),
            layers.Conv2D(filters, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(2 * filters, 3, padding="same", activation="relu"),
            layers.Flatten(),
            layers.Dense(int(hparams.get("dense", 64)), activation="relu"),
            layers.Dense(10, activation="softmax", dtype="float32"),
        ],
        name="digits_cnn",
    )
