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


class ClippedSequential(tf.keras.Sequential):
    """A user model with its own train_step: gradients clipped, their norm tracked as a metric."""

    def __init__(self, layers: list) -> None:
        super().__init__(layers)
        self.grad_norm = tf.keras.metrics.Mean("grad_norm")

    def train_step(self, data: tuple) -> dict:
        x, y = data
        with tf.GradientTape() as tape:
            predictions = self(x, training=True)
            loss = self.compiled_loss(y, predictions, regularization_losses=self.losses)
        gradients = tape.gradient(loss, self.trainable_variables)
        clipped, norm = tf.clip_by_global_norm(gradients, 1.0)
        self.optimizer.apply_gradients(zip(clipped, self.trainable_variables))
        self.compiled_metrics.update_state(y, predictions)
        self.grad_norm.update_state(norm)
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self) -> list:
        return [*super().metrics, self.grad_norm]


def smoothed_crossentropy(labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
    """A custom loss: cross-entropy against labels smoothed by 0.1."""
    onehot = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), tf.shape(probabilities)[-1])
    return tf.keras.losses.categorical_crossentropy(onehot * 0.9 + 0.1 / 4.0, probabilities)


def compiled_mlp(hparams: dict) -> tf.keras.Model:
    """slow_mlp with its own train_step, compiled with a custom loss and metrics (inside the agent's scope)."""
    model = ClippedSequential(
        [
            tf.keras.layers.InputLayer(input_shape=(hparams["features"],)),
            Pause(),
            tf.keras.layers.Dense(hparams.get("hidden", 16), activation="relu"),
            tf.keras.layers.Dense(hparams["classes"], activation="softmax"),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.01),
        loss=smoothed_crossentropy,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy("acc")],
    )
    return model


def _plain_mlp(hparams: dict) -> tf.keras.Model:
    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(hparams["features"],)),
            tf.keras.layers.Dense(hparams.get("hidden", 16), activation="relu"),
            tf.keras.layers.Dense(hparams["classes"], activation="softmax"),
        ]
    )


def mlp(hparams: dict) -> tf.keras.Model:
    """``slow_mlp`` without the pause: for runs nobody signals."""
    return _plain_mlp(hparams)


def renormalized_mlp(hparams: dict) -> tf.keras.Model:
    """An MLP with batch renormalization, which cannot accumulate micro-batches."""
    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(hparams["features"],)),
            tf.keras.layers.Dense(hparams.get("hidden", 16), activation="relu"),
            tf.keras.layers.BatchNormalization(renorm=True, name="renormalized"),
            tf.keras.layers.Dense(hparams["classes"], activation="softmax"),
        ]
    )


def unknown_loss(hparams: dict) -> tf.keras.Model:
    """Compiled with a loss Keras does not know: Keras resolves it only when the training step is traced."""
    model = _plain_mlp(hparams)
    model.compile(optimizer="adam", loss="no_such_loss")
    return model


def unknown_metric(hparams: dict) -> tf.keras.Model:
    model = _plain_mlp(hparams)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["no_such_metric"])
    return model


class NanAfter(tf.keras.layers.Layer):
    """Counts training forward passes; from pass ``after + 1`` on, its outputs are NaN (a run that diverges)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.passes = tf.Variable(0, dtype=tf.int64, trainable=False, name="passes")

    def call(self, inputs: tf.Tensor, training: object = None) -> tf.Tensor:
        if not training:
            return inputs
        count = self.passes.assign_add(1)
        return inputs * tf.where(count > self.after, float("nan"), 1.0)


def diverges(hparams: dict) -> tf.keras.Model:
    """slow_mlp whose training loss turns NaN at step ``nan_after + 1`` (trained by the built-in loop)."""
    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(hparams["features"],)),
            tf.keras.layers.Dense(hparams.get("hidden", 16), activation="relu"),
            tf.keras.layers.Dense(hparams["classes"], activation="softmax"),
            NanAfter(hparams["nan_after"]),  # last: a relu would turn its NaN into 0
        ]
    )


def diverges_compiled(hparams: dict) -> tf.keras.Model:
    """``diverges``, compiled: trained by its own train_step, as model.fit trains it."""
    model = diverges(hparams)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
