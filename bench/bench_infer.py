"""Benchmark the agent's inference path, its checkpoint cost and the boot-time TensorFlow check.

Run:  .venv-tf29/bin/python bench/bench_infer.py [--json] [--examples 10240] [--reps 3] [--no-1gb]
      [--only infer,saves,ckpt-loop,agent-ckpt-loop,tf-check]

It runs in the data-plane environment (TF 2.9, Python 3.8) on the CPU. Each figure is ours
next to its baseline, measured in the same run, repetitions interleaved, medians of ``--reps``:

- inference, the CIFAR-10 CNN of ``experiments/models.py`` at batch 256 and 64: the agent's
  path (``infer.predict_shards``: TFRecords of raw uint8 images -> parse -> several batches per
  ``tf.function`` call -> JSON Lines shards and manifest, written by the writer thread) against
  ``model.predict`` on the same images already decoded in memory (no reading, no parsing, no
  writing), and against a plain ``tf.function`` loop over in-memory batches (time per batch
  of 64: run time / batches, a throughput). Our path runs with XLA off (what the agent does on
  the CPU) and on. Our clock covers ``predict_shards`` and the manifest; the pipeline and the
  output prefix are set up before it (``agent_pass``). Ratios are the median of the paired
  ratios of ``--reps`` x INFER_ROUNDS rounds (runs back to back, the order rotating from round
  to round); ``spread`` is [min, median, max] over the repetitions of the ratio of their summed
  seconds. ``--examples`` images per run (default 40,960: 3-5 s per batch-256 run here; with
  1-s runs the ratio swung from 0.9 to 1.9). The record count the agent takes while the model
  loads is timed on its own.
- latency mode (``infer --latency``), batch LATENCY_BATCH, XLA off and on: time-to-result per
  batch, p50 and p99. The clock covers one batch: for ours the call that predicts the next
  batch in memory, passed to the traced concrete function as its argument (``infer.preload`` read and
  parsed the whole input before the first batch, as ``infer`` does in latency mode off a TPU;
  that preload is reported as ``preload_ms`` and added to ours' wall time), and the hand-over
  of its outputs to the writer (the clock stops in ``predict_shards``' progress callback,
  which follows the hand-over); for the plain
  ``tf.function`` (XLA as ours) over pre-batched float32 tensors in memory
  (``function``), and for ``model.predict_on_batch`` on the same tensors (``predict``), the
  call and the result as numpy; for the plain ``tf.function`` fed by plain tf.data over the
  same TFRecords (``function_records``: batch -> parse the batch in parallel -> prefetch), the
  next batch, the call and the result as numpy. Throughput: examples / wall time of the whole
  pass, ours including the writer's shards and manifest. Tracing is left out (a warm-up pass
  first; ours traces its latency call before its clock starts, as ``infer`` does before its
  first batch). The variants take turns, the order rotating; ``p50_vs_<baseline>`` are
  [min, median, max] of the per-repetition ratios ours / baseline (goal <= 1.0).
  Op determinism is set as ``infer`` sets it (``--determinism``, default on: ``auto`` on a CPU).
- checkpoints: the time the step loop is blocked per save against the checkpoint size, for a
  staged save copied to the store in the background (ours) and a direct synchronous save into
  the store (the baseline, what the agent did before); the blocking save (the SIGTERM save: the
  checkpoint is in the store when it returns), up to 1 GB of variables; and the share of a
  training loop's time that checkpointing every ``CKPT_EVERY`` steps costs (time blocked in
  ``save`` / loop time);
- the agent's own step loop (``train._Run``: load, then ``train()``, the CIFAR-10 CNN on raw
  uint8 TFRecords, a local store) checkpointing every ``CKPT_EVERY`` steps against the same loop
  checkpointing never: the share of the loop's time its clock counts as checkpoint (the time
  the loop is blocked by saves), and the loop's wall time (productive + checkpoint seconds of
  the clock) against the loop without checkpoints. This part runs whatever agent code sits next
  to the script, so the same file measures an older tree when copied into it.
- boot: reading the installed TensorFlow version with ``importlib.metadata`` (the startup
  script) against ``import tensorflow`` (what it did before).

Other processes share this machine: the load average seen during each part is printed.
``--json`` prints one object whose keys name each figure (``infer_vs_predict``,
``infer_latency64_vs_function``, ``ckpt_overhead``, ``agent_ckpt_share``, ``sigterm_save_1gb_s``,
``startup_tf_check_s``; null for a part not run) plus the details. ``--only`` runs the named parts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import result_file

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import models  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpuops.agent import infer, inputs, train  # noqa: E402
from tpuops.agent.checkpoints import Checkpointer  # noqa: E402
from tpuops.agent.paths import RunPaths  # noqa: E402
from tpuops.agent.preemption import PreemptionNotice  # noqa: E402
from tpuops.agent.runtime import connect  # noqa: E402
from tpuops.agent.status import Status  # noqa: E402
from tpuops.contract.runspec import DatasetSpec, parse_spec  # noqa: E402

BATCHES = (256, 64)
CKPT_SIZES_MB = (1, 16, 128)
CKPT_STEPS, CKPT_EVERY, CKPT_BATCH, STEPS_PER_CALL = 300, 100, 32, 10
IMAGE = {"image": {"dtype": "uint8", "shape": [32, 32, 3], "encoding": "raw"}}
TF_IMPORT = "import tensorflow as tf; print(tf.__version__)"
PARTS = ("infer", "latency", "saves", "ckpt-loop", "agent-ckpt-loop", "tf-check")
LATENCY_BATCH = 64
# Each inference repetition is this many rounds of every variant, in a rotating order. This
# machine's two vCPUs now and then run two busy threads at well under twice one thread's speed
# (a pure-Python busy loop in two processes: 4.4 vs 6.9 million iterations per 0.5 s, in
# spells of seconds), which halves a whole prediction run's throughput, ours or Keras's alike;
# more, shorter pairs let the median ratio compare runs that ran at the same speed.
INFER_ROUNDS = 3


def startup_tf_check() -> str:
    """The Python program the startup script runs to read the TensorFlow version (from the template).

    Run without arguments, it checks no agent pin: its second line is empty."""
    template = (ROOT / "templates" / "startup.sh.j2").read_text()
    found = re.search(r"^installed_tf\(\) \{\n  \"\$PYTHON\" -c '(.*?)' \"\$@\" \|\| true$", template, re.M | re.S)
    if found is None:
        raise SystemExit("templates/startup.sh.j2 has no installed_tf() of the expected form")
    return found.group(1)


def median_time(runs: list[float]) -> float:
    return statistics.median(runs)


def paired(numerators: list[float], denominators: list[float]) -> float:
    """The median of the repetitions' ratios numerator / denominator."""
    return round(statistics.median(numerators[i] / denominators[i] for i in range(len(numerators))), 3)


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def load() -> float:
    return round(os.getloadavg()[0], 2)


