"""``infer``: batch prediction over TFRecords into sharded JSON Lines and a manifest.

The model comes from ``infer.model``: a Keras SavedModel directory (``saved_model.pb``), or a
checkpoint directory, in which case the entry point builds the model and the newest valid
checkpoint (``checkpoints.newest_valid``) fills in its weights.

Outputs, under ``output_prefix`` (default ``runs/<run>/predictions``):

* ``predictions-SSSSS-of-NNNNN.jsonl``: one JSON object per example,
  ``{"index": i, "output": [...]}`` where ``i`` is the example's position in the sorted input
  files and ``output`` the model's output row as floats, each written as the shortest text that
  reads back as the same float32 (``0.1``, not ``0.10000000149011612``); a NaN or an infinity,
  which JSON cannot hold, is ``null``. Shard ``s`` holds the batches
  ``[s * nb // N, (s + 1) * nb // N)`` of the ``nb`` batches, so shards are contiguous index
  ranges in shard order and lines within a shard are in ascending ``index``. JSON Lines, not
  TFRecords, because the control plane reads results without TensorFlow.
* ``manifest.json``, written last and whole: ``{"run_id", "format": "jsonl", "model",
  "inputs": [files], "shards": [{"path": name, "count": n}], "total": n, "created"}``.
* ``plan.json``: what identifies the job, so that a rerun can keep finished shards (below).

Where the time goes, and why the loop looks the way it does (``bench/bench_infer.py``):

* On the CPU the forward pass runs as a plain TensorFlow graph: TF 2.9's XLA:CPU convolutions
  are 2-3x slower than its oneDNN kernels. On a TPU ``strategy.run`` compiles it with XLA,
  which the TPU requires.
* One ``tf.function`` call predicts up to ``CALL_EXAMPLES`` examples: the iterator is read
  inside the function and the outputs collected in a TensorArray, so the host pays one round
  trip per call, not one per batch. Latency mode (``infer.latency``, ``tpuops infer --latency``)
  is the exception: one batch per call, so that each batch's results reach the writer as soon
  as they exist instead of after up to ``CALL_EXAMPLES`` examples (at batch 64, a batch's
  results came about 170 ms late on this CPU), through the cheapest dispatch there is
  (``latency_predictor``): a batch already in memory is the traced function's argument, an
  iterator is closed over.
  Batches are padded to one static size (one compilation); the number of real rows comes from
  the record count, never from a mask read back per batch.
* The batches are read, parsed and padded ahead, in tf.data's threads, while the model works
  (``inputs.padded_batches``): the next batch is ready when the model is. In latency mode
  off a TPU the whole input is read and parsed before the first batch instead (``preload``,
  up to PRELOAD_LIMIT_BYTES, one tensor per batch), so that tf.data's threads do not take the
  cores from the model while a batch is being predicted.
* A writer thread turns a call's output into JSON with one orjson call (not one per example;
  a tenth of the ``json`` module's CPU for float32 rows, which it formats as float64 reprs) and
  writes it. The loop hands outputs over through a bounded queue, so the device waits for
  the writer only when the store stays slower than the device for longer than the queue holds.
  orjson is the one package the agent needs beyond TF 2.9, and only here: it is imported when
  an ``infer`` job starts (``require_orjson``), so a training VM never needs it.
  In latency mode the writer runs at idle priority (``SCHED_IDLE`` on Linux, ``yield_cpu``):
  it takes only the CPU that the model leaves idle, so on a CPU the next batch's prediction is
  not slowed by the text of the one before (about 2 % of a batch of 64's time-to-result on this
  2-core CPU, ``bench/bench_infer.py --only latency``). A VM's host has idle cores to spare; on
  a CPU kept busy by other processes the writer falls behind until the queue is full, and the
  loop then waits for it; the loop can also wait for the GIL while the writer, holding it for
  the tens of microseconds a batch's text takes, waits for a CPU.

Invariants that make an interrupted job resumable without redoing finished shards:

1. ``plan.json`` is written whole before any shard: the input files with their byte sizes, the
   record total, the model (source and a sha256 of its index files, which checksum every
   tensor), the batch size, the number of shards and how floats are written (``TEXT``).
2. A shard under its final name is complete: it is written as ``<name>.tmp-<pid>`` and
   renamed once its last line is written. Temporary files of dead attempts are removed.
3. Every shard under its final name belongs to the plan in ``plan.json``: a job whose plan
   differs first removes ``manifest.json``, then the old plan's shards, and only then writes
   its own plan.
4. ``manifest.json`` is written last, when every shard of the plan is complete; shards without
   a manifest are an unfinished job.

A preemption notice stops the loop at the next call boundary (exit class "preempted"); the
writer first finishes the shards whose rows are all queued. A rerun with the same plan keeps
the complete shards and predicts from the first missing one: shards complete in order, so the
complete ones are a prefix (a later shard found after a missing one is written again).
"""

