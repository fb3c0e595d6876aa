"""tpuops_helper: preemption-proof checkpoints and progress reports for your own Keras script.

In script mode the agent puts this file's directory on ``PYTHONPATH``; it needs TensorFlow 2.9
and the standard library only (no other tpuops code), so it can also be copied next to a script.
Two lines in a ``model.fit`` script::

    import tpuops_helper

    ckpt = tpuops_helper.StepCheckpoint(model, steps_per_epoch=STEPS)  # restores the newest checkpoint
    model.fit(ckpt.resume(train_ds), epochs=EPOCHS, steps_per_epoch=STEPS, initial_epoch=ckpt.initial_epoch,
              callbacks=[ckpt, tpuops_helper.StatusReporter()])

``StepCheckpoint`` saves model, optimizer and the step every N steps, every T seconds (the
run's ``TPUOPS_CHECKPOINT_EVERY_STEPS`` / ``_SECONDS``), on the preemption notice and at the
end, to ``TPUOPS_CHECKPOINT_DIR``; TF 2.9's ``BackupAndRestore`` saves at epoch ends only.
The notice is SIGTERM, which the agent also sends when the metadata server's preempted flag
turns TRUE: the callback saves at the next batch end and exits with code 143.

A checkpoint is written only while the batch's logs are finite: at a save, a loss or metric
that is NaN or infinite stops ``model.fit`` instead (the run diverged; the agent reports it from
the ``StatusReporter``'s report), so the newest checkpoint is the last good one. The check is
made only at a save, which syncs with the device anyway.

Resume is exact in steps: construction restores the newest checkpoint; ``resume(dataset)``
skips the batches already trained (give it an endless, deterministically shuffled dataset,
e.g. ``shuffle(n, seed=s).repeat().batch(b, drop_remainder=True)``), ``initial_epoch`` starts
fit in the epoch the checkpoint is in, and training stops at ``epochs x steps_per_epoch``
optimizer steps. After a resume mid-epoch the epoch boundaries are shifted by the resumed
partial epoch; the last epoch ends early by as much, so the run's total steps are exact.

``StatusReporter`` writes step, metrics, evaluations and the last checkpoint to
``TPUOPS_REPORT_FILE`` at most every ``TPUOPS_HEARTBEAT_SECONDS`` (default 10) and at
evaluation and train end; the agent merges it into the run's ``status.json`` (``tpuops
status``, hang detection, sweeps). The step is the optimizer's ``iterations``. Neither
callback forces a device sync per batch (``_supports_tf_logs``): their cost is a Python call
per batch. Outside tpuops (no environment) the reporter does nothing.
"""

import json
import math
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional

import tensorflow as tf

PREEMPTED_EXIT = 143
_REPORT: Dict[str, Any] = {"evals": []}


def _write_report() -> None:
    path = os.environ.get("TPUOPS_REPORT_FILE")
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        json.dump(_REPORT, out)
    os.replace(tmp, path)


def _setting(given: Any, variable: str, default: str) -> str:
    return str(given) if given is not None else os.environ.get(variable, default)


def _floats(logs: Optional[Dict[str, Any]]) -> Dict[str, float]:
    return {name: float(value) for name, value in (logs or {}).items()}


