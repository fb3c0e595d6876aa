"""``train``: load, resume, run multi-step calls, checkpoint, evaluate, save the model.

The loop only ever stops at a call boundary. Between calls it: records progress, writes a
checkpoint when the schedule says so, evaluates every ``eval_every_steps`` and checks the
preemption notice. Call sizes are cut so that calls end on checkpoint and eval multiples;
the result of a step does not depend on which call ran it, so a resumed run (whose first
call starts at the resume step) stays bit-identical to an uninterrupted one.

After the last step: a final checkpoint (so a run killed while evaluating or saving does not
train again), the final evaluation, and the Keras SavedModel under ``runs/<run>/model``.
A preemption notice that arrives after the last step is ignored: finishing is cheaper.

Scheduled checkpoints are saved in the background (``Checkpointer.save(background=True)``): the
loop goes on once the values are snapshot, and waits only when the next save comes while the
last one is still being written. The preemption and final checkpoints are blocking: the
process does not go on (or exit) before they are whole in the store. Status
``checkpoint_in_flight`` names the save being written, ``last_checkpoint_step`` the newest one
whole in the store (set by the checkpointer's finisher thread, never before); the clock's
checkpoint segment counts only the time the loop is blocked. An attempt that fails waits for
the save in flight before it reports, so its last checkpoint is kept and named.

A run whose training loss (or a compiled model's loss or metrics) or whose evaluation becomes NaN
or infinite has diverged: the loop stops at the call where it happened, before any checkpoint of
that step, and raises ``DivergedExit`` naming the step and the last checkpoint saved before it
(exit class "diverged": the run failed, and is not retried; the same seed diverges again). The
training function is traced before the first step (``Steps.trace``), so a model that cannot be
trained on the batches (an unknown loss or metric, shapes that disagree) is a user error before
any device time; a record of the dataset that is corrupt is one too (``inputs.dataset_records``).

A step trains one global batch on any slice size: the spec's ``train.global_batch`` (else
``per_replica_batch_size`` x replicas) over ``per_replica_batch_size`` x replicas gives the
accumulation (``Runtime.batches``; a slice that cannot divide it is a user error), the stream
yields global batches positioned by ``examples_seen`` whatever the size (``inputs``), and a
replica cuts its share into micro-batches inside the step (``steps``). A resume whose global
batch differs from its checkpoint's (``examples_seen / step``) is refused (user-error): it would
be another run under the run's name. Status ``accumulation`` and ``examples_seen`` report them.

The model is driven by ``steps.Steps`` (a plain model: the spec's loss, metrics, optimizer) or
``steps.CompiledSteps`` (a model the entry point compiled: its own train_step); the data
comes from the built-in pipeline (``inputs``) or the user's ``input_fn`` (``userinput``).
Every evaluation is appended to status ``evals``, at every ``eval_every_steps`` whatever the
interruptions: a notice puts a due one off to the resumed attempt, which first evaluates its
resume step when no status holds that step's evaluation (``_eval_due``); each call's mean input wait per step goes
to status ``input_wait_ms``; where the attempt's seconds go (calls, checkpoints, evaluations,
the SavedModel) to the status clock (``timing``).
"""

import logging
import math
import time
from typing import Any, Dict, List, Optional

import tensorflow as tf

from tpuops.agent import batchnorm, entry, inputs, userinput
from tpuops.agent.checkpoints import Checkpointer, TrainState
from tpuops.agent.paths import RunPaths
from tpuops.agent.preemption import PreemptionNotice
from tpuops.agent.prefetch import Prefetch
from tpuops.agent.profiles import Profiler
from tpuops.agent.runtime import Runtime
from tpuops.agent.status import Status
from tpuops.agent.steps import CompiledSteps, Steps, make_optimizer
from tpuops.contract.exits import DivergedExit, UserError, interrupted
from tpuops.contract.runspec import RunSpec

log = logging.getLogger(__name__)

# Lets a TPU host write a SavedModel to gs:// (the TPU worker has no GCS filesystem of its own).
SAVE_OPTIONS = tf.saved_model.SaveOptions(experimental_io_device="/job:localhost")


def _epoch_size(state: TrainState, files: List[str]) -> int:
    size = int(state.epoch_size.numpy())
    if size == 0:
        size = inputs.count_records(files, "dataset.train")
        if size == 0:
            raise UserError("dataset.train: the files hold no records")
        state.epoch_size.assign(size)
        log.info("counted %d training records in %d file(s)", size, len(files))
    return size