import concurrent.futures
import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tpuops.agent import checkpoints, entry, inputs
from tpuops.agent.paths import RunPaths, join, write_whole
from tpuops.agent.preemption import PreemptionNotice
from tpuops.agent.runtime import Runtime
from tpuops.agent.status import Status, utc_now
from tpuops.contract.exits import UserError, interrupted
from tpuops.contract.runspec import RunSpec

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PLAN = "plan.json"
TEXT = "shortest-float32"
"""How the shards write floats (``plan.json`` key ``text``): shards of another plan, or of an older
agent that wrote float64 reprs, are never kept beside these."""
# Examples per tf.function call: ~0.3 s of CPU work, a few ms on a TPU; a preemption notice
# waits at most one call.
CALL_EXAMPLES = 4096
# Latency mode off a TPU reads its whole input ahead when the parsed inputs take at most
# this much memory (``preload``): 10,240 CIFAR images as float32 are 126 MB.
PRELOAD_LIMIT_BYTES = 512 << 20
# Calls whose outputs may wait for the writer before the loop blocks.
WRITER_QUEUE = 4
# A shard, or (group 1 set) the temporary file of one being written.
_SHARD_FILE = re.compile(r"^predictions-\d{5}-of-\d{5}\.jsonl(\.tmp-\d+)?$")


def shard_name(index: int, count: int) -> str:
    return f"predictions-{index:05d}-of-{count:05d}.jsonl"


def _sha256(paths: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path, "rb") as src:
                digest.update(src.read())
    return digest.hexdigest()


def load_model(spec: RunSpec, runtime: Runtime, source: str) -> Tuple[tf.keras.Model, Dict[str, str]]:
    """The Keras model in ``source`` (a SavedModel dir, or a checkpoint dir plus the entry point) and its identity."""
    with runtime.strategy.scope():
        if tf.io.gfile.exists(join(source, "saved_model.pb")):
            identity = _sha256([join(source, "saved_model.pb"), join(source, "variables", "variables.index")])
            return tf.keras.models.load_model(source, compile=False), {"source": source, "sha256": identity}
        found = checkpoints.newest_valid(source)
        if found is None:
            raise UserError(f"infer.model: {source} holds neither a SavedModel nor a valid checkpoint")
        parser = inputs.Parser(spec.dataset, with_label=False)
        model = entry.build_model(entry.load_entry_point(spec), spec, parser.input_signature(1), runtime.strategy)
    tf.train.Checkpoint(model=model).restore(found[1]).expect_partial()
    log.info("model restored from checkpoint %s (step %d)", found[1], found[0])
    return model, {"source": source, "checkpoint": found[1], "sha256": _sha256([found[1] + ".index"])}


def _forward(model: tf.keras.Model, jit_compile: bool) -> Any:
    """The replica function: the model's float32 outputs for one batch (XLA-compiled if ``jit_compile``)."""

    def forward(batch: Any) -> tf.Tensor:
        return tf.cast(model(batch, training=False), tf.float32)

    return tf.function(forward, jit_compile=True) if jit_compile else forward