class StepCheckpoint(tf.keras.callbacks.Callback):
    """Checkpoints every N steps / T seconds / on SIGTERM and restores the newest at construction."""

    def __init__(
        self,
        model: tf.keras.Model,
        steps_per_epoch: int,
        directory: Optional[str] = None,
        every_steps: Optional[int] = None,
        every_seconds: Optional[float] = None,
        keep: Optional[int] = None,
    ) -> None:
        super().__init__()
        self._supports_tf_logs = True
        directory = directory or os.environ.get("TPUOPS_CHECKPOINT_DIR")
        if not directory:
            raise ValueError("StepCheckpoint needs a directory (or TPUOPS_CHECKPOINT_DIR)")
        self._every_steps = int(_setting(every_steps, "TPUOPS_CHECKPOINT_EVERY_STEPS", "1000"))
        self._every_seconds = float(_setting(every_seconds, "TPUOPS_CHECKPOINT_EVERY_SECONDS", "600"))
        keep = int(_setting(keep, "TPUOPS_KEEP_CHECKPOINTS", "3"))
        self._steps_per_epoch = steps_per_epoch
        self._step_variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="tpuops_step")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, step=self._step_variable)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, directory, max_to_keep=keep, checkpoint_name="ckpt"
        )
        self._preempted = False
        self._stopped = False  # the run diverged: its weights are never saved again
        self.step = self._restore_newest()
        self.restored_step = self.step
        self.initial_epoch = self.step // steps_per_epoch
        self._saved_step = self.step
        self._saved_at = time.monotonic()
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _restore_newest(self) -> int:
        for path in reversed(self._manager.checkpoints):
            try:
                self._checkpoint.restore(path)
            except (tf.errors.OpError, ValueError) as err:
                print(f"tpuops_helper: cannot restore {path} ({type(err).__name__}); trying an older one", flush=True)
                continue
            step = int(self._step_variable.numpy())
            print(f"tpuops_helper: resumed from {path} at step {step}", flush=True)
            _REPORT.update(last_checkpoint_step=step, resumed_from_step=step)
            return step
        return 0

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._preempted = True

    def resume(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """``dataset`` without the batches the restored step already trained on."""
        return dataset.skip(self.restored_step) if self.restored_step else dataset

    def save(self) -> None:
        if self.step == self._saved_step or self._stopped:
            return
        self._step_variable.assign(self.step)
        path = self._manager.save(checkpoint_number=self.step)
        self._saved_step, self._saved_at = self.step, time.monotonic()
        _REPORT["last_checkpoint_step"] = self.step
        _write_report()
        print(f"tpuops_helper: checkpoint {path}", flush=True)

    def _diverged(self, logs: Any) -> bool:
        """True (and fit stops) when a value of ``logs`` is NaN or infinite: the weights are not saved."""
        values = _floats(logs)
        if all(math.isfinite(value) for value in values.values()):
            return False
        print(f"tpuops_helper: diverged at step {self.step} ({values}): stopping, not checkpointing", flush=True)
        self.model.stop_training = True
        _REPORT.setdefault("metrics", {})["train"] = values
        _REPORT["step"] = self.step
        _write_report()
        return True

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.step += 1
        total = self.params.get("epochs", 0) * self._steps_per_epoch
        last = bool(total) and self.step >= total
        due = self._preempted or last or bool(self._every_steps and self.step % self._every_steps == 0) or bool(
            self._every_seconds and time.monotonic() - self._saved_at >= self._every_seconds)
        if not due:
            return
        if self._diverged(logs):
            self._stopped = True  # nothing more is saved, on_train_end included
        else:
            self.save()
        if self._preempted:
            print(f"tpuops_helper: preemption notice: checkpointed at step {self._saved_step}, exiting", flush=True)
            sys.exit(PREEMPTED_EXIT)
        if last:
            self.model.stop_training = True

    def on_train_end(self, logs: Any = None) -> None:
        self.save()


class StatusReporter(tf.keras.callbacks.Callback):
    """Reports step, metrics and evaluations to the agent (``TPUOPS_REPORT_FILE``)."""

    def __init__(self, every_seconds: Optional[float] = None) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._every = float(_setting(every_seconds, "TPUOPS_HEARTBEAT_SECONDS", "10"))
        self._last = 0.0

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _report(self, group: str, logs: Any) -> None:
        metrics: Dict[str, Any] = dict(_REPORT.get("metrics") or {})
        metrics[group] = _floats(logs)
        _REPORT.update(step=self._step(), metrics=metrics)
        _write_report()
        self._last = time.monotonic()

    def on_train_begin(self, logs: Any = None) -> None:
        steps = self.params.get("steps")
        if steps:
            _REPORT["total_steps"] = steps * self.params.get("epochs", 1)
        self._report("train", {})

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if time.monotonic() - self._last >= self._every:
            self._report("train", logs)

    def on_test_end(self, logs: Any = None) -> None:
        values = _floats(logs)
        evals: List[Dict[str, Any]] = [e for e in _REPORT["evals"] if e["step"] < self._step()]
        _REPORT["evals"] = [*evals, {"step": self._step(), "metrics": values}]
        self._report("eval", values)

    def on_train_end(self, logs: Any = None) -> None:
        self._report("train", logs)
