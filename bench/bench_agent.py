"""Benchmark the agent's training paths against plain Keras, on the CPU under TensorFlow 2.9.

Run:  .venv-tf29/bin/python bench/bench_agent.py [--steps 20] [--repeats 3] [--json]

One model, one batch, one run, side by side (the CIFAR-10 CNN of the Cloud TPU Keras article,
batch 256 of synthetic 32x32x3 images; every timing after a warm-up; medians of --repeats).
Each repeat runs every contender in blocks of 10 steps, taking turns in a rotating order, so
that load from elsewhere on a shared machine lands on all of them alike:

- ``train_vs_fit``: the agent's loop driving a compiled model (``CompiledSteps``: the model's
  own train_step, ``steps_per_call`` steps per tf.function call, the input-wait clock) vs
  ``model.compile(); model.fit()`` on the same in-memory batches. Goal >= 1.0.
- ``script_callback_overhead``: ``model.fit`` with the two ``tpuops_helper`` callbacks (the
  step checkpoint with its schedule off, the status reporter) vs without; the share of fit's
  throughput they cost. Goal <= 0.02.

``model.fit`` is timed from its first batch to its last (its set-up and tear-down, e.g. the
checkpoint the helper writes at train end, are left out: this favours fit in ``train_vs_fit``);
the agent's loop is timed whole, including its per-call host round trips.
- ``pipeline_fed_vs_memory``: the agent's TFRecord pipeline (``inputs.train_dataset``: raw
  uint8 images parsed, shuffled, batched, prefetched) vs the same batches from memory, each
  feeding the agent's loop. Goal >= 0.95.

Throughput is examples per second (medians over repeats); each ratio is the median of the
per-block ratios, ours / baseline (the overhead is 1 minus that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments"), str(ROOT / "tpuops" / "agent" / "userlib")]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tpuops_helper  # noqa: E402
from models import cifar10_cnn  # noqa: E402

from tpuops.agent.inputs import train_dataset  # noqa: E402
from tpuops.agent.runspec import DatasetSpec  # noqa: E402
from tpuops.agent.steps import CompiledSteps  # noqa: E402

BATCH = 256
RECORDS = 4 * BATCH
STEPS_PER_CALL = 10
# result key -> (ours, baseline): the ratio of their speeds, ours / baseline
PAIRS = {
    "train_vs_fit": ("agent", "fit"),
    "script_callback_overhead": ("fit_helper", "fit"),
    "pipeline_fed_vs_memory": ("pipeline", "memory"),
}


def compiled_model() -> tf.keras.Model:
    model = cifar10_cnn({})
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def memory_batches(images: np.ndarray, labels: np.ndarray) -> tf.data.Dataset:
    """Whole batches already in memory as float32: the fastest feed there is."""
    batches = images.astype(np.float32).reshape(-1, BATCH, *images.shape[1:])
    data = tf.data.Dataset.from_tensor_slices((batches, labels.reshape(-1, BATCH)))
    return data.repeat().prefetch(tf.data.AUTOTUNE)


def agent_loop(dataset: tf.data.Dataset) -> Callable[[int], float]:
    strategy = tf.distribute.get_strategy()
    model = compiled_model()
    steps = CompiledSteps(strategy, model)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    def run(count: int) -> float:
        started = time.perf_counter()
        for start in range(0, count, STEPS_PER_CALL):
            steps.train_call(iterator, tf.constant(min(STEPS_PER_CALL, count - start), tf.int64))
        steps.train_metrics.results()  # waits for the last call
        return time.perf_counter() - started

    return run


class _Clock(tf.keras.callbacks.Callback):
    """From the first batch's start to the last batch's end: fit's set-up and tear-down left out."""

    def __init__(self) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self.started = self.ended = 0.0

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if batch == 0:
            self.started = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.ended = time.perf_counter()


def keras_fit(dataset: tf.data.Dataset, callbacks: Callable[[tf.keras.Model], list]) -> Callable[[int], float]:
    model = compiled_model()
    clock = _Clock()
    chosen = [*callbacks(model), clock]

    def run(count: int) -> float:
        model.fit(dataset, epochs=1, steps_per_epoch=count, callbacks=chosen, verbose=0)
        return clock.ended - clock.started

    return run