def predict_call(model: tf.keras.Model, strategy: Any, jit_compile: bool) -> Any:
    """``call(iterator, steps)``: the float32 outputs of the next ``steps`` batches, concatenated.

    ``iterator`` yields ``(inputs, mask)`` as ``inputs.padded_batches`` makes them (distributed
    by ``strategy`` on a TPU). ``steps`` is an int32 tensor, so a short call does not retrace.
    """
    replica_fn = _forward(model, jit_compile)

    @tf.function
    def call(iterator: Any, steps: tf.Tensor) -> tf.Tensor:
        outputs = tf.TensorArray(tf.float32, size=steps)
        for step in tf.range(steps):
            batch = next(iterator)[0]
            outputs = outputs.write(step, strategy.gather(strategy.run(replica_fn, args=(batch,)), axis=0))
        return outputs.concat()

    return call


def batched_predictor(call: Any, iterator: Any) -> Callable[[int], Any]:
    """``predict(steps)`` for ``predict_shards``: one ``predict_call`` call over the next ``steps`` batches."""
    return lambda steps: call(iterator, tf.constant(steps, tf.int32))


def preload(iterator: Any, batches: int, limit: int = PRELOAD_LIMIT_BYTES) -> Optional[List[Any]]:
    """The inputs of the iterator's next ``batches`` batches, one per batch; None above ``limit``.

    For latency mode off a TPU: read and parsed in one go before the first batch, the
    batches no longer pass through tf.data's threads while the model works on the same cores
    (at batch 64 on this 2-core CPU, p50 time-to-result 1.20 -> 1.10x a plain ``tf.function``
    on pre-batched tensors, ``bench/bench_infer.py --only latency``). One tensor per batch, so
    that each is the traced function's argument as it is in a plain loop (docs/benchmarks.md, "Inference").
    The size is known before reading: ``batches`` times one batch's inputs, from the iterator's element spec (static:
    ``inputs.padded_batches`` pads every batch to one size).
    """
    spec = tf.nest.flatten(iterator.element_spec[0])
    if batches < 1 or not all(part.shape.is_fully_defined() for part in spec):
        return None
    if batches * sum(part.shape.num_elements() * part.dtype.size for part in spec) > limit:
        return None
    return [next(iterator)[0] for _ in range(batches)]


def latency_predictor(
    model: tf.keras.Model, strategy: Any, jit_compile: bool, source: Any, preloaded: bool = False
) -> Callable[[int], Any]:
    """``predict(1)`` for latency mode: the next batch's float32 outputs, one call per batch.

    ``source`` is the iterator, or (``preloaded``) what ``preload`` returned. Preloaded, each
    batch is passed to the traced function as its argument, as a plain loop over batches in
    memory does. From an iterator, the function closes over it and takes no argument: a
    ``tf.function`` taking an iterator works out the iterator's type spec and flattens it on
    every call, about 0.2 ms of host time per batch on this CPU, a twentieth of a batch of 64's
    time-to-result (``bench/bench_infer.py --only latency``). The function is traced here, once
    per job, so the first batch does not wait for the tracing, and each batch calls the traced
    concrete function itself: ``tf.function``'s own call (matching the arguments against its
    traces) took about 4 % of a batch of 64's time here. Preloaded, ``jit_compile`` compiles the
    whole per-batch function with XLA, not a function nested in it (an extra call per batch,
    about 1 %); from an iterator only the model's call is compiled (the iterator's ops are not
    XLA's). On a TPU ``strategy.run`` compiles it and ``infer`` passes False.
    """
    if preloaded:
        predict_batch = _replicated(strategy, _forward(model, False))
        batches = iter(source)
        call = tf.function(predict_batch, jit_compile=jit_compile or None).get_concrete_function(source[0])
        return lambda steps: call(next(batches))
    predict_batch = _replicated(strategy, _forward(model, jit_compile))
    next_batch = tf.function(lambda: predict_batch(next(source)[0])).get_concrete_function()
    return lambda steps: next_batch()


def _replicated(strategy: Any, replica_fn: Any) -> Callable[[Any], tf.Tensor]:
    """``replica_fn`` run on every replica of ``strategy``, its outputs gathered in replica order."""
    return lambda batch: strategy.gather(strategy.run(replica_fn, args=(batch,)), axis=0)