def _scalars(writer: Any, step: int, group: str, values: Dict[str, float]) -> None:
    with writer.as_default(step=step):
        for name, value in values.items():
            tf.summary.scalar(f"{group}/{name}", value)


class _Run:
    """The state of one training attempt; ``run`` below is the only way in."""

    def __init__(self, spec: RunSpec, runtime: Runtime, status: Status, notice: PreemptionNotice, paths: RunPaths,
                 fetched: Optional[Prefetch] = None):
        self.spec = spec
        self.fetched = fetched  # its checkpoint copy is read until the first call has restored the slots
        self.tspec = spec.require_train()
        self.runtime = runtime
        self.status = status
        self.notice = notice
        self.paths = paths
        self.global_batch, self.accumulation = runtime.batches(self.tspec.per_replica_batch_size,
                                                              self.tspec.global_batch)
        self.eval_data: Any = None  # the distributed eval dataset, when there is one
        self.stream: Any = None  # the training stream's iterator, once training began
        self.window_from = 0  # the training metrics count the steps after this one (``_report``)
        self.profiler = Profiler(paths.run_dir, status.attempt, spec.heartbeat_seconds, workers=runtime.workers,
                                 on_tpu=runtime.on_tpu, at_step=self.tspec.profile_at_step,
                                 steps=self.tspec.profile_steps, total_steps=self.tspec.steps)

    # Long: the loading phase as the status reports it, one step after another (check the data, build the model
    # in the strategy's scope, restore the newest whole checkpoint); each step sets attributes the next reads.
    def load(self) -> None:
        """Check the data, build the model, restore the newest valid checkpoint."""
        spec, strategy = self.spec, self.runtime.strategy
        self.status.update(
            total_steps=self.tspec.steps,
            global_batch=self.global_batch,
            accumulation=self.accumulation,
            replicas=self.runtime.replicas,
            device=self.runtime.device,
            deterministic=self.runtime.deterministic,
        )
        self.status.set_phase("loading")
        self.train_files = inputs.list_files(spec.dataset.train, "dataset.train")
        eval_files = inputs.list_files(spec.dataset.eval, "dataset.eval") if spec.dataset.eval else []
        per_replica = self.tspec.per_replica_batch_size
        self.user_input = None
        if spec.input_fn:
            self.user_input = userinput.UserInput(spec, userinput.load(spec), self.global_batch, self.runtime.replicas)
            signature = self.user_input.input_signature(self.train_files, per_replica)
            eval_batches = self.user_input.eval_dataset(eval_files) if eval_files else None
        else:
            parser = inputs.Parser(spec.dataset, with_label=True)
            parser.check(self.train_files, "dataset.train")
            eval_batches = None
            if eval_files:
                parser.check(eval_files, "dataset.eval")
                # Evaluated a micro-batch at a time: a replica never holds more rows than it trains on.
                eval_batches = inputs.padded_batches(eval_files, spec.dataset, self.global_batch // self.accumulation,
                                                     with_label=True)
            signature = parser.input_signature(per_replica)
        if eval_batches is not None:
            self.eval_data = self.runtime.distribute(eval_batches)
        build = entry.load_entry_point(spec)
        with strategy.scope():
            self.model = entry.build_model(build, spec, signature, strategy)
            compiled = entry.is_compiled(self.model)
            optimizer = self.model.optimizer if compiled else make_optimizer(spec.hparams)
        if compiled and self.accumulation > 1:
            raise UserError(
                f"the model from {spec.entry_point} is compiled: its own train_step applies gradients every batch, "
                f"so it cannot accumulate {self.accumulation} micro-batches into train.global_batch "
                f"{self.global_batch} on {self.runtime.replicas} replicas; return an uncompiled model, or run on a "
                "slice that takes the global batch at once"
            )
        refused = None if compiled else batchnorm.refusal(self.model, spec.entry_point, self.accumulation)
        if refused:
            raise UserError(refused)
        if compiled:
            log.info(
                "compiled model: training with its own train_step, loss, metrics and %s optimizer",
                type(optimizer).__name__,
            )
            self.steps: Any = CompiledSteps(strategy, self.model)
        else:
            self.steps = Steps(strategy, self.model, optimizer, self.tspec, self.global_batch, self.accumulation)
        self.state = TrainState(with_fingerprint=self.user_input is not None)
        self.ckpt = Checkpointer(
            self.state.checkpoint(model=self.model, optimizer=optimizer),
            self.paths.ckpt,
            keep=self.tspec.keep_checkpoints,
            every_steps=self.tspec.checkpoint_every_steps,
            every_seconds=self.tspec.checkpoint_every_seconds,
            on_writing=lambda step: self.status.update(checkpoint_in_flight=step, write=True),
            on_stored=lambda step: self.status.update(last_checkpoint_step=step, checkpoint_in_flight=None,
                                                      checkpoint_every_s=self.ckpt.every_seconds,
                                                      last_save_s=self.ckpt.save_s, write=True),
            loss_rate_per_hour=self.tspec.checkpoint_loss_rate_per_hour,
            asynchronous=self.runtime.hosts == 1,
        )
        self.status.update(checkpoint_every_s=self.ckpt.every_seconds)
        resumed = self.ckpt.restore_newest(self.fetched.newest_checkpoint() if self.fetched else None)
        if resumed is None:
            log.info("fresh start at step 0")
            if self.user_input is not None and self.state.input_fingerprint is not None:
                with inputs.dataset_records("dataset.train"):
                    self.state.input_fingerprint.assign(self.user_input.fingerprint(self.train_files))
        else:
            log.info("resumed from step %d", resumed)
            self._check_global_batch(resumed)
            self.status.resumed(resumed)
        self.status.update(examples_seen=int(self.state.examples_seen.numpy()))
        self.status.clock.loaded()
        if int(self.state.step.numpy()) > self.tspec.steps:
            raise UserError(f"checkpoint step {int(self.state.step.numpy())} is beyond train.steps {self.tspec.steps}")
        if self.user_input is None:
            self.epoch_size = _epoch_size(self.state, self.train_files)
        self.writer = tf.summary.create_file_writer(self.paths.tb)

    def _check_global_batch(self, step: int) -> None:
        """Refuse to resume a checkpoint trained with another global batch (its ``examples_seen / step``).

        Every later step would see other examples and make other updates than the run started to: a
        different run under the same name. The spec's ``train.global_batch`` keeps it on any slice size.
        """
        seen = int(self.state.examples_seen.numpy())
        if step and seen != step * self.global_batch:
            trained = seen // step if seen % step == 0 else f"{seen} examples over {step} steps"
            where = (f"train.global_batch {self.global_batch}" if self.tspec.global_batch is not None else
                     f"per_replica_batch_size {self.tspec.per_replica_batch_size} x {self.runtime.replicas} replicas "
                     f"= {self.global_batch}")
            raise UserError(
                f"checkpoint ckpt-{step} was trained with global batch {trained}, this attempt's is {where}: a resume "
                f"must keep the global batch (set train.global_batch: {trained} to accumulate on this slice)"
            )

    def _train_stream(self, step: int) -> Any:
        if self.user_input is not None:
            stored = self.state.input_fingerprint
            return self.user_input.train_dataset(
                self.train_files, step, stored.numpy().decode() if stored is not None else None
            )
        return inputs.train_dataset(
            self.train_files,
            self.spec.dataset,
            self.spec.seed,
            self.global_batch,
            int(self.state.examples_seen.numpy()),
            self.epoch_size,
        )

    def _call_size(self, step: int) -> int:
        """Steps of the next call: up to the next multiple of ``steps_per_call`` (a training-metrics window's end,
        ``_report``), of the checkpoint and eval intervals and of a profile window's edge, and the last step."""
        every = self.tspec.steps_per_call
        limits = [every - step % every, self.tspec.steps - step]
        to_checkpoint = self.ckpt.steps_to_boundary(step)
        if to_checkpoint:
            limits.append(to_checkpoint)
        if self.tspec.eval_every_steps and self.eval_data is not None:
            limits.append(self.tspec.eval_every_steps - step % self.tspec.eval_every_steps)
        to_profile_edge = self.profiler.steps_to_edge(step)
        if to_profile_edge:
            limits.append(to_profile_edge)
        return min(limits)

    def train(self) -> None:
        """Run calls until the last step, or until a notice: a preemption or a stop (raises ``exits.interrupted``)."""
        step = int(self.state.step.numpy())
        if step >= self.tspec.steps:
            return
        with inputs.dataset_records("dataset.train"):  # a resumed input_fn's fingerprint reads its first batch
            dataset = self._train_stream(step)
        # Kept on the attempt, which outlives the process's last status write (``run``).
        iterator = self.stream = iter(self.runtime.distribute(dataset))
        with entry.blame_user(f"the model from {self.spec.entry_point} cannot be trained on these batches"):
            self.steps.prepare(dataset.element_spec)
            self.steps.trace(iterator)
        if self._eval_due(step) and not self.status.evaluated(step):
            self.evaluate(step)  # its record died with the last attempt (its notice came first, or its kill)
        self.status.set_phase("training")
        self.profiler.start()
        last_report = time.monotonic()
        size, elapsed = 0, 0.0
        self.window_from = step  # a new process's metrics hold nothing yet
        while step < self.tspec.steps:
            if self.notice.requested():
                self._stop_for_preemption(step)
            self.profiler.boundary(step, size, elapsed)
            size = self._call_size(step)
            if step % self.tspec.steps_per_call == 0:
                self.steps.start_window()
                self.window_from = step
            started = time.monotonic()
            with inputs.dataset_records("dataset.train"):
                waited, bad = self.steps.train_call(iterator, tf.constant(size, tf.int64))
                waited, bad = float(waited.numpy()), int(bad.numpy())
            elapsed = time.monotonic() - started
            first_step, step = step, self.state.advance(size, self.global_batch)
            self.status.update(
                step=step,
                examples_seen=int(self.state.examples_seen.numpy()),
                examples_per_sec=round(size * self.global_batch / elapsed, 1),
                input_wait_ms=round(1000.0 * waited / size, 3),
            )
            if bad >= 0:
                self._report(step)
                self._diverged(first_step + bad + 1, "the training loss")
            heartbeat = time.monotonic() - last_report >= self.spec.heartbeat_seconds
            if step == self.tspec.steps or (heartbeat and step % self.tspec.steps_per_call == 0):
                self._report(step)
                last_report = time.monotonic()
            self.status.trained(first_step, size, time.monotonic() - started, waited)
            if self.fetched is not None:  # the call created the optimizer slots: nothing reads the copy now
                self.fetched.discard()
                self.fetched = None
            if self.ckpt.due(step):
                self.checkpoint(step, background=True)
            if self._eval_due(step) and not self.notice.requested():
                self.evaluate(step)
        self.profiler.end(step)

    def _eval_due(self, step: int) -> bool:
        """True at an evaluation step before the last (``finish`` evaluates the last).

        A pending notice puts a due evaluation off to the attempt that resumes from this step's checkpoint: the
        grace is spent on the save. That attempt evaluates first whatever step it resumes at whose evaluation
        no status holds (a kill between the checkpoint and the status write loses it too), so a recovered run
        has every evaluation an uninterrupted one has, of the same weights.
        """
        every = self.tspec.eval_every_steps
        return bool(every) and step % every == 0 and 0 < step < self.tspec.steps

    def _report(self, step: int) -> None:
        """The training metrics over the window's steps, ``window_from`` + 1 to ``step``, to status (with those two
        steps), TensorBoard and the log.

        A window is the ``steps_per_call`` steps up to a multiple of it (``Steps.start_window``): which steps a
        value averages never depends on the clock, so a slice and one host report the same quantity at the same
        step, and so do a fast attempt and a slow one. It starts later only in an attempt that resumed off that
        grid, and, for a compiled model, after an evaluation, which resets the model's one set of metrics. The
        loop reports a whole window, at its end, once per heartbeat (every read is a host round trip the steps
        wait behind), and the last step's, whatever the heartbeat.
        """
        metrics = self.steps.train_metrics.results()
        self.status.set_metrics("train", dict(metrics, first_step=self.window_from + 1, step=step))
        _scalars(self.writer, step, "train", metrics)
        log.info("step %d/%d train (steps %d-%d) %s", step, self.tspec.steps, self.window_from + 1, step, metrics)

    def checkpoint(self, step: int, background: bool = False) -> None:
        """Save at ``step``; blocking, it returns once the checkpoint is whole in the store.

        In the background the loop is blocked only for the snapshot (and for the save before
        it, if that is still being written), so the phase stays "training"; the clock counts
        only the blocked time either way. A blocking save is the last thing the loop does
        (preemption, the end), so its phase "checkpointing" is left to the next phase.
        """
        with self.status.clock.timed("checkpoint"):
            if not background:
                self.status.set_phase("checkpointing")
            self.ckpt.save(step, background=background)

    def abandon(self) -> None:
        """Wait for the save in flight so that it is kept and named; its error is logged, not raised.

        For an attempt that fails, and before the preemption save, which replaces a failed one.
        """
        try:
            self.ckpt.wait()
        except Exception:
            log.warning("the checkpoint in flight failed as well", exc_info=True)
        self.status.update(checkpoint_in_flight=None)

    def _stop_for_preemption(self, step: int) -> None:
        log.warning("preemption notice (%s) at step %d", self.notice.reason, step)
        self.profiler.abandon(step, f"preempted at step {step}")
        if step > 0:
            # A background save that failed is logged, not fatal here: this blocking save, even of
            # the same step, replaces it, and the attempt ends "preempted" as the notice says.
            self.abandon()
            self.checkpoint(step)
        self.writer.flush()  # the process ends without tearing anything down (job.run)
        raise interrupted(self.notice.stopped, self.notice.reason,
                          f"at step {step}; last checkpoint at step {self.ckpt.stored_step}")

    def _diverged(self, step: int, what: str) -> None:
        """Stop the run: ``what`` was NaN or infinite at ``step``; name the last checkpoint saved before it."""
        self.abandon()  # the save in flight is of a step before this one: it is kept and named
        stored = self.ckpt.stored_step
        good = f"last good checkpoint: step {stored} (ckpt-{stored})" if stored is not None else \
            "no checkpoint was saved before it"
        self.writer.flush()
        raise DivergedExit(f"training diverged: {what} was NaN or infinite at step {step}; {good}")

    def evaluate(self, step: int) -> None:
        if self.eval_data is None:
            return
        with self.status.clock.timed("eval"):
            self.status.set_phase("evaluating")
            with entry.blame_user(f"the model from {self.spec.entry_point} cannot be evaluated on dataset.eval"), \
                    inputs.dataset_records("dataset.eval"):
                results = self.steps.evaluate(self.eval_data, self.tspec.eval_steps)
            if self.steps.train_metrics is self.steps.eval_metrics:  # a compiled model's: evaluate reset them
                self.window_from = step
            log.info("eval at step %d: %s", step, results)
            self.status.set_metrics("eval", dict(results, step=step))
            self.status.add_eval(step, results)
            _scalars(self.writer, step, "eval", results)
            bad = sorted(name for name, value in results.items() if not math.isfinite(value))
            if bad:
                self._diverged(step, "the evaluation's " + ", ".join(bad))
            if step < self.tspec.steps:
                self.status.set_phase("training")

    def finish(self) -> None:
        """Final checkpoint, final evaluation, SavedModel."""
        step = int(self.state.step.numpy())
        self.checkpoint(step)  # waits for the save in flight, even one at this step
        self.evaluate(step)
        self.writer.flush()
        self.status.set_phase("saving")
        with self.status.clock.timed("save"):
            if tf.io.gfile.exists(self.paths.model):
                tf.io.gfile.rmtree(self.paths.model)
            self.model.save(self.paths.model, include_optimizer=False, options=SAVE_OPTIONS)
        log.info("model saved to %s", self.paths.model)


def run(spec: RunSpec, runtime: Runtime, status: Status, notice: PreemptionNotice, paths: RunPaths,
        fetched: Optional[Prefetch] = None) -> _Run:
    """Train the run described by ``spec`` to its last step; ``fetched``: see ``prefetch``.

    Returns the attempt for the caller to keep until the process ends (``job.run``): dropping it
    tears down the endless training stream, whose background threads take from a fraction of a
    second to 17 s to stop on a loaded host (measured), all of it billed before the status is final.
    """
    attempt = _Run(spec, runtime, status, notice, paths, fetched)
    attempt.load()
    try:
        attempt.train()
        attempt.finish()
    except BaseException as exc:
        attempt.profiler.abandon(int(attempt.state.step.numpy()), f"the attempt ended: {type(exc).__name__}")
        attempt.abandon()
        raise
    return attempt
