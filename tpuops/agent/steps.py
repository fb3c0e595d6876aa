"""The compiled pieces of training: optimizer, loss, metrics, the multi-step call, evaluation.

The training call runs ``steps`` optimizer steps in one ``tf.function`` (``strategy.run``
inside a ``tf.range`` loop): one host round trip per call instead of per step, which is what
keeps a TPU busy. ``steps`` is a tensor, so a short last call does not retrace.

Nothing here draws random numbers or reads the clock: a step is a function of the weights,
the optimizer state and the batch, which is what makes exact resume possible.
"""

from typing import Any, Dict, Sequence

import tensorflow as tf

from tpuops.agent.runspec import TrainSpec


def make_optimizer(hparams: Dict[str, Any]) -> tf.keras.optimizers.Optimizer:
    """The optimizer named by hparams "optimizer" with "learning_rate" (and "momentum")."""
    name = hparams.get("optimizer", "adam")
    rate = float(hparams.get("learning_rate", 1e-3))
    momentum = float(hparams.get("momentum", 0.9))
    if name == "adam":
        return tf.keras.optimizers.Adam(learning_rate=rate)
    if name == "sgd":
        return tf.keras.optimizers.SGD(learning_rate=rate)
    if name == "momentum":
        return tf.keras.optimizers.SGD(learning_rate=rate, momentum=momentum)
    return tf.keras.optimizers.RMSprop(learning_rate=rate, momentum=momentum)


def _metric_objects(names: Sequence[str], prefix: str) -> Dict[str, tf.keras.metrics.Metric]:
    factories = {
        "loss": lambda: tf.keras.metrics.Mean(prefix + "loss"),
        "accuracy": lambda: tf.keras.metrics.SparseCategoricalAccuracy(prefix + "accuracy"),
        "top5_accuracy": lambda: tf.keras.metrics.SparseTopKCategoricalAccuracy(5, prefix + "top5_accuracy"),
    }
    return {name: factories[name]() for name in names}


class Metrics:
    """A named set of Keras metrics updated from per-example losses and outputs."""

    def __init__(self, names: Sequence[str], prefix: str) -> None:
        self._metrics = _metric_objects(names, prefix)

    def update(self, labels: tf.Tensor, outputs: tf.Tensor, per_example_loss: tf.Tensor, weights: Any = None) -> None:
        for name, metric in self._metrics.items():
            if name == "loss":
                metric.update_state(per_example_loss, sample_weight=weights)
            else:
                metric.update_state(labels, outputs, sample_weight=weights)

    def results(self) -> Dict[str, float]:
        return {name: float(metric.result().numpy()) for name, metric in self._metrics.items()}

    def reset(self) -> None:
        for metric in self._metrics.values():
            metric.reset_state()


class Steps:
    """Builds the training and evaluation functions for one model under one strategy."""

    def __init__(self, strategy: Any, model: tf.keras.Model, optimizer: Any, spec: TrainSpec, global_batch: int):
        self._strategy = strategy
        self._model = model
        self._optimizer = optimizer
        self._global_batch = global_batch
        from_logits = spec.loss.endswith("_from_logits")
        self._loss = lambda labels, outputs: tf.keras.losses.sparse_categorical_crossentropy(
            labels, outputs, from_logits=from_logits
        )
        with strategy.scope():
            self.train_metrics = Metrics(spec.metrics, "train_")
            self.eval_metrics = Metrics(spec.metrics, "eval_")
        self.train_call = tf.function(self._train_call)
        self._eval_call = tf.function(self._eval_replicas)

    def _train_step(self, inputs: Any, labels: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            outputs = tf.cast(self._model(inputs, training=True), tf.float32)
            per_example = self._loss(labels, outputs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self._global_batch)
            if self._model.losses:
                loss += tf.nn.scale_regularization_loss(tf.cast(tf.add_n(self._model.losses), tf.float32))
        variables = self._model.trainable_variables
        self._optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        self.train_metrics.update(labels, outputs, per_example)

    def _train_call(self, iterator: Any, steps: tf.Tensor) -> None:
        for _ in tf.range(steps):
            self._strategy.run(self._train_step, args=next(iterator))

    def _eval_step(self, inputs: Any, labels: tf.Tensor, mask: tf.Tensor) -> None:
        outputs = tf.cast(self._model(inputs, training=False), tf.float32)
        self.eval_metrics.update(labels, outputs, self._loss(labels, outputs), weights=mask)

    def _eval_replicas(self, batch: Any) -> None:
        self._strategy.run(self._eval_step, args=batch)

    def evaluate(self, dataset: Any, max_batches: Any = None) -> Dict[str, float]:
        """Metrics over a distributed dataset of (inputs, labels, mask), at most ``max_batches``."""
        self.eval_metrics.reset()
        for count, batch in enumerate(dataset):
            if max_batches is not None and count >= max_batches:
                break
            self._eval_call(batch)
        return self.eval_metrics.results()