def format_lines(first_index: int, rows: np.ndarray) -> bytes:
    """JSON Lines for ``rows`` numbered from ``first_index``: floats as their shortest float32 text, NaN as null."""
    import orjson  # here, not at the top: only infer needs it (require_orjson), a training VM may lack it

    rows = np.ascontiguousarray(rows)
    if rows.ndim == 2 and rows.size:
        # One encoder call for the whole batch: the rows of a 2-D float array hold only numbers,
        # so "],[" is exactly what separates them.
        template = b'{"index": %d, "output": [%s]}\n'
        values = orjson.dumps(rows, option=orjson.OPT_SERIALIZE_NUMPY)[2:-2].split(b"],[")
    else:
        template = b'{"index": %d, "output": %s}\n'
        values = [orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) for row in rows]
    # One formatting call for every line: the writer holds the GIL for as short a time as it can.
    arguments: List[Any] = [None] * (2 * len(values))
    arguments[0::2], arguments[1::2] = range(first_index, first_index + len(values)), values
    return (template * len(values)) % tuple(arguments)


def require_orjson() -> None:
    """Raise UserError, saying what to do, when orjson is not installed: ``infer`` writes its text with it."""
    try:
        import orjson  # noqa: F401
    except ImportError:
        raise UserError(
            "infer writes its JSON Lines with orjson, which this Python lacks: the startup script installs "
            "the agent pins of requirements-tf29.txt from PyPI (its log says why it could not); give the VM "
            "access to PyPI, or use an image or runtime that has orjson"
        ) from None


def yield_cpu() -> None:
    """Let the calling thread run only on CPU that nothing else wants (Linux ``SCHED_IDLE``); elsewhere a no-op.

    Per thread: Linux schedules threads, and pid 0 means the caller. A refusal (a seccomp
    profile, a kernel without the policy) leaves the thread as it was.
    """
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None:
        return
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError as err:
        log.debug("the writer keeps its CPU priority: %s", err)


