"""A compiled Keras regression model with its own loss and metrics, for scikit-learn's diabetes data.

The entry point compiles the model itself (the agent calls it inside the strategy scope), so
the agent trains with this optimizer, loss and these metrics through the model's own
train_step; status and the run's target use the metric names given here.
"""

from typing import Any, Dict

import tensorflow as tf

layers = tf.keras.layers


def relative_huber(labels: tf.Tensor, predictions: tf.Tensor) -> tf.Tensor:
    """Huber loss on the error relative to the label scale (delta 0.1, i.e. 10 % of 100)."""
    return tf.keras.losses.huber(labels / 100.0, predictions / 100.0, delta=0.1)


class WithinTenPercent(tf.keras.metrics.MeanMetricWrapper):
    """The fraction of predictions within 10 % of the label."""

    def __init__(self, name: str = "within_10pct", **kwargs: Any) -> None:
        super().__init__(self.hit, name=name, **kwargs)

    @staticmethod
    def hit(labels: tf.Tensor, predictions: tf.Tensor) -> tf.Tensor:
        labels = tf.reshape(labels, [-1])
        predictions = tf.reshape(predictions, [-1])
        return tf.cast(tf.abs(predictions - labels) <= 0.1 * tf.abs(labels), tf.float32)


def diabetes_mlp(hparams: Dict[str, Any]) -> tf.keras.Model:
    """10 standardised features -> 64 -> 32 -> 1, outputs in label units (disease progression).

    hparams: ``learning_rate`` (= 0.01), ``hidden`` (= 64).
    """
    hidden = int(hparams.get("hidden", 64))
    model = tf.keras.Sequential(
        [
            layers.InputLayer(input_shape=(10,)),
            layers.Rescaling(20.0),  # sklearn's features are scaled to unit norm per column
            layers.Dense(hidden, activation="relu"),
            layers.Dense(hidden // 2, activation="relu"),
            layers.Dense(1),
            layers.Rescaling(100.0, offset=150.0),
        ],
        name="diabetes_mlp",
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(float(hparams.get("learning_rate", 0.01))),
        loss=relative_huber,
        metrics=[
            tf.keras.metrics.MeanAbsoluteError(name="mae"),
            tf.keras.metrics.RootMeanSquaredError(),
            WithinTenPercent(),
        ],
    )
    return model
