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
A local copy of the newest candidate, downloaded while TensorFlow imported (``prefetch``), is
validated the same way before it is restored in place of the store's files.

Saving costs the step loop only a snapshot. ``save`` asks TF 2.9 for an asynchronous write
(``CheckpointOptions(experimental_enable_async_checkpoint=True)``): the values are copied to host
memory in the caller's thread, and TensorFlow writes them in a thread of its own. The snapshot
is consistent because TF copies a variable's buffer before updating it while a read still holds
it. When the store is remote (``gs://``) the write goes to a local staging directory and a
finisher thread copies it into the store and prunes the store to the newest ``keep``.
Invariants, which keep a half-written or half-copied checkpoint from ever being a candidate:

* TensorFlow writes a checkpoint's ``.index`` after its data; the copy does the same, and on a
  local store copies every file under a temporary name and renames it into place (a GCS object
  appears only once its upload is complete); leftovers of a dead copy are removed by the next;
* pruning deletes a checkpoint's index before its data;
* one save is in flight at most: the next save, ``wait()`` and a blocking ``save`` wait for it
  and raise its error (once; a later save of the failed step writes it again). A blocking
  ``save(step)`` (the preemption and final saves) returns only once the checkpoint is whole in
  the store; ``stored_step`` is the newest step that is.
  The writer and finisher threads are not daemons: the interpreter does not exit before them;
* ``on_stored(step)`` is called (in the finisher thread) only once ``ckpt-<step>`` is whole in
  the store, so whoever it tells (status ``last_checkpoint_step``) never names a checkpoint a
  resumed attempt could not restore; ``on_writing(step)`` is called in the same thread when
  the write begins. Both are called before ``wait()`` returns, and a callback that raises fails
  the save like a failed write.

Save time against checkpoint size, the step-loop share of periodic saves (of a bare loop, and of
the agent's own, ``--only agent-ckpt-loop``) and the SIGTERM save of 1 GB of variables are measured
by ``bench/bench_infer.py``.
"""

import logging
import os
import tempfile
import threading
import time
from typing import Callable, List, Optional, Tuple

import tensorflow as tf

from tpuops.agent.paths import CHECKPOINT_INDEX, is_remote, join, local_directory, write_whole
from tpuops.contract.interval import young_daly_s

log = logging.getLogger(__name__)

_COPY_SUFFIX = ".tmp-copy"
# TF 2.9 copies the values to host memory in the caller's thread and writes them in its own.
_ASYNC = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)


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
        """Count ``steps`` finished steps of ``global_batch`` records; returns the new step.

        So ``examples_seen = step x global_batch`` always: the checkpoint records its global batch
        without a variable of its own (checkpoints older than elastic runs say it too), and the
        position is in examples, whatever the slice size that trained them (``inputs``).
        """
        self.examples_seen.assign_add(steps * global_batch)
        return int(self.step.assign_add(steps).numpy())


def candidates(directory: str) -> List[Tuple[int, str]]:
    """(step, prefix) of every checkpoint whose index file exists, newest first."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = []
    for name in tf.io.gfile.listdir(directory):
        match = CHECKPOINT_INDEX.match(name)
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
    """Remove a checkpoint's files, its index first: a half-deleted checkpoint is no candidate."""
    for path in sorted(tf.io.gfile.glob(prefix + ".*"), key=lambda path: not path.endswith(".index")):
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


def default_staging(directory: str) -> Optional[str]:
    """Where checkpoints for ``directory`` are staged: a local directory for a remote store, else None."""
    if not is_remote(directory):
        return None
    return local_directory(os.path.join(tempfile.gettempdir(), "tpuops-checkpoints"), directory)


def copy_checkpoint(prefix: str, directory: str) -> str:
    """Copy the checkpoint at ``prefix`` into ``directory``, its index last; returns the new prefix."""
    name = prefix.rsplit("/", 1)[-1]
    files = sorted(tf.io.gfile.glob(prefix + ".*"), key=lambda path: path.endswith(".index"))
    if not files or not files[-1].endswith(".index"):
        raise FileNotFoundError(f"checkpoint {prefix} has no index file: nothing to copy")
    for source in files:
        target = join(directory, source.rsplit("/", 1)[-1])
        if is_remote(directory):
            tf.io.gfile.copy(source, target, overwrite=True)
        else:
            tf.io.gfile.copy(source, target + _COPY_SUFFIX, overwrite=True)
            tf.io.gfile.rename(target + _COPY_SUFFIX, target, overwrite=True)
    return join(directory, name)


def _remove_copy_leftovers(directory: str) -> None:
    for path in tf.io.gfile.glob(join(directory, "ckpt-*" + _COPY_SUFFIX)):
        tf.io.gfile.remove(path)


def prune(directory: str, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints in ``directory``; the state file names those left."""
    found = candidates(directory)
    for _, prefix in found[keep:]:
        _delete(prefix)
    kept = [prefix.rsplit("/", 1)[-1] for _, prefix in reversed(found[:keep])]
    if kept:  # the state file tf.train.latest_checkpoint reads, in CheckpointManager's form
        lines = [f'model_checkpoint_path: "{kept[-1]}"'] + [f'all_model_checkpoint_paths: "{name}"' for name in kept]
        write_whole(join(directory, "checkpoint"), "\n".join(lines) + "\n")


class Checkpointer:
    """Saves on a step and time schedule, and on demand; remembers the last step it saved.

    ``staging``: a local directory to write checkpoints to before they are copied into
    ``directory`` (see the module docstring); None picks ``default_staging(directory)``.
    ``on_writing`` and ``on_stored``: called with the step when its write begins and once it
    is whole in the store (both in the finisher thread; see the module docstring).
    """

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        directory: str,
        keep: int,
        every_steps: int,
        every_seconds: float,
        staging: Optional[str] = None,
        on_writing: Optional[Callable[[int], None]] = None,
        on_stored: Optional[Callable[[int], None]] = None,
        loss_rate_per_hour: Optional[float] = None,
        asynchronous: bool = True,
    ) -> None:
        self._checkpoint = checkpoint
        # On a slice (variables on another task) TF 2.9's asynchronous writer threads were seen to end before
        # the checkpoint's index was written: there the caller's thread writes, which is slower but whole.
        self._options = _ASYNC if asynchronous else None
        self._loss_rate_per_hour = loss_rate_per_hour
        self.save_s: Optional[float] = None  # the last save's cost, snapshot to whole in the store
        self._on_writing = on_writing
        self._on_stored = on_stored
        self._directory = directory
        self._keep = keep
        self._every_steps = every_steps
        self._every_seconds = every_seconds
        self._staging = staging or default_staging(directory)
        if self._staging is not None:
            if tf.io.gfile.exists(self._staging):
                tf.io.gfile.rmtree(self._staging)
            tf.io.gfile.makedirs(directory)
        self._manager = tf.train.CheckpointManager(
            checkpoint,
            self._staging or directory,
            max_to_keep=1 if self._staging else keep,
            checkpoint_name="ckpt",
        )
        self._finisher: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._last_time = time.monotonic()
        self.last_step: Optional[int] = None
        self.stored_step: Optional[int] = None  # the newest step known to be whole in ``directory``

    def restore_newest(self, prefetched: Optional[Tuple[int, str]] = None) -> Optional[int]:
        """Restore the newest valid checkpoint; returns its step, or None for a fresh start.

        ``prefetched``: (step, local prefix) of a local copy of the store's newest checkpoint
        (``prefetch``). It is restored when every tensor reads back; otherwise the store is read
        as without it (a bad copy is no reason to delete the store's checkpoint).
        """
        found = None
        if prefetched is not None:
            reason = problem(prefetched[1])
            if reason is None:
                found = prefetched
            else:
                log.warning("prefetched copy %s is unusable (%s); reading the store", prefetched[1], reason)
        if found is None:
            found = newest_valid(self._directory)
        if found is None:
            return None
        step, prefix = found
        # Optimizer slots do not exist yet; their values wait for creation (deferred restore).
        self._checkpoint.restore(prefix).assert_existing_objects_matched()
        self.last_step = self.stored_step = step
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

    def save(self, step: int, background: bool = False) -> str:
        """Write ``ckpt-<step>`` (at most once per step) and prune beyond ``keep``; returns its store prefix.

        Blocking (the default), it returns once the checkpoint is whole in the store. With
        ``background`` it returns once the values are snapshot: the write (and the copy into
        the store) finish in other threads.
        """
        stored = join(self._directory, f"ckpt-{step}")
        if step == self.last_step:
            if not background:
                self.wait()
            return stored
        self.wait()
        began = time.monotonic()
        before = set(threading.enumerate())
        path = self._manager.save(checkpoint_number=step, options=self._options)
        writers = [thread for thread in threading.enumerate() if thread not in before]
        self.last_step = step
        self._last_time = time.monotonic()
        self._finisher = threading.Thread(
            target=self._finish, args=(path, step, writers, began), name="tpuops-checkpoint-finish"
        )
        self._finisher.start()
        if not background:
            self.wait()
        return stored

    def wait(self) -> None:
        """Wait until the last save is whole in the store; raises the error it failed with."""
        if self._finisher is not None:
            self._finisher.join()
            self._finisher = None
        if self._error is not None:
            error, self._error = self._error, None
            self.last_step = self.stored_step  # its step was not saved: saving that step again writes it
            raise error

    @property
    def every_seconds(self) -> float:
        """The periodic interval in use: fixed, or (``every: auto``) Young/Daly's for the last save's cost."""
        return self._every_seconds

    def _finish(self, path: str, step: int, writers: List[threading.Thread], began: float) -> None:
        started = time.monotonic()
        try:
            if self._on_writing is not None:
                self._on_writing(step)
            for writer in writers:  # TensorFlow's own asynchronous checkpoint writer
                writer.join()
            if not tf.io.gfile.exists(path + ".index"):
                raise RuntimeError(f"checkpoint {path} was not written; the log has the writer's error")
            if self._staging is not None:
                _remove_copy_leftovers(self._directory)
                copy_checkpoint(path, self._directory)
                prune(self._directory, self._keep)
            self.stored_step = step
            self.save_s = time.monotonic() - began
            log.info("checkpoint at step %d is in %s (%.1f s after the snapshot)", step, self._directory,
                     time.monotonic() - started)
            if self._loss_rate_per_hour is not None:
                self._every_seconds = young_daly_s(self.save_s, self._loss_rate_per_hour)
                log.info("every: auto: the save took %.1f s; saving every %.0f s", self.save_s, self._every_seconds)
            if self._on_stored is not None:
                self._on_stored(step)
        except Exception as err:  # raised in the training thread by the next save or wait()
            log.error("checkpoint at step %d failed: %s", step, err)
            self._error = err
