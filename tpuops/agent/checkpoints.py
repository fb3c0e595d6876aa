"""Training checkpoints: what is saved, when, and which one a new attempt resumes from.

A checkpoint is ``tf.train.Checkpoint(model, optimizer, step, data=(examples_seen,
epoch_size[, input_fingerprint]))`` saved by a ``tf.train.CheckpointManager`` as
``<store>/runs/<run>/ckpt/ckpt-<step>``:
the model and optimizer state plus the input position (``inputs``) is everything a
deterministic step depends on, so a resumed run reproduces the uninterrupted one bit for bit.

Resume picks the newest *valid* checkpoint. Candidates come from listing ``ckpt-*.index``,
not from the manager's ``checkpoint`` state file: the state file can name files that never
landed (the VM died between the data and the state write) and can miss a complete checkpoint
(it died after the data, before the state). A candidate is valid when its index parses and
every tensor reads back with a matching CRC32C (the tensor bundle format checksums each
tensor), so a truncated ``.index`` or ``.data`` file is caught. Invalid candidates are logged
and deleted, so the next save at that step starts clean and later attempts do not re-read them.
"""

import logging
import re
import time
from typing import List, Optional, Tuple

import tensorflow as tf

from tpuops.agent.paths import join

log = logging.getLogger(__name__)

_INDEX_NAME = re.compile(r"^ckpt-(\d+)\.index$")


class TrainState:
    """The counters a resume needs besides model and optimizer; host variables, not replicated."""

    def __init__(self, with_fingerprint: bool = False) -> None:
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.examples_seen = tf.Variable(0, dtype=tf.int64, trainable=False, name="examples_seen")
        self.epoch_size = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch_size")
        # The user input function's first-batch fingerprint (``userinput``); only in that mode,
        # so built-in runs keep their checkpoint layout.
        self.input_fingerprint = (
            tf.Variable("", dtype=tf.string, trainable=False, name="input_fingerprint") if with_fingerprint else None
        )

    def checkpoint(self, **objects: object) -> tf.train.Checkpoint:
        data = tf.train.Checkpoint(examples_seen=self.examples_seen, epoch_size=self.epoch_size)
        if self.input_fingerprint is not None:
            data.input_fingerprint = self.input_fingerprint
        return tf.train.Checkpoint(step=self.step, data=data, **objects)

    def advance(self, steps: int, global_batch: int) -> int:
        """Count ``steps`` finished steps of ``global_batch`` records; returns the new step."""
        self.examples_seen.assign_add(steps * global_batch)
        return int(self.step.assign_add(steps).numpy())


def candidates(directory: str) -> List[Tuple[int, str]]:
    """(step, prefix) of every checkpoint whose index file exists, newest first."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = []
    for name in tf.io.gfile.listdir(directory):
        match = _INDEX_NAME.match(name)
        if match:
            found.append((int(match.group(1)), join(directory, "ckpt-" + match.group(1))))
    return sorted(found, reverse=True)


def problem(prefix: str) -> Optional[str]:
    """Why the checkpoint at ``prefix`` cannot be restored, or None when every tensor reads back."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as err:  # the reader raises OpError, ValueError or IndexError on damaged files
        message = err.message if isinstance(err, tf.errors.OpError) else str(err)
        return "{}: {}".format(type(err).__name__, message.strip().splitlines()[0] if message.strip() else "")
    return None


def _delete(prefix: str) -> None:
    for path in tf.io.gfile.glob(prefix + ".*"):
        tf.io.gfile.remove(path)


def newest_valid(directory: str) -> Optional[Tuple[int, str]]:
    """The newest restorable checkpoint in ``directory`` as (step, prefix); invalid newer ones are removed."""
    for step, prefix in candidates(directory):
        reason = problem(prefix)
        if reason is None:
            return step, prefix
        log.warning("skipping corrupt checkpoint %s (%s); removing it", prefix, reason)
        _delete(prefix)
    return None


class Checkpointer:
    """Saves on a step and time schedule, and on demand; remembers the last step it saved."""

    def __init__(
        self, checkpoint: tf.train.Checkpoint, directory: str, keep: int, every_steps: int, every_seconds: float
    ) -> None:
        self._checkpoint = checkpoint
        self._directory = directory
        self._every_steps = every_steps
        self._every_seconds = every_seconds
        self._manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=keep, checkpoint_name="ckpt")
        self._last_time = time.monotonic()
        self.last_step: Optional[int] = None

    def restore_newest(self) -> Optional[int]:
        """Restore the newest valid checkpoint; returns its step, or None for a fresh start."""
        found = newest_valid(self._directory)
        if found is None:
            return None
        step, prefix = found
        # Optimizer slots do not exist yet; their values wait for creation (deferred restore).
        self._checkpoint.restore(prefix).assert_existing_objects_matched()
        self.last_step = step
        self._last_time = time.monotonic()
        return step

    def steps_to_boundary(self, step: int) -> Optional[int]:
        """Steps until the next multiple of every_steps (None when saving by steps is off)."""
        return self._every_steps - step % self._every_steps if self._every_steps else None

    def due(self, step: int) -> bool:
        """True when the schedule asks for a checkpoint at ``step`` (a call boundary)."""
        if step == self.last_step:
            return False
        by_steps = bool(self._every_steps) and step % self._every_steps == 0
        by_time = bool(self._every_seconds) and time.monotonic() - self._last_time >= self._every_seconds
        return by_steps or by_time

    def save(self, step: int) -> str:
        """Write ``ckpt-<step>`` (at most once per step) and prune beyond ``keep``."""
        if step == self.last_step:
            return join(self._directory, f"ckpt-{step}")
        path = self._manager.save(checkpoint_number=step)
        self.last_step = step
        self._last_time = time.monotonic()
        log.info("checkpoint saved at step %d: %s", step, path)
        return path
