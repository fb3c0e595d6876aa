"""The compiled pieces of training: optimizer, loss, metrics, the multi-step call, evaluation.

The training call runs ``steps`` optimizer steps in one ``tf.function`` (``strategy.run``
inside a ``tf.range`` loop): one host round trip per call instead of per step, which is what
keeps a TPU busy. ``steps`` is a tensor, so a short last call does not retrace.

Two step builders share that call (``MultiStep``): ``Steps`` for a plain model (the loss,
metrics and optimizer named in the spec) and ``CompiledSteps`` for a model the user compiled,
whose own ``train_step``/``test_step`` run inside the call, exactly as ``model.fit`` runs them.

Nothing in a step draws random numbers or reads the clock: a step is a function of the
weights, the optimizer state and the batch, which is what makes exact resume possible. The
call does read the clock around each ``next(iterator)``, outside the numerics, to measure how
long each step waited for its batch (the starvation measure). TF 2.9 refuses ``tf.timestamp``
while op determinism is on, so deterministic runs read the host clock through a
``py_function`` instead (tens of microseconds per step).

Every step also says whether its loss (or, for a compiled model, any loss or metric its
``train_step`` returns) is NaN or infinite; the call returns the index of the first such step, so
the loop stops a diverged run at the call that diverged, before it checkpoints the weights, and
names the step. It costs a cross-replica sum of one scalar per step, read with the input wait.

The training metrics are means over a window of steps the loop opens (``start_window``, at every
multiple of ``steps_per_call``): the call resets them before its first step, so a value read after
any call covers the steps since the window opened, whether the host read it after one call or after
several, on one host or on a slice: the mean of every example's loss in those steps, counted the
same whatever the replicas and micro-batches the steps ran on.

A step whose global batch is more than the slice takes at once accumulates gradients: each
replica's share of the global batch is cut into ``accumulation`` micro-batches that run forward
and backward one after another inside the step (a ``tf.while_loop`` in the graph, not the host),
and their summed gradients make one optimizer update, the update the same global batch makes on
a larger slice (``Steps._accumulated``); the metrics are updated once per step, after the loop, from
every micro-batch's outputs (a metric's update may not sit inside the loop under
``CentralStorageStrategy``). Layers that compute batch statistics (batch
normalization) normalize each micro-batch by its own statistics, as a larger slice's replicas normalize
theirs, and move their moving statistics once per step, by the mean of the micro-batches' (``batchnorm``).
Layers that draw random numbers (dropout) draw per micro-batch: the same in distribution as a larger
slice, not in value. A
compiled model's own ``train_step`` applies its gradients per batch, so it cannot accumulate:
``CompiledSteps`` refuses an accumulation (``train``).

``prepare`` creates, before the first call, the variables that call would otherwise create
while it is traced (the optimizer's slots and hyperparameters, a compiled model's metrics): a
``tf.function`` whose first trace creates variables is traced a second time, so that it never
creates them again. ``model.fit`` pays that second trace; the agent's first call does not
(for the CIFAR-10 CNN, about 0.4 s of host time saved per attempt: half its tracing).
"""

import functools
import logging
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.framework import config as tf_config

from tpuops.agent.batchnorm import MovingStatistics
from tpuops.contract.runspec import TrainSpec

log = logging.getLogger(__name__)


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


def _clock() -> Callable[[], tf.Tensor]:
    """A clock op usable in the training call: tf.timestamp unless op determinism forbids it."""
    if not tf_config.is_op_determinism_enabled():
        return tf.timestamp

    def host_clock() -> tf.Tensor:
        now = tf.py_function(time.perf_counter, [], tf.float64)
        now.set_shape([])
        return now

    return host_clock


def create_optimizer_state(optimizer: Any, variables: Sequence[tf.Variable]) -> None:
    """The optimizer's step counter, hyperparameters and slots for ``variables``, created now (eagerly).

    Keras 2.9's optimizers create them in ``_create_all_weights``, called by the first
    ``apply_gradients``; later ones in ``build``. Restored values still reach them: a slot
    created after a checkpoint was restored takes its value from that checkpoint.
    """
    create = getattr(optimizer, "_create_all_weights", None) or getattr(optimizer, "build", None)
    if create is not None:
        create(list(variables))


