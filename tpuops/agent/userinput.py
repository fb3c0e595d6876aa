"""The user's own input function: ``input_fn(file_patterns, batch_size, *, training, seed, input_context)``.

The spec's ``input_fn`` ("module:function") replaces the built-in parser, so a user can read any
TFRecord schema (variable-length, ragged or sparse features padded to static shapes, several
inputs and outputs). The agent calls it with the sorted files of ``dataset.train`` (or
``dataset.eval``), the GLOBAL batch size, ``training``, the run's ``seed`` and a
``tf.distribute.InputContext`` (replicas in sync; one input pipeline: the agent distributes).
The agent still owns distribution (sharding by data: every host keeps its share of each global
batch, as for the built-in pipeline), prefetching, the data position and the starvation measure.

What the function must respect:

* return a ``tf.data.Dataset`` of ``(inputs, labels)`` or ``(inputs, labels, sample_weights)``
  batches of exactly ``batch_size`` rows with static shapes (``batch(..., drop_remainder=True)``,
  ``padded_batch`` with ``padded_shapes``): XLA and TPUs compile one shape, and the position is
  counted in batches. A dataset whose batch dimension is not static is refused (user-error).
  For evaluation (``training=False``) the dataset must end (one pass; an endless one is
  refused) and a short last batch is allowed on the CPU.
* do not shard with ``input_context`` (the agent does), and do not ``repeat`` unless the stream
  stays a pure function of the arguments (a finite training dataset is repeated by the agent).
* be deterministic: the same arguments must give the same batches in the same order (seeded
  shuffles, ``deterministic`` interleave/map, no clock or unseeded randomness). That is what
  exact resume rests on.

Position and resume: the position is the number of batches consumed (= the step). A resumed
attempt calls the function again with the same arguments and skips that many batches, which
reads (and parses) the skipped part of the stream once; cheap for the runs this is made for,
proportional to the step otherwise. To detect a function that breaks the contract, every
checkpoint stores a fingerprint (sha256) of the stream's first batch; on resume the agent
compares it with the rebuilt stream's first batch. When they differ the position cannot be
restored: the attempt resumes by step only, with a logged warning, on a fresh stream seeded
with ``seed + step`` (weights and optimizer are exact, the data order is not).
"""

import hashlib
import inspect
import logging
from typing import Any, Callable, List, Optional

import numpy as np
import tensorflow as tf

from tpuops.agent import entry
from tpuops.agent.inputs import AUTOTUNE, distribution_options
from tpuops.contract.exits import UserError
from tpuops.contract.runspec import RunSpec

log = logging.getLogger(__name__)

InputFn = Callable[..., Any]


def check_signature(function: InputFn, name: str) -> None:
    """Refuse a function that cannot be called as ``fn(patterns, batch, training=, seed=, input_context=)``."""
    try:
        inspect.signature(function).bind(["file"], 1, training=True, seed=0, input_context=None)
    except TypeError as err:
        raise UserError(
            f"input_fn {name}: has the wrong signature ({err}); expected "
            "input_fn(file_patterns, batch_size, *, training, seed, input_context)"
        ) from err


def load(spec: RunSpec) -> InputFn:
    """Import and check the spec's input function."""
    assert spec.input_fn is not None
    function = entry.load_function(spec, spec.input_fn, "input_fn")
    check_signature(function, spec.input_fn)
    return function


class UserInput:
    """Calls the input function and turns what it returns into the streams the loop reads."""

    def __init__(self, spec: RunSpec, function: InputFn, global_batch: int, replicas: int) -> None:
        self._spec = spec
        self._function = function
        self._global_batch = global_batch
        self._context = tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=replicas
        )

    def _call(self, files: List[str], training: bool, seed: int) -> tf.data.Dataset:
        try:
            dataset = self._function(
                list(files), self._global_batch, training=training, seed=seed, input_context=self._context
            )
        except Exception as err:
            raise UserError(f"input_fn {self._spec.input_fn} raised: {err}") from err
        if not isinstance(dataset, tf.data.Dataset):
            raise UserError(f"input_fn {self._spec.input_fn} returned {type(dataset).__name__}, not a tf.data.Dataset")
        parts = tf.nest.flatten(dataset.element_spec)
        if not isinstance(dataset.element_spec, tuple) or len(dataset.element_spec) not in (2, 3):
            raise UserError(
                f"input_fn {self._spec.input_fn}: elements must be (inputs, labels) or (inputs, labels, weights), "
                f"got {dataset.element_spec}"
            )
        if training and any(part.shape.rank == 0 or part.shape[0] != self._global_batch for part in parts):
            raise UserError(
                f"input_fn {self._spec.input_fn}: training batches must have the static batch dimension "
                f"{self._global_batch} (use batch(..., drop_remainder=True) or padded_batch with fixed shapes), "
                f"got {dataset.element_spec}"
            )
        return dataset

    def input_signature(self, files: List[str], per_replica: int) -> Any:
        """The TensorSpecs of one replica's model inputs, from the training dataset."""
        inputs_spec = self._call(files, True, self._spec.seed).element_spec[0]
        return tf.nest.map_structure(lambda s: tf.TensorSpec((per_replica, *s.shape[1:]), s.dtype), inputs_spec)

    def fingerprint(self, files: List[str]) -> str:
        """sha256 of the first training batch for the run's seed: what a deterministic function repeats."""
        first = next(iter(self._call(files, True, self._spec.seed).take(1)))
        digest = hashlib.sha256()
        for tensor in tf.nest.flatten(first, expand_composites=True):
            digest.update(np.ascontiguousarray(tensor.numpy()).tobytes())
        return digest.hexdigest()

    def train_dataset(self, files: List[str], step: int, stored_fingerprint: Optional[str]) -> tf.data.Dataset:
        """The endless training stream positioned after ``step`` batches (see the module docstring)."""
        seed = self._spec.seed
        skip = step
        if step and stored_fingerprint and self.fingerprint(files) != stored_fingerprint:
            log.warning(
                "input_fn %s is not deterministic (its first batch differs from the one this run started with): "
                "the data position cannot be restored; resuming by step %d on a fresh stream seeded %d",
                self._spec.input_fn,
                step,
                seed + step,
            )
            seed, skip = seed + step, 0
        dataset = self._call(files, True, seed)
        if dataset.cardinality() != tf.data.INFINITE_CARDINALITY:
            dataset = dataset.repeat()
        return distribution_options(dataset.skip(skip).prefetch(AUTOTUNE))

    def eval_dataset(self, files: List[str]) -> tf.data.Dataset:
        """One pass of evaluation batches as (inputs, labels, weights): the weights are 1 unless given."""

        def with_weights(inputs: Any, labels: Any, weights: Any = None) -> Any:
            if weights is None:
                rows = tf.shape(tf.nest.flatten(labels)[0])[0]
                weights = tf.ones([rows], tf.float32)
            return inputs, labels, weights

        dataset = self._call(files, False, self._spec.seed)
        if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise UserError(f"input_fn {self._spec.input_fn}: with training=False it must return a finite dataset")
        return distribution_options(dataset.map(with_weights).prefetch(AUTOTUNE))