def write_images(directory: Path, count: int, labels: bool = False) -> tuple[list[str], np.ndarray]:
    """CIFAR-like raw uint8 image records in 4 files (with a ``label`` 0..9), and the images as float32 in memory."""
    images = np.random.default_rng(0).integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
    paths = []
    for shard in range(4):
        path = directory / f"{'labelled' if labels else 'images'}-{shard}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as out:
            for index, image in enumerate(images[shard::4]):
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()]))}
                if labels:
                    feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[index % 10]))
                out.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        paths.append(str(path))
    order = np.concatenate([np.arange(count)[shard::4] for shard in range(4)])  # file order, as the agent reads
    return paths, images[order].astype(np.float32)


def cifar_model() -> tf.keras.Model:
    model = models.cifar10_cnn({})
    model.build((None, 32, 32, 3))
    return model


def agent_pass(work: Path, files: list[str], examples: int, batch: int,
               predictor: Callable[[Any], Callable[[int], Any]], latency: bool = False,
               progress: Callable[[int], None] | None = None) -> Callable[[], None]:
    """One pass of the agent's path over ``files``, set up: returns what the clock covers.

    Set up before the clock: the output prefix and its plan, the input pipeline, its iterator
    and ``predictor(iterator)`` (the latency call is traced there, as ``infer`` traces it before
    its first batch). Timed: ``predict_shards`` (read, parse, predict, write 4 shards) and the
    manifest. ``progress`` is ``predict_shards``' (told after each call's outputs are handed to
    the writer). The caller removes the prefixes (``work/tmp*``) after its runs.
    """
    prefix = tempfile.mkdtemp(dir=work)
    plan = {"inputs": [], "total": examples, "model": {"source": "bench"}, "batch_size": batch, "num_shards": 4}
    outputs = infer.Outputs(prefix, plan)
    outputs.adopt()
    batches = inputs.padded_batches(files, DatasetSpec.from_json({"features": IMAGE}, "dataset"), batch, False)
    predict = predictor(iter(batches))

    def run() -> None:
        infer.predict_shards(predict, outputs, 0, PreemptionNotice(), progress, latency=latency)
        outputs.write_manifest("bench")

    return run


