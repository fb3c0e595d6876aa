"""User model code for the agent tests: the experiments dir the test specs point at.

``slow_mlp`` pauses a few milliseconds per training step, outside the numerics
(``x + 0 * token``), so that a test can signal the agent while it trains.
"""

import time

import tensorflow as tf


def _pause() -> tf.Tensor:
    time.sleep(0.03)
    return tf.constant(0.0)


class Pause(tf.keras.layers.Layer):
    def call(self, inputs: tf.Tensor, training: object = None) -> tf.Tensor:
        if not training:
            return inputs
        token = tf.py_function(_pause, [], tf.float32)
        token.set_shape([])
        return inputs + 0.0 * token


def slow_mlp(hparams: dict) -> tf.keras.Model:
    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(hparams["features"],)),
            Pause(),
            tf.keras.layers.Dense(hparams.get("hidden", 16), activation="relu"),
            tf.keras.layers.Dense(hparams["classes"], activation="softmax"),
        ]
    )


def explodes(hparams: dict) -> tf.keras.Model:
    raise RuntimeError("boom from the user's model code")