def helper_callbacks(directory: str) -> Callable[[tf.keras.Model], list]:
    def make(model: tf.keras.Model) -> list:
        checkpoint = tpuops_helper.StepCheckpoint(
            model, steps_per_epoch=10**6, directory=directory, every_steps=0, every_seconds=0
        )
        return [checkpoint, tpuops_helper.StatusReporter()]

    return make


def write_records(folder: Path, images: np.ndarray, labels: np.ndarray) -> list[str]:
    path = folder / "train-00000.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as out:
        for index in range(len(labels)):  # zip(strict=) is Python 3.10; this runs on the VM's 3.8
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[images[index].tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[index])])),
            }
            out.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return [str(path)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(RECORDS, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=RECORDS).astype(np.int64)
    spec = DatasetSpec.from_json(
        {
            "features": {
                "image": {"dtype": "uint8", "shape": [32, 32, 3], "encoding": "raw"},
                "label": {"dtype": "int64"},
            },
            "label": "label",
            "shuffle_buffer": RECORDS,
            "cache": True,
        },
        "dataset",
    )
    samples: dict[str, list[float]] = {name: [] for name in ("agent", "fit", "fit_helper", "pipeline", "memory")}
    ratios: dict[str, list[float]] = {key: [] for key in PAIRS}
    # The helper prints a line per checkpoint: keep stdout for the results (--json).
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stdout(sys.stderr):
        files = write_records(Path(scratch), images, labels)
        memory = memory_batches(images, labels)
        runners = {
            "fit": keras_fit(memory, lambda model: []),
            "agent": agent_loop(memory),
            "fit_helper": keras_fit(memory, helper_callbacks(os.path.join(scratch, "ckpt"))),
            "pipeline": agent_loop(train_dataset(files, spec, 0, BATCH, 0, RECORDS)),
            "memory": agent_loop(memory),
        }
        for run in runners.values():
            run(STEPS_PER_CALL)  # warm-up: tracing, first batches
        # Blocks of STEPS_PER_CALL steps, every runner in turn and the order rotating: each block
        # gives one paired ratio per comparison, measured seconds apart, so that load from
        # elsewhere on a shared machine hits both sides alike; the result is their median.
        names = list(runners)
        blocks = max(1, args.steps // STEPS_PER_CALL)
        for repeat in range(args.repeats):
            seconds = dict.fromkeys(names, 0.0)
            for block in range(blocks):
                turn = (repeat * blocks + block) % len(names)
                took = {name: runners[name](STEPS_PER_CALL) for name in names[turn:] + names[:turn]}
                for name in names:
                    seconds[name] += took[name]
                for key, (ours, base) in PAIRS.items():
                    ratios[key].append(took[base] / took[ours])
            for name in names:
                samples[name].append(blocks * STEPS_PER_CALL * BATCH / seconds[name])
    median = {name: statistics.median(values) for name, values in samples.items()}
    paired = {key: statistics.median(values) for key, values in ratios.items()}
    results = {
        "examples_per_sec": {name: round(value, 1) for name, value in median.items()},
        "train_vs_fit": round(paired["train_vs_fit"], 3),
        "script_callback_overhead": round(1 - paired["script_callback_overhead"], 4),
        "pipeline_fed_vs_memory": round(paired["pipeline_fed_vs_memory"], 3),
        "blocks": len(ratios["train_vs_fit"]),
        "batch": BATCH,
        "steps": args.steps,
        "repeats": args.repeats,
        "tensorflow": tf.__version__,
    }
    if args.json:
        print(json.dumps(results, indent=1))
        return
    rows = [
        ("training: agent loop (compiled model) vs model.fit", "agent", "fit", "train_vs_fit", ">= 1.0"),
        ("script mode: fit + helper callbacks vs fit", "fit_helper", "fit", "script_callback_overhead", "<= 0.02"),
        ("input: agent TFRecord pipeline vs memory", "pipeline", "memory", "pipeline_fed_vs_memory", ">= 0.95"),
    ]
    print(f"{'comparison':52} {'ours ex/s':>10} {'base ex/s':>10} {'result':>8}  goal")
    for title, ours, base, key, goal in rows:
        print(f"{title:52} {median[ours]:10.1f} {median[base]:10.1f} {results[key]:8.3f}  {goal}")
    print(
        f"CPU, TensorFlow {tf.__version__}, batch {BATCH}, {args.steps} steps x {args.repeats} repeats; "
        f"results: median of {results['blocks']} paired {STEPS_PER_CALL}-step blocks"
    )


if __name__ == "__main__":
    main()