def nonfinite(values: Any) -> tf.Tensor:
    """1.0 when any floating-point tensor in ``values`` (a structure) holds a NaN or an infinity, else 0.0."""
    flags = [
        tf.reduce_any(tf.logical_not(tf.math.is_finite(value)))
        for value in tf.nest.flatten(values)
        if isinstance(value, tf.Tensor) and value.dtype.is_floating
    ]
    return tf.cast(tf.reduce_any(flags), tf.float32) if flags else tf.constant(0.0)


def _micro_batches(tensor: Any, count: int) -> tf.Tensor:
    """``tensor`` (rows first) as ``[count, rows / count, ...]``: micro-batch ``i`` is ``result[i]``."""
    tensor = tf.convert_to_tensor(tensor)
    shape = tf.shape(tensor)
    split = tf.reshape(tensor, tf.concat([[count, shape[0] // count], shape[1:]], 0))
    rows = tensor.shape[0]
    split.set_shape(tf.TensorShape([count, None if rows is None else rows // count]).concatenate(tensor.shape[1:]))
    return split


def _take(split: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """Micro-batch ``index`` of a ``_micro_batches`` result."""
    return tf.gather(split, index)


def _labelled(element_spec: Any) -> Any:
    """``(inputs, labels)`` specs of a batch ``(inputs, labels[, weights])``; None for another structure."""
    if isinstance(element_spec, tuple) and len(element_spec) in (2, 3):
        return element_spec[0], element_spec[1]
    return None


class MultiStep:
    """The multi-step training call and its input-wait clock; subclasses give the replica step."""

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy
        # A host variable (created outside the strategy scope): seconds this call spent in next(iterator).
        self._waited = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_wait")
        # A host variable too: the index in the call of the first step whose loss was not finite (-1: none).
        self._first_nonfinite = tf.Variable(-1, dtype=tf.int64, trainable=False, name="first_nonfinite")
        # And one more: the next call resets the training metrics before its first step (``start_window``).
        self._fresh_window = tf.Variable(False, trainable=False, name="fresh_window")
        self._clock = _clock()
        self.train_call = tf.function(self._train_call)

    # Set by the subclasses: the replica step, the training metrics, the evaluation call and its metrics.
    train_metrics: Any
    eval_metrics: Any
    _eval_call: Any

    def _replica_step(self, batch: Any) -> Any:
        """Run one step on every replica; returns per replica 1.0 when its loss was not finite (``nonfinite``)."""
        raise NotImplementedError

    def prepare(self, element_spec: Any) -> None:
        """Create the variables the first call would create, for batches of ``element_spec`` (module docstring)."""
        raise NotImplementedError

    def start_window(self) -> None:
        """The training metrics count afresh from the next call's first step.

        The reset runs inside that call, before its first step: no host round trip (on a slice the
        metrics live on a worker), and the values read after any call are those of the steps since the
        last window started, whenever they are read (the loop's reports follow the clock).
        """
        self._fresh_window.assign(True)

    def _train_call(self, iterator: Any, steps: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """Train ``steps`` steps; returns the seconds they waited for input and the index of the first
        step whose loss was not finite, -1 when none was (reading either waits for the call)."""
        self._waited.assign(0.0)
        self._first_nonfinite.assign(-1)
        if self._fresh_window.read_value():
            self.train_metrics.reset()
        self._fresh_window.assign(False)
        for index in tf.range(steps, dtype=tf.int64):
            before = self._clock()
            with tf.control_dependencies([before]):
                batch = next(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                self._waited.assign_add(self._clock() - before)
            bad = self._strategy.reduce(tf.distribute.ReduceOp.SUM, self._replica_step(batch), axis=None)
            first = self._first_nonfinite.read_value()
            self._first_nonfinite.assign(tf.where(tf.logical_and(first < 0, bad > 0), index, first))
        return self._waited.read_value(), self._first_nonfinite.read_value()

    def trace(self, iterator: Any) -> None:
        """Trace the training call for ``iterator`` now, so that what cannot be traced fails before any step runs."""
        self.train_call.get_concrete_function(iterator, tf.TensorSpec([], tf.int64))

    def evaluate(self, dataset: Any, max_batches: Any = None) -> Dict[str, float]:
        """Metrics over a distributed dataset of (inputs, labels, mask), at most ``max_batches``."""
        self.eval_metrics.reset()
        for count, batch in enumerate(dataset):
            if max_batches is not None and count >= max_batches:
                break
            self._eval_call(batch)
        return self.eval_metrics.results()


class Steps(MultiStep):
    """Builds the training and evaluation functions for a plain model under one strategy."""

    def __init__(self, strategy: Any, model: tf.keras.Model, optimizer: Any, spec: TrainSpec, global_batch: int,
                 accumulation: int = 1):
        self._model = model
        self._optimizer = optimizer
        self._global_batch = global_batch
        self._accumulation = accumulation
        self._statistics = MovingStatistics(model)  # batch normalization's, moved once per accumulated step
        from_logits = spec.loss.endswith("_from_logits")
        self._loss = lambda labels, outputs: tf.keras.losses.sparse_categorical_crossentropy(
            labels, outputs, from_logits=from_logits
        )
        with strategy.scope():
            self.train_metrics = Metrics(spec.metrics, "train_")
            self.eval_metrics = Metrics(spec.metrics, "eval_")
        super().__init__(strategy)
        self._eval_call = tf.function(self._eval_replicas)

    def _gradients(self, inputs: Any, labels: tf.Tensor, weights: Any = None) -> Tuple[List[Any], tf.Tensor, Any]:
        """This replica's gradients of one (micro-)batch's share of the step's loss, that share, and the
        ``(outputs, per-example losses)`` the metrics are updated from (``_train_step``).

        Per-example losses are divided by the global batch, so the shares of every micro-batch on
        every replica sum to the step's mean loss; the regularization loss, added once per step,
        is split evenly over the replicas and the micro-batches.
        """
        with tf.GradientTape() as tape:
            outputs = tf.cast(self._model(inputs, training=True), tf.float32)
            per_example = self._loss(labels, outputs)
            weighted = per_example if weights is None else per_example * tf.cast(weights, tf.float32)
            loss = tf.nn.compute_average_loss(weighted, global_batch_size=self._global_batch)
            if self._model.losses:
                regularization = tf.nn.scale_regularization_loss(tf.cast(tf.add_n(self._model.losses), tf.float32))
                loss += regularization if self._accumulation == 1 else regularization / self._accumulation
        return tape.gradient(loss, self._model.trainable_variables), loss, (outputs, per_example)

    def _accumulated(self, *batch: Any) -> Tuple[List[Any], tf.Tensor, Any]:
        """The gradients of ``accumulation`` micro-batches summed in a loop of the graph, their loss, and the
        ``(outputs, per-example losses)`` of all their rows in the batch's order.

        The replica's share of the step (``accumulation`` x ``per_replica_batch_size`` rows) is cut
        into micro-batches of consecutive rows; each runs forward and backward on its own, so a
        replica holds one micro-batch's activations at a time, and the sums are loop variables of
        one ``tf.while_loop`` (the model is traced once, whatever the accumulation). The step's
        examples are the ones the same step takes on a slice that needs no accumulation; only the
        order of the float sums differs (module docstring of ``train``).

        Nothing in the loop updates a metric: the outputs and losses are gathered in tensor arrays and
        the step updates the metrics once after it. A metric's update is a synchronization point under
        ``CentralStorageStrategy`` (the emulator's multi-host slices; its variables live on one device),
        and TensorFlow refuses one inside a ``tf.while_loop`` body. Nor does it move a batch normalization's
        statistics: the loop sums what each micro-batch would move them by, and the step moves them once
        (``batchnorm.MovingStatistics``).
        """
        count = self._accumulation
        micro = tf.nest.map_structure(lambda part: _micro_batches(part, count), batch)
        variables = self._model.trainable_variables
        sums = [tf.zeros(variable.shape, variable.dtype) for variable in variables]
        statistics = self._statistics.zeros()
        total = tf.constant(0.0)
        outputs = tf.TensorArray(tf.float32, size=count)
        per_example = tf.TensorArray(tf.float32, size=count)
        for index in tf.range(count):
            with self._statistics.deferred():
                gradients, loss, (micro_outputs, micro_losses) = self._gradients(
                    *tf.nest.map_structure(functools.partial(_take, index=index), micro))
            statistics = self._statistics.add(statistics)
            sums = [
                total_gradient if gradient is None else total_gradient + tf.convert_to_tensor(gradient)
                for total_gradient, gradient in zip(sums, gradients)
            ]
            total += loss
            outputs = outputs.write(index, micro_outputs)
            per_example = per_example.write(index, micro_losses)
        self._statistics.update(statistics, count)
        return sums, total, (outputs.concat(), per_example.concat())

    def _train_step(self, *batch: Any) -> tf.Tensor:
        """One optimizer step of the replica's share ``(inputs, labels[, weights])``; 1.0 if its loss is not finite."""
        gradients, loss, (outputs, per_example) = (
            self._gradients(*batch) if self._accumulation == 1 else self._accumulated(*batch))
        self.train_metrics.update(batch[1], outputs, per_example, batch[2] if len(batch) > 2 else None)
        variables = self._model.trainable_variables
        self._optimizer.apply_gradients(zip(gradients, variables))
        return nonfinite(loss)

    def _replica_step(self, batch: Any) -> Any:
        return self._strategy.run(self._train_step, args=batch)

    def prepare(self, element_spec: Any) -> None:
        with self._strategy.scope():
            create_optimizer_state(self._optimizer, self._model.trainable_variables)

    def _eval_step(self, inputs: Any, labels: tf.Tensor, mask: tf.Tensor) -> None:
        outputs = tf.cast(self._model(inputs, training=False), tf.float32)
        self.eval_metrics.update(labels, outputs, self._loss(labels, outputs), weights=mask)

    def _eval_replicas(self, batch: Any) -> None:
        self._strategy.run(self._eval_step, args=batch)



class ModelMetrics:
    """The metrics of a compiled model under the names the model gives them (train and eval share them)."""

    def __init__(self, model: tf.keras.Model) -> None:
        self._model = model

    def results(self) -> Dict[str, float]:
        values: Dict[str, float] = {}
        for metric in self._model.metrics:
            result = metric.result()
            if isinstance(result, dict):
                values.update({name: float(value) for name, value in result.items()})
            else:
                values[metric.name] = float(result)
        return values

    def reset(self) -> None:
        self._model.reset_metrics()


class CompiledSteps(MultiStep):
    """Drives a compiled model's own ``train_step``/``test_step`` inside the multi-step call.

    Batches are ``(inputs, labels)`` or ``(inputs, labels, sample_weights)``; evaluation
    batches carry the padding mask as sample weights, so padded rows count for nothing in
    weighted metrics. (Keras' loss tracker averages the loss per batch, so over a padded last
    batch the eval "loss" is scaled by the fraction of real rows; metrics are exact.)
    """

    def __init__(self, strategy: Any, model: tf.keras.Model) -> None:
        self._model = model
        self.train_metrics = self.eval_metrics = ModelMetrics(model)
        super().__init__(strategy)
        self._eval_call = tf.function(lambda batch: strategy.run(model.test_step, args=(batch,)))

    def _replica_step(self, batch: Any) -> Any:
        return self._strategy.run(lambda data: nonfinite(self._model.train_step(data)), args=(batch,))

    def prepare(self, element_spec: Any) -> None:
        """The optimizer's state, and the compiled loss and metrics built from the outputs' signature.

        Building the metrics needs only the structure, shapes and dtypes of labels and outputs,
        which ``compute_output_signature`` gives without running the model. A model or batch it
        cannot describe is left to the first call to build (traced twice, as before).
        """
        model = self._model
        with self._strategy.scope():
            create_optimizer_state(model.optimizer, model.trainable_variables)
            labelled = _labelled(element_spec)
            if labelled is None or getattr(model, "compiled_metrics", None) is None:
                return
            try:
                outputs = model.compute_output_signature(labelled[0])
                if not model.compiled_loss.built:
                    model.compiled_loss.build(outputs)
                if not model.compiled_metrics.built:
                    model.compiled_metrics.build(outputs, labelled[1])
            except (TypeError, ValueError, NotImplementedError, AttributeError) as err:
                log.debug("compiled metrics left to the first call: %s", err)

    def evaluate(self, dataset: Any, max_batches: Any = None) -> Dict[str, float]:
        results = super().evaluate(dataset, max_batches)
        self.train_metrics.reset()  # Keras keeps one set of metrics: training starts counting afresh
        return results