class ShardWriter:
    """A thread that writes shards from a bounded queue of call outputs, in order.

    ``open``, ``rows`` and ``commit`` only queue work; the first write error is raised by the
    next of them (or by ``close``) in the caller's thread. ``close`` waits until the queue is
    empty: shards whose ``commit`` was queued are renamed into place, a shard still open is
    removed. ``idle``: the thread runs at idle priority (``yield_cpu``).
    """

    def __init__(self, prefix: str, depth: int = WRITER_QUEUE, idle: bool = False) -> None:
        self._prefix = prefix
        self._idle = idle
        self._queue: queue.Queue[Optional[Tuple[Any, ...]]] = queue.Queue(depth)
        self._error: Optional[BaseException] = None
        self._file: Any = None
        self._name = ""
        self._thread = threading.Thread(target=self._run, name="tpuops-infer-writer", daemon=True)
        self._thread.start()

    def open(self, name: str) -> None:
        self._put(("open", name))

    def rows(self, outputs: Any, first_index: int, count: int) -> None:
        """Queue the first ``count`` rows of ``outputs`` (a tensor or an array), numbered from ``first_index``."""
        self._put(("rows", outputs, first_index, count))

    def commit(self) -> None:
        self._put(("commit",))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _put(self, item: Tuple[Any, ...]) -> None:
        self._raise()
        self._queue.put(item)

    def _tmp(self) -> str:
        return join(self._prefix, f"{self._name}.tmp-{os.getpid()}")

    def _run(self) -> None:
        if self._idle:
            yield_cpu()
        while True:
            item = self._queue.get()
            if item is None:
                break
            if self._error is None:
                try:
                    self._handle(item)
                except Exception as err:  # reported in the caller's thread; the queue keeps draining
                    self._error = err
        self._discard()

    def _handle(self, item: Tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "open":
            self._name = item[1]
            self._file = tf.io.gfile.GFile(self._tmp(), "wb")
            self._file.write(b"")  # GFile creates the file on the first write; an empty shard is a file too
        elif kind == "rows":
            outputs, first_index, count = item[1:]
            rows = outputs.numpy() if hasattr(outputs, "numpy") else np.asarray(outputs)
            self._file.write(format_lines(first_index, rows[:count]))
        else:
            self._file.close()
            self._file = None
            tf.io.gfile.rename(self._tmp(), join(self._prefix, self._name), overwrite=True)

    def _discard(self) -> None:
        if self._file is None:
            return
        try:
            self._file.close()
            tf.io.gfile.remove(self._tmp())
        except tf.errors.OpError as err:
            log.warning("could not remove the unfinished shard %s: %s", self._tmp(), err.message)
        self._file = None


def shard_batches(batches: int, shards: int) -> List[Tuple[int, int]]:
    """The batch range ``[first, end)`` of each shard: contiguous, in order, sizes differing by at most one."""
    return [(s * batches // shards, (s + 1) * batches // shards) for s in range(shards)]


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with tf.io.gfile.GFile(path) as src:
            value = json.loads(src.read())
    except (tf.errors.NotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def describe_inputs(files: Sequence[str], previous: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The files with their byte sizes and the record total; the total is counted once per set of files."""
    described = [{"path": path, "bytes": int(tf.io.gfile.stat(path).length)} for path in files]
    if previous and previous.get("inputs") == described and isinstance(previous.get("total"), int):
        return {"inputs": described, "total": previous["total"]}
    return {"inputs": described, "total": inputs.count_records(files, "infer.input")}


class Outputs:
    """The output prefix of one job: its plan, shard names and ranges, which shards are complete, the manifest."""

    def __init__(self, prefix: str, plan: Dict[str, Any]) -> None:
        self.prefix = prefix
        self.plan = plan
        self.batch, self.total, count = plan["batch_size"], plan["total"], plan["num_shards"]
        self.names = [shard_name(i, count) for i in range(count)]
        self.ranges = shard_batches(-(-self.total // self.batch), count)
        self.counts = [self.examples_before(end) - self.examples_before(first) for first, end in self.ranges]

    def examples_before(self, batch: int) -> int:
        """How many examples the batches before ``batch`` hold."""
        return min(batch * self.batch, self.total)

    def adopt(self) -> int:
        """Make the prefix this plan's (invariants 2 and 3); returns how many leading shards are complete."""
        tf.io.gfile.makedirs(self.prefix)
        previous = _read_json(join(self.prefix, PLAN))
        names = [name.rstrip("/") for name in tf.io.gfile.listdir(self.prefix)]
        same = previous == self.plan
        if not same and MANIFEST in names:
            tf.io.gfile.remove(join(self.prefix, MANIFEST))
        for name in names:
            match = _SHARD_FILE.match(name)
            if match and (match.group(1) or not same):
                tf.io.gfile.remove(join(self.prefix, name))
        if not same:
            write_whole(join(self.prefix, PLAN), json.dumps(self.plan, indent=1))
            return 0
        done = 0
        while done < len(self.names) and self.names[done] in names:
            done += 1
        return done

    def write_manifest(self, run_id: str) -> None:
        manifest = {
            "run_id": run_id,
            "format": "jsonl",
            "model": self.plan["model"]["source"],
            "inputs": [described["path"] for described in self.plan["inputs"]],
            "shards": [{"path": name, "count": count} for name, count in zip(self.names, self.counts)],
            "total": self.total,
            "created": utc_now(),
        }
        write_whole(join(self.prefix, MANIFEST), json.dumps(manifest, indent=1))


def batches_per_call(batch: int, latency: bool) -> int:
    """Batches one prediction call takes: one in latency mode, else about CALL_EXAMPLES examples' worth."""
    return 1 if latency else max(1, CALL_EXAMPLES // batch)


def predict_shards(
    predict: Callable[[int], Any],
    outputs: Outputs,
    first_shard: int,
    notice: PreemptionNotice,
    progress: Any = None,
    latency: bool = False,
) -> None:
    """Predict the shards from ``first_shard`` on and write them; ``predict`` starts at that shard's first batch.

    ``predict(steps)`` returns the outputs of the next ``steps`` batches (``batched_predictor``,
    or ``latency_predictor``, which is only ever asked for one). ``progress(n)`` is told the
    number of examples before the next one to predict. A preemption notice raises
    PreemptedExit at the next call boundary, after the writer is done.
    """
    per_call = batches_per_call(outputs.batch, latency)
    writer = ShardWriter(outputs.prefix, idle=latency)
    try:
        for shard in range(first_shard, len(outputs.names)):
            first, end = outputs.ranges[shard]
            writer.open(outputs.names[shard])
            while first < end:
                if notice.requested():
                    raise interrupted(notice.stopped, notice.reason, f"in shard {shard + 1} of {len(outputs.names)}")
                steps = min(per_call, end - first)
                start = outputs.examples_before(first)
                rows = outputs.examples_before(first + steps) - start
                writer.rows(predict(steps), start, rows)
                first += steps
                if progress is not None:
                    progress(outputs.examples_before(first))
            writer.commit()
    finally:
        writer.close()


class _Progress:
    """Told after every prediction call: the examples done go to status, the call's time to its clock."""

    def __init__(self, status: Status) -> None:
        self._status = status
        self._last = time.monotonic()

    def __call__(self, predicted: int) -> None:
        now = time.monotonic()
        self._status.clock.worked(now - self._last)
        self._last = now
        self._status.update(metrics={"predicted": predicted})


def run(spec: RunSpec, runtime: Runtime, status: Status, notice: PreemptionNotice, paths: RunPaths) -> None:
    """Predict over ``infer.input`` and write the shards, then the manifest (see the module docstring)."""
    ispec = spec.require_infer()
    require_orjson()
    status.update(
        device=runtime.device,
        deterministic=runtime.deterministic,
        replicas=runtime.replicas,
        global_batch=ispec.batch_size,
    )
    status.set_phase("loading")
    files = inputs.list_files(ispec.input, "infer.input")
    parser = inputs.Parser(spec.dataset, with_label=False)
    parser.check(files, "infer.input")
    prefix = ispec.output_prefix or paths.predictions
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        described = pool.submit(describe_inputs, files, _read_json(join(prefix, PLAN)))  # while the model loads
        model, identity = load_model(spec, runtime, ispec.model)
        # As in training: a model that does not take the input's features fails before any prediction.
        entry.check_accepts(model, parser.input_signature(max(1, ispec.batch_size // runtime.replicas)),
                            runtime.strategy, f"infer.model {ispec.model}")
        status.clock.loaded()
        plan = dict(described.result(), model=identity, batch_size=ispec.batch_size, num_shards=ispec.num_shards,
                    text=TEXT)
    outputs = Outputs(prefix, plan)
    done = outputs.adopt()
    predicted = outputs.examples_before(outputs.ranges[done][0]) if done < len(outputs.names) else outputs.total
    if done:
        log.info("%d of %d shard(s) already under %s: not predicting them again", done, len(outputs.names), prefix)
    status.set_phase("predicting")
    status.update(metrics={"predicted": predicted})
    if done < len(outputs.names):
        batches = inputs.padded_batches(files, spec.dataset, ispec.batch_size, with_label=False)
        batches = batches.skip(outputs.ranges[done][0])
        if runtime.on_tpu:
            batches = runtime.distribute(batches)
        iterator = iter(batches)
        if ispec.latency:
            left = outputs.ranges[-1][1] - outputs.ranges[done][0]
            preloaded = None if runtime.on_tpu else preload(iterator, left)
            source = iterator if preloaded is None else preloaded
            predict = latency_predictor(model, runtime.strategy, False, source, preloaded=preloaded is not None)
        else:
            predict = batched_predictor(predict_call(model, runtime.strategy, jit_compile=False), iterator)
        predict_shards(predict, outputs, done, notice, _Progress(status), ispec.latency)
    with status.clock.timed("save"):
        outputs.write_manifest(spec.run_id)
    log.info("wrote %d predictions in %d shard(s) under %s", outputs.total, len(outputs.names), prefix)