def _spread(ours: list[float], base: list[float], rounds: int) -> list[float]:
    """[min, median, max] over repetitions of the ratio base seconds / ours seconds, each summed over its rounds."""
    reps = len(ours) // rounds
    ratios = sorted(sum(base[r * rounds:(r + 1) * rounds]) / sum(ours[r * rounds:(r + 1) * rounds])
                    for r in range(reps))
    return [round(ratios[0], 3), round(statistics.median(ratios), 3), round(ratios[-1], 3)]


def bench_infer(work: Path, examples: int, reps: int, batches: tuple[int, ...] = BATCHES) -> dict[str, Any]:
    files, memory = write_images(work, examples)
    model = cifar_model()
    strategy = tf.distribute.get_strategy()
    calls = {jit: infer.predict_call(model, strategy, jit) for jit in (False, True)}
    count_s = median_time([timed(lambda: inputs.count_records(files, "infer.input")) for _ in range(reps)])

    def ours(batch: int, jit: bool) -> Callable[[], Callable[[], None]]:
        return lambda: agent_pass(work, files, examples, batch,
                                  lambda iterator: infer.batched_predictor(calls[jit], iterator))

    def function_loop(batch: int) -> Callable[[], None]:
        forward = tf.function(lambda images: model(images, training=False))
        data = tf.data.Dataset.from_tensor_slices(memory).batch(batch).prefetch(2)

        def run() -> None:
            for images in data:
                forward(images).numpy()

        return run

    result: dict[str, Any] = {"count_records_s": round(count_s, 3), "examples": examples,
                              "runs_per_variant": reps * INFER_ROUNDS}
    for batch in batches:
        # Ours and its baselines run back to back and each repetition's ratios are paired, so that
        # the load other processes put on the machine drifts as little as possible within a pair.
        function = function_loop(batch)
        variants: dict[str, Callable[[], Callable[[], None]]] = {
            "ours": ours(batch, False),
            "predict": lambda: lambda: model.predict(memory, batch_size=batch, verbose=0),  # noqa: B023
            "function": lambda: function,  # noqa: B023
            "ours_jit": ours(batch, True),
        }
        for setup in variants.values():
            setup()()  # trace, compile, warm the page cache
        times: dict[str, list[float]] = {name: [] for name in variants}
        loads = [load()]
        names = list(variants)
        for rep in range(reps * INFER_ROUNDS):
            turn = rep % len(names)
            for name in names[turn:] + names[:turn]:
                times[name].append(timed(variants[name]()))
            loads.append(load())
        for leftover in work.glob("tmp*"):
            shutil.rmtree(leftover)
        medians = {name: median_time(runs) for name, runs in times.items()}
        count = -(-examples // batch)

        result[str(batch)] = {
            "examples_per_s": {name: round(examples / seconds) for name, seconds in medians.items()},
            "ms_per_batch": {name: round(1000 * seconds / count, 2) for name, seconds in medians.items()},
            "seconds_per_run": {name: round(seconds, 2) for name, seconds in medians.items()},
            "ours_vs_predict": paired(times["predict"], times["ours"]),
            "ours_jit_vs_predict": paired(times["predict"], times["ours_jit"]),
            "ours_latency_vs_function": paired(times["ours"], times["function"]),
            "spread": {
                "ours_vs_predict": _spread(times["ours"], times["predict"], INFER_ROUNDS),
                "ours_jit_vs_predict": _spread(times["ours_jit"], times["predict"], INFER_ROUNDS),
            },
            "load": loads,
        }
    return result


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _p50_ratios(ours: list[list[float]], base: list[list[float]]) -> list[float]:
    """[min, median, max] over repetitions of ours' median time-to-result / the baseline's."""
    ratios = sorted(statistics.median(ours[rep]) / statistics.median(base[rep]) for rep in range(len(ours)))
    return [round(ratios[0], 3), round(statistics.median(ratios), 3), round(ratios[-1], 3)]


def plain_records(files: list[str]) -> tf.data.Dataset:
    """What a good TF user writes to read the same TFRecords: batch, parse the batch in parallel, prefetch."""
    raw = {"image": tf.io.FixedLenFeature([], tf.string)}

    def parse(serialized: tf.Tensor) -> tf.Tensor:
        pixels = tf.io.decode_raw(tf.io.parse_example(serialized, raw)["image"], tf.uint8)
        return tf.cast(tf.reshape(pixels, [-1, 32, 32, 3]), tf.float32)

    batches = tf.data.TFRecordDataset(files).batch(LATENCY_BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)


def bench_latency(work: Path, examples: int, reps: int) -> dict[str, Any]:
    """Latency mode against a plain tf.function (pre-batched, and on the TFRecords) and predict_on_batch."""
    files, memory = write_images(work, examples)
    model = cifar_model()
    strategy = tf.distribute.get_strategy()
    tensors = [tf.constant(memory[i : i + LATENCY_BATCH]) for i in range(0, len(memory), LATENCY_BATCH)]
    result: dict[str, Any] = {"batch": LATENCY_BATCH, "examples": examples, "load": [load()]}
    for jit in (False, True):
        plain = tf.function(lambda images: model(images, training=False), jit_compile=jit)

        def ours(latencies: list[float]) -> Callable[[], None]:
            called = [0.0]

            def timed_predictor(iterator: Any) -> Callable[[int], Any]:
                # As infer does: the whole input read ahead (timed: it is added to ours' wall), then traced.
                started = time.perf_counter()
                preloaded = infer.preload(iterator, len(tensors))
                preloads.append(time.perf_counter() - started)  # noqa: B023
                predict = infer.latency_predictor(model, strategy, jit, preloaded, preloaded=True)  # noqa: B023

                def timed_predict(steps: int) -> Any:
                    called[0] = time.perf_counter()
                    return predict(steps)

                return timed_predict

            def handed_over(predicted: int) -> None:  # predict_shards' progress: the batch is with the writer
                latencies.append(time.perf_counter() - called[0])

            return agent_pass(work, files, examples, LATENCY_BATCH, timed_predictor, latency=True,
                              progress=handed_over)

        def each_batch(predict: Callable[[tf.Tensor], Any]) -> Callable[[list[float]], Callable[[], None]]:
            def setup(latencies: list[float]) -> Callable[[], None]:
                def run() -> None:
                    for images in tensors:
                        started = time.perf_counter()
                        np.asarray(predict(images))
                        latencies.append(time.perf_counter() - started)

                return run

            return setup

        def from_records(latencies: list[float]) -> Callable[[], None]:
            batches = iter(plain_records(files))

            def run() -> None:
                for _ in range(len(tensors)):
                    started = time.perf_counter()
                    np.asarray(plain(next(batches)))  # noqa: B023
                    latencies.append(time.perf_counter() - started)

            return run

        preloads: list[float] = []
        variants = {
            "ours": ours,
            "function": each_batch(plain),
            "function_records": from_records,
            "predict": each_batch(model.predict_on_batch),
        }
        for warm in variants.values():
            warm([])()  # trace, compile, warm the page cache
        names = list(variants)
        per_batch: dict[str, list[list[float]]] = {name: [] for name in names}
        walls: dict[str, list[float]] = {name: [] for name in names}
        for rep in range(reps):
            turn = rep % len(names)
            for name in names[turn:] + names[:turn]:
                samples: list[float] = []
                walls[name].append(timed(variants[name](samples)) + (preloads[-1] if name == "ours" else 0.0))
                per_batch[name].append(samples)
            result["load"].append(load())
        for leftover in work.glob("tmp*"):
            shutil.rmtree(leftover)
        every = {name: [value for samples in runs for value in samples] for name, runs in per_batch.items()}

        result["xla_on" if jit else "xla_off"] = {
            "p50_ms": {name: round(1000 * statistics.median(values), 2) for name, values in every.items()},
            "p99_ms": {name: round(1000 * _percentile(values, 0.99), 2) for name, values in every.items()},
            "examples_per_s": {name: round(examples / statistics.median(runs)) for name, runs in walls.items()},
            "preload_ms": round(1000 * statistics.median(preloads), 1),
            **{f"p50_vs_{base}": _p50_ratios(per_batch["ours"], per_batch[base])
               for base in ("function", "function_records", "predict")},
        }
    return result


# Per baseline of the latency part: its name in the table and what its clock covers per batch.
LATENCY_BASELINES = {
    "function": "plain tf.function on pre-batched float32 tensors in memory (call + result as numpy)",
    "function_records": "plain tf.function fed by plain tf.data over the same TFRecords "
                        "(next batch + call + result as numpy)",
    "predict": "model.predict_on_batch on pre-batched float32 tensors in memory",
}


def _latency_rows(latency: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    for xla in ("xla_off", "xla_on"):
        fig = latency[xla]
        for base, covers in LATENCY_BASELINES.items():
            rows.append((
                f"latency mode, batch {latency['batch']}, {xla.replace('_', ' ')}: p50 time-to-result (ours: the "
                f"call that predicts the preloaded batch + the hand-over to the writer; vs {covers}) "
                f"(p99 {fig['p99_ms']['ours']} vs "
                f"{fig['p99_ms'][base]} ms; ex/s {fig['examples_per_s']['ours']} vs {fig['examples_per_s'][base]})",
                f"{fig['p50_ms']['ours']} ms",
                f"{fig['p50_ms'][base]} ms",
                f"{fig[f'p50_vs_{base}']} (<= 1.0)",
            ))
    return rows


def _variables(megabytes: int) -> list[tf.Variable]:
    parts = max(1, megabytes // 128)
    size = megabytes * 2**20 // 4 // parts
    return [tf.Variable(tf.random.uniform([size])) for _ in range(parts)]


def _checkpointer(checkpoint: tf.train.Checkpoint, store: Path, staged: bool) -> Checkpointer:
    if store.exists():
        shutil.rmtree(store)
    staging = str(store.parent / (store.name + "-staging")) if staged else None
    return Checkpointer(checkpoint, str(store), keep=2, every_steps=CKPT_EVERY, every_seconds=0, staging=staging)


def bench_save_sizes(work: Path, reps: int, with_1gb: bool) -> dict[str, Any]:
    """Seconds the caller is blocked per save, by checkpoint size: staged background vs direct."""
    sizes: dict[str, Any] = {}
    for megabytes in (*CKPT_SIZES_MB, *((1024,) if with_1gb else ())):
        checkpoint = tf.train.Checkpoint(v=_variables(megabytes))
        ours, direct, durable = [], [], []
        loads = [load()]
        for rep in range(reps):
            staged = _checkpointer(checkpoint, work / "store-staged", staged=True)
            ours.append(timed(lambda: staged.save(rep + 1, background=True)))  # noqa: B023
            staged.wait()
            sync = _checkpointer(checkpoint, work / "store-sync", staged=True)
            durable.append(timed(lambda: sync.save(rep + 1)))  # noqa: B023
            plain = _checkpointer(checkpoint, work / "store-direct", staged=False)
            direct.append(timed(lambda: plain.save(rep + 1)))  # noqa: B023
            loads.append(load())
        sizes[str(megabytes)] = {
            "ours_blocked_s": round(median_time(ours), 3),
            "ours_blocking_save_s": round(median_time(durable), 3),  # the SIGTERM save
            "direct_save_s": round(median_time(direct), 3),
            "load": loads,
        }
        del checkpoint
    return sizes


def bench_ckpt_loop(reps: int) -> dict[str, Any]:
    """A CIFAR-10 CNN training loop checkpointing every CKPT_EVERY steps: share of its time spent blocked in save.

    Ours saves in the background through a staging directory; the baseline saves synchronously
    into the store, as the agent did before.
    """
    model = models.cifar10_cnn({})
    optimizer = tf.keras.optimizers.Adam()
    images = tf.random.uniform([CKPT_BATCH, 32, 32, 3], maxval=255.0)
    labels = tf.random.uniform([CKPT_BATCH], maxval=10, dtype=tf.int64)
    step_var = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def train_call(steps: tf.Tensor) -> None:
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, model(images)))
            optimizer.minimize(loss, model.trainable_variables, tape=tape)
        step_var.assign_add(tf.cast(steps, tf.int64))

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-loop-"))

    def loop(mode: str) -> tuple[float, float]:
        checkpointer = None if mode == "none" else _checkpointer(checkpoint, work / mode, staged=mode == "ours")
        blocked, started = 0.0, time.perf_counter()
        for step in range(STEPS_PER_CALL, CKPT_STEPS + 1, STEPS_PER_CALL):
            train_call(tf.constant(STEPS_PER_CALL))
            if checkpointer is not None and step % CKPT_EVERY == 0:
                blocked += timed(lambda: checkpointer.save(step, background=mode == "ours"))  # noqa: B023
        total = time.perf_counter() - started
        if checkpointer is not None:
            checkpointer.wait()
        return total, blocked

    loop("none")
    runs: dict[str, list[tuple[float, float]]] = {"none": [], "ours": [], "direct": []}
    loads = [load()]
    for _ in range(reps):
        for mode in runs:
            runs[mode].append(loop(mode))
        loads.append(load())
    shutil.rmtree(work)
    none = median_time([total for total, _ in runs["none"]])
    result: dict[str, Any] = {"loop_s_without": round(none, 3), "load": loads}
    for mode in ("ours", "direct"):
        result[mode] = {
            "blocked_share": round(median_time([blocked / total for total, blocked in runs[mode]]), 4),
            "wall_vs_without": round(median_time([total for total, _ in runs[mode]]) / none, 3),
        }
    return result


def _agent_spec(store: Path, files: list[str], run_id: str, every: int) -> str:
    """A run spec for the agent's loop: the CIFAR-10 CNN, saves every ``every`` steps (0: never).

    The run ends half a period after the last save, so that every save is followed by steps.
    """
    return json.dumps({
        "version": 1, "run_id": run_id, "store_root": str(store), "entry_point": "models:cifar10_cnn",
        "experiments_dir": str(ROOT / "experiments"), "hparams": {"optimizer": "adam", "learning_rate": 0.001},
        "seed": 1, "allow_cpu_fallback": True, "heartbeat_seconds": 10,
        "dataset": {"features": dict(IMAGE, label={"dtype": "int64"}), "label": "label", "train": files,
                    "shuffle_buffer": 64},
        "train": {"per_replica_batch_size": CKPT_BATCH, "steps": CKPT_STEPS + CKPT_EVERY // 2,
                  "steps_per_call": STEPS_PER_CALL, "checkpoint_every_steps": every, "checkpoint_every_seconds": 0,
                  "keep_checkpoints": 2},
    })


def bench_agent_ckpt_loop(work: Path, reps: int) -> dict[str, Any]:
    """The agent's step loop (``train._Run.train``) saving every CKPT_EVERY steps vs never, by its own clock."""
    files = write_images(work, 4 * CKPT_BATCH, labels=True)[0]

    def loop(every: int, rep: int) -> tuple[float, float]:
        run_id = f"loop-{every}-{rep}"
        spec = parse_spec(_agent_spec(work / "store", files, run_id, every))
        paths = RunPaths(spec.store_root, run_id)
        tf.io.gfile.makedirs(paths.run_dir)
        status = Status(paths.status, run_id, "train", 1)
        attempt = train._Run(spec, connect(spec), status, PreemptionNotice(), paths)
        attempt.load()
        attempt.train()
        clock = status.clock.entry()  # the first call is setup (it traces); the rest is the loop
        attempt.ckpt.wait()
        return clock["productive_s"] + clock["checkpoint_s"], clock["checkpoint_s"]

    loop(0, -1)
    runs: dict[int, list[tuple[float, float]]] = {CKPT_EVERY: [], 0: []}
    loads = [load()]
    for rep in range(reps):
        for every in runs:
            runs[every].append(loop(every, rep))
        loads.append(load())
    without = median_time([total for total, _ in runs[0]])
    return {
        "loop_s_without": round(without, 3),
        "loop_s": round(median_time([total for total, _ in runs[CKPT_EVERY]]), 3),
        "blocked_share": round(median_time([blocked / total for total, blocked in runs[CKPT_EVERY]]), 4),
        "blocked_per_save_s": round(median_time([blocked for _, blocked in runs[CKPT_EVERY]]) / (CKPT_STEPS //
                                                                                              CKPT_EVERY), 3),
        "wall_vs_without": round(median_time([total for total, _ in runs[CKPT_EVERY]]) / without, 3),
        "load": loads,
    }


def bench_tf_check(reps: int) -> dict[str, Any]:
    """The startup script's TensorFlow version check, in a fresh interpreter: metadata vs import."""
    times: dict[str, list[float]] = {"metadata": [], "import": []}
    versions = {}
    for _ in range(reps):
        for name, code in (("metadata", startup_tf_check()), ("import", TF_IMPORT)):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            times[name].append(time.perf_counter() - started)
            versions[name] = done.stdout.strip()
    assert versions["metadata"] == versions["import"], versions
    return {name: round(median_time(runs), 3) for name, runs in times.items()}


def table(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("figure", "ours", "baseline", "ours vs baseline")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    lines = ["  ".join(row[i].ljust(widths[i]) for i in range(4)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _infer_rows(inference: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    covers = ("ours: read TFRecords, parse, predict, write the shards and manifest; model.predict: the images "
              "decoded in memory")
    for batch in (batch for batch in map(str, BATCHES) if batch in inference):
        rates, fig = inference[batch]["examples_per_s"], inference[batch]
        for key, name, title in (("ours_vs_predict", "ours", ""), ("ours_jit_vs_predict", "ours_jit", " with XLA")):
            rows.append((f"infer batch {batch}{title}, examples/s vs model.predict ({covers}; spread over "
                         f"repetitions {fig['spread'][key]}; {fig['seconds_per_run'][name]} s per run)",
                         str(rates[name]), str(rates["predict"]), f"{fig[key]:.3f}x"))
    if "64" in inference:
        per_batch = inference["64"]["ms_per_batch"]
        rows.append(("ms per batch of 64 (run time / batches, a throughput: vs plain tf.function loop over the "
                     "images in memory)", str(per_batch["ours"]), str(per_batch["function"]),
                     f"{inference['64']['ours_latency_vs_function']:.3f}x"))
    rows.append(("record count while the model loads, s", str(inference["count_records_s"]), "-", "-"))
    return rows


def _saves_rows(sizes: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    for megabytes, figure in sizes.items():
        rows.append((f"step loop blocked per save, {megabytes} MB (vs direct)", str(figure["ours_blocked_s"]),
                     str(figure["direct_save_s"]), f"{figure['ours_blocked_s'] / figure['direct_save_s']:.3f}x"))
        rows.append((f"blocking save into the store, {megabytes} MB (vs direct)", str(figure["ours_blocking_save_s"]),
                     str(figure["direct_save_s"]),
                     f"{figure['ours_blocking_save_s'] / figure['direct_save_s']:.3f}x"))
    return rows


def _ckpt_loop_rows(ckpt_loop: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(f"loop time blocked by saves every {CKPT_EVERY} steps", f"{ckpt_loop['ours']['blocked_share']:.2%}",
             f"{ckpt_loop['direct']['blocked_share']:.2%}", "-"),
            ("loop wall time vs no checkpoints", f"{ckpt_loop['ours']['wall_vs_without']:.3f}x",
             f"{ckpt_loop['direct']['wall_vs_without']:.3f}x", "-")]


def _agent_ckpt_loop_rows(agent: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(f"agent loop time blocked by saves every {CKPT_EVERY} steps", f"{agent['blocked_share']:.2%}", "-", "-"),
            ("agent loop blocked per save, s", str(agent["blocked_per_save_s"]), "-", "-"),
            ("agent loop wall time (vs no checkpoints), s", str(agent["loop_s"]), str(agent["loop_s_without"]),
             f"{agent['wall_vs_without']:.3f}x")]


def _tf_check_rows(tf_check: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [("startup TF version check, s (vs import tensorflow)", str(tf_check["metadata"]),
             str(tf_check["import"]), f"{tf_check['metadata'] / tf_check['import']:.3f}x")]


def render(details: dict[str, Any]) -> str:
    """The table of ours vs baseline, and the load seen, from the details that ``--json`` prints."""
    rows: list[tuple[str, str, str, str]] = []
    loads: dict[str, Any] = {}
    if "infer" in details:
        rows += _infer_rows(details["infer"])
        loads["infer"] = {batch: details["infer"][batch]["load"] for batch in map(str, BATCHES)
                          if batch in details["infer"]}
    if "latency" in details:
        rows += _latency_rows(details["latency"])
        loads["latency"] = details["latency"]["load"]
    if "ckpt_save_by_size_mb" in details:
        rows += _saves_rows(details["ckpt_save_by_size_mb"])
        loads["saves by size (MB)"] = {size: fig["load"] for size, fig in details["ckpt_save_by_size_mb"].items()}
    if "ckpt_loop" in details:
        rows += _ckpt_loop_rows(details["ckpt_loop"])
        loads["checkpoint loop"] = details["ckpt_loop"]["load"]
    if "agent_ckpt_loop" in details:
        rows += _agent_ckpt_loop_rows(details["agent_ckpt_loop"])
        loads["agent checkpoint loop"] = details["agent_ckpt_loop"]["load"]
    if "tf_check" in details:
        rows += _tf_check_rows(details["tf_check"])
    return table(rows) + "\nload average (1 min) seen during each part: " + json.dumps(loads)


def connect_as_infer(deterministic: bool) -> None:
    """The runtime ``infer`` sets up on this machine for a spec with ``deterministic`` (op determinism, seed)."""
    spec = parse_spec(json.dumps({"run_id": "bench", "store_root": tempfile.gettempdir(), "allow_cpu_fallback": True,
                                  "deterministic": deterministic, "dataset": {"features": IMAGE}}))
    logging.getLogger("tpuops.agent.runtime").setLevel(logging.ERROR)
    connect(spec)


def _part(parts: list[str], determinism: str) -> str:
    """The result file's part (docs/benchmarks.md's sections): throughput, latency, checkpoints, or all of them."""
    checkpoints = {"saves", "ckpt-loop", "agent-ckpt-loop", "tf-check"}
    name = ("" if set(parts) == set(PARTS) else "throughput" if parts == ["infer"] else "latency"
            if parts == ["latency"] else "checkpoints" if set(parts) <= checkpoints else "+".join(parts))
    return name if determinism == "on" else f"{name or 'all'}-determinism-off"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--examples", type=int, default=40960,
                        help="images per run (40,960: 3-5 s per batch-256 run here; 1-s runs swung 0.9-1.9x)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions; medians are reported")
    parser.add_argument("--no-1gb", action="store_true", help="skip the 1 GB checkpoints (about 2 minutes)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help=f"batch sizes of the infer part, of {','.join(map(str, BATCHES))}")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts to run, of {','.join(PARTS)}")
    parser.add_argument("--determinism", choices=("on", "off"), default="on",
                        help="TF op determinism, as infer sets it: on is what deterministic: auto gives on a CPU")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_infer")
    connect_as_infer(args.determinism == "on")
    parts = args.only.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"--only: unknown parts {sorted(unknown)}; choose from {','.join(PARTS)}")
    batches = tuple(int(batch) for batch in args.batches.split(",") if batch.strip().isdigit())
    if not batches or set(batches) - set(BATCHES):
        parser.error(f"--batches: choose from {','.join(map(str, BATCHES))}")
    work = Path(tempfile.mkdtemp(prefix="bench-infer-"))
    details: dict[str, Any] = {}
    try:
        if "infer" in parts:
            details["infer"] = bench_infer(work, args.examples, args.reps, batches)
        if "latency" in parts:
            details["latency"] = bench_latency(work, args.examples, args.reps)
        if "saves" in parts:
            details["ckpt_save_by_size_mb"] = bench_save_sizes(work, args.reps, with_1gb=not args.no_1gb)
        if "ckpt-loop" in parts:
            details["ckpt_loop"] = bench_ckpt_loop(args.reps)
        if "agent-ckpt-loop" in parts:
            details["agent_ckpt_loop"] = bench_agent_ckpt_loop(work, args.reps)
        if "tf-check" in parts:
            details["tf_check"] = bench_tf_check(args.reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    inference, sizes = details.get("infer"), details.get("ckpt_save_by_size_mb", {})
    figures = {
        "infer_vs_predict": {batch: inference[batch]["ours_vs_predict"] for batch in map(str, BATCHES)
                             if batch in inference} if inference else None,
        "infer_latency64_vs_function": inference["64"]["ours_latency_vs_function"]
        if inference and "64" in inference else None,
        "latency64_p50_vs_function": {xla: details["latency"][xla]["p50_vs_function"] for xla in ("xla_off", "xla_on")}
        if "latency" in details else None,
        "ckpt_overhead": details["ckpt_loop"]["ours"]["blocked_share"] if "ckpt_loop" in details else None,
        "agent_ckpt_share": details["agent_ckpt_loop"]["blocked_share"] if "agent_ckpt_loop" in details else None,
        "sigterm_save_1gb_s": sizes["1024"]["ours_blocking_save_s"] if "1024" in sizes else None,
        "startup_tf_check_s": details["tf_check"]["metadata"] if "tf_check" in details else None,
    }
    if args.result:
        measuring.write(dict(figures, details=details), part=_part(parts, args.determinism))
    if args.json:
        print(json.dumps(dict(figures, details=details), indent=1))
    else:
        print(render(details))

if __name__ == "__main__":
    main()
