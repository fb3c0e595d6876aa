"""What gradient accumulation costs: steps/s of one global batch taken at once against in 4 micro-batches.

Run:  .venv-tf29/bin/python bench/bench_accumulation.py [--batch 256] [--accumulation 4] [--steps 40] [--repeats 3]
      [--json] [--result]

The agent's own training call (``steps.Steps``, ``steps_per_call`` steps per tf.function call) on the
CPU, one replica, the CIFAR-10 CNN of ``bench_agent`` on in-memory batches of 32x32x3 images: the
same global batch per optimizer step either as one batch (accumulation 1: what a slice with enough
replicas does) or as ``--accumulation`` micro-batches summed in the step's loop (what a smaller
slice does to keep the run's global batch). The two take turns in blocks of ``--steps`` steps, so
that load from elsewhere on a shared machine lands on both alike; ``ratio`` is the median over
repeats of accumulated / whole steps per second (goal: near 1.0 on the CPU, where a smaller batch
costs what its share of the work costs; on a TPU a micro-batch leaves the matrix units emptier).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import result_file

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from models import cifar10_cnn  # noqa: E402

from tpuops.agent.steps import Steps, make_optimizer  # noqa: E402
from tpuops.contract.runspec import TrainSpec  # noqa: E402

STEPS_PER_CALL = 10


def runner(batch: int, accumulation: int) -> Callable[[int], float]:
    """A function training ``steps`` optimizer steps of ``batch`` examples; returns their seconds."""
    tf.keras.utils.set_random_seed(1)
    rng = np.random.default_rng(1)
    images = rng.random((batch * 4, 32, 32, 3), dtype=np.float32)
    labels = rng.integers(0, 10, batch * 4)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch, drop_remainder=True).repeat()
    model = cifar10_cnn({})
    spec = TrainSpec(per_replica_batch_size=batch // accumulation, steps=10**9, global_batch=batch)
    steps = Steps(tf.distribute.get_strategy(), model, make_optimizer({"optimizer": "adam"}), spec, batch,
                  accumulation)
    steps.prepare(data.element_spec)
    iterator = iter(data)
    steps.train_call(iterator, tf.constant(STEPS_PER_CALL, tf.int64))[0].numpy()  # trace and warm up

    def train(count: int) -> float:
        started = time.perf_counter()
        for _ in range(count // STEPS_PER_CALL):
            steps.train_call(iterator, tf.constant(STEPS_PER_CALL, tf.int64))[0].numpy()
        return time.perf_counter() - started

    return train


def measure(args: argparse.Namespace) -> dict[str, object]:
    whole, accumulated = runner(args.batch, 1), runner(args.batch, args.accumulation)
    rates: dict[str, list[float]] = {"whole": [], "accumulated": []}
    for repeat in range(args.repeats):
        order = [("whole", whole), ("accumulated", accumulated)]
        for name, train in order if repeat % 2 == 0 else order[::-1]:
            rates[name].append(args.steps / train(args.steps))
    ratios = [rates["accumulated"][repeat] / rates["whole"][repeat] for repeat in range(args.repeats)]
    return {
        "batch": args.batch, "accumulation": args.accumulation, "steps": args.steps, "repeats": args.repeats,
        "whole_steps_per_s": round(statistics.median(rates["whole"]), 2),
        "accumulated_steps_per_s": round(statistics.median(rates["accumulated"]), 2),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_spread": [round(value, 3) for value in sorted(ratios)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="the global batch of every optimizer step")
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40, help="steps per timed block (a multiple of 10)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_accumulation")
    figures = measure(args)
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"global batch {args.batch}: {figures['whole_steps_per_s']} steps/s at once, "
              f"{figures['accumulated_steps_per_s']} steps/s in {args.accumulation} micro-batches "
              f"(ratio {figures['ratio']}, spread {figures['ratio_spread']})")
    if args.result:
        table = result_file.Table(
            f"Global batch {args.batch} per step on one CPU replica (steps/s, medians of {args.repeats})",
            ["at once", f"{args.accumulation} micro-batches", "ratio"],
            [[str(figures["whole_steps_per_s"]), str(figures["accumulated_steps_per_s"]), str(figures["ratio"])]])
        print(measuring.write(figures, [table]))


if __name__ == "__main__":
    main()
