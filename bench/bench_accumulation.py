"""What gradient accumulation costs: steps/s of one global batch on the emulator's v2-8 against its v2-32.

Run:  .venv/bin/python bench/bench_accumulation.py [--repetitions 3] [--steps 300] [--json] [--result]
      .venv-tf29/bin/python bench/bench_accumulation.py --step [--batch 256] [--accumulation 4] [--steps 40]
      [--repetitions 3] [--json] [--result]

Part ``emulator`` (the default): an elastic run of the digits CNN (``accelerator: [v2-32, v2-8]``, 8 records
per replica: the global batch 256 of v2-32's 32 TPU cores) trained end to end with ``tpuops train --json`` on
one emulator whose nodes run real TF 2.9, once on v2-32 (4 workers under CentralStorageStrategy, 4 replicas x
8 micro-batches of 8) and once on v2-8 (us-central1-a, the only zone of v2-32, stocked out for the whole run:
one replica x 32 micro-batches of 8, 4 times v2-32's accumulation, as on real TPUs 8 cores accumulate 4 times
what 32 take at once). steps/s is the run's steps over its productive seconds (its goodput split: setup,
checkpoints and evaluations left out). The two take turns in every repetition (order alternating) so that
load from elsewhere on this shared 2-core machine lands on both alike; the ratio is per repetition, v2-8
over v2-32, then the median. No goal: on the emulator all 4 of v2-32's workers share the same 2 cores, so the
figure is what accumulation costs here, not a TPU forecast (on a TPU a micro-batch leaves matrix units idle).

Part ``step`` (``--step``, under the TF venv): the agent's own training call (``steps.Steps``, 10 steps per
tf.function call) on one CPU replica, the CIFAR-10 CNN of ``bench_agent`` on in-memory 32x32x3 images: one
global batch per optimizer step taken at once or as ``--accumulation`` micro-batches summed in the step's
loop, in blocks of ``--steps`` steps taking turns; the ratio is accumulated over whole steps/s, the median of
the repetitions (near 1.0 on a CPU, where a smaller batch costs its share of the work).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import result_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import digits_project  # noqa: E402 - test-only helper, found through the line above

TF_PYTHON = ROOT / ".venv-tf29" / "bin" / "python"
PROJECT, BIG_ZONE, SMALL_ZONE = "tpuops-local", "us-central1-a", "us-central1-b"
SIZES = ("v2-32", "v2-8")
STEPS_PER_CALL = 10


def median(values: list[float | None]) -> float | None:
    kept = [value for value in values if value is not None]
    return round(statistics.median(kept), 3) if kept else None


# ----- part "emulator": tpuops train on the emulator's two sizes -----------------------------------------------


def project(work: Path, steps: int) -> None:
    """The digits project with the elastic experiment: ``steps`` steps, one evaluation at the end, no target."""
    text = digits_project(work)
    for old, new in (("steps: 600", f"steps: {steps}"), ("steps_per_call: 20", f"steps_per_call: {STEPS_PER_CALL}"),
                     ("\neval:\n", f"\neval:\n  every_steps: {steps}\n"), ("per_replica: 64", "per_replica: 8"),
                     ("target:\n  metric: accuracy\n  at_least: 0.95\n", ""),
                     ("accelerator: v3-8", "accelerator: [v2-32, v2-8]\nelastic:\n  probe_every: 24h")):
        assert old in text, old
        text = text.replace(old, new)
    (work / "experiments" / "elastic.yaml").write_text(text + "expected_hours: 0.01\n")


def one_run(work: Path, env: dict[str, str], admin: Any, size: str, run: str) -> dict[str, Any]:
    """``run`` trained on ``size`` (the larger one stocked out for the smaller); its steps/s and its batches."""
    import subprocess

    from bench_slices import finished, progress, status

    admin.set_faults(stockout_zones=[BIG_ZONE] if size == "v2-8" else [])
    progress(f"{run} on {size}")
    try:
        result = finished(subprocess.Popen(
            [sys.executable, "-m", "tpuops", "train", "experiments/elastic.yaml", "--name", run, "--json"], cwd=work,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    finally:
        admin.set_faults(stockout_zones=[])
    seen = status(work, run)
    productive = (result.get("goodput") or {}).get("productive_s")
    if result.get("exit_class") != "succeeded":
        progress(f"{run} ended {result.get('exit_class')}: {str(result.get('message', ''))[:200]}")
    return {"exit_class": result.get("exit_class"), "step": result.get("step"), "productive_s": productive,
            "steps_per_s": round(result["step"] / productive, 2) if productive else None,
            "replicas": seen.get("replicas"), "accumulation": seen.get("accumulation"),
            "global_batch": seen.get("global_batch")}


def on_emulator(args: argparse.Namespace) -> tuple[dict[str, Any], list[result_file.Table]]:
    from bench_slices import env_for

    from tpuops.emulator import AdminClient, start_background, stop

    reps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-accumulation-") as tmp:
        work = Path(tmp)
        project(work, args.steps)
        info = start_background(work / "home" / "emulator", boot_delay_s=0.2, grace_s=20.0,
                                image_python=str(TF_PYTHON))
        try:
            env, admin = env_for(work, info), AdminClient(info.endpoint, token=info.token)
            (work / "tpuops.toml").write_text(f'zones = ["{BIG_ZONE}", "{SMALL_ZONE}"]\nstockout_backoff_s = 1\n')
            for rep in range(args.repetitions):
                order = SIZES if rep % 2 == 0 else SIZES[::-1]
                reps.append({size: one_run(work, env, admin, size, f"{size.replace('-', '')}-{rep}") for size in order})
        finally:
            stop(info.state_dir)
    ratios = [rep["v2-8"]["steps_per_s"] / rep["v2-32"]["steps_per_s"] for rep in reps
              if rep["v2-8"]["steps_per_s"] and rep["v2-32"]["steps_per_s"]]
    figures = {"repetitions": args.repetitions, "steps": args.steps, "runs": reps,
               "steps_per_s": {size: median([rep[size]["steps_per_s"] for rep in reps]) for size in SIZES},
               "ratio": median(ratios), "ratio_spread": sorted(round(value, 3) for value in ratios)}

    def shape(size: str) -> str:
        first = reps[0][size]
        return f"{first['replicas']} x {first['accumulation']} micro-batches of 8"

    table = result_file.Table(
        f"Global batch 256 on the emulator (digits CNN, {args.steps} steps a run; steps/s, medians of "
        f"{args.repetitions})",
        ["size", "replicas x accumulation", "steps/s", "per repetition", "v2-8 / v2-32"],
        [[size, shape(size), str(figures["steps_per_s"][size]),
          ", ".join(str(rep[size]["steps_per_s"]) for rep in reps), str(figures["ratio"]) if size == "v2-8" else ""]
         for size in SIZES])
    return figures, [table]


# ----- part "step": the agent's training call alone, on one CPU replica -----------------------------------------


def runner(batch: int, accumulation: int) -> Callable[[int], float]:
    """A function training ``steps`` optimizer steps of ``batch`` examples; returns their seconds."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]
    import numpy as np
    import tensorflow as tf
    from models import cifar10_cnn

    from tpuops.agent.steps import Steps, make_optimizer
    from tpuops.contract.runspec import TrainSpec

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


def in_process(args: argparse.Namespace) -> tuple[dict[str, Any], list[result_file.Table]]:
    whole, accumulated = runner(args.batch, 1), runner(args.batch, args.accumulation)
    rates: dict[str, list[float]] = {"whole": [], "accumulated": []}
    for repeat in range(args.repetitions):
        order = [("whole", whole), ("accumulated", accumulated)]
        for name, train in order if repeat % 2 == 0 else order[::-1]:
            rates[name].append(args.steps / train(args.steps))
    ratios = [rates["accumulated"][repeat] / rates["whole"][repeat] for repeat in range(args.repetitions)]
    figures = {
        "batch": args.batch, "accumulation": args.accumulation, "steps": args.steps, "repetitions": args.repetitions,
        "whole_steps_per_s": median(rates["whole"]), "accumulated_steps_per_s": median(rates["accumulated"]),
        "ratio": median(ratios), "ratio_spread": [round(value, 3) for value in sorted(ratios)],
    }
    table = result_file.Table(
        f"Global batch {args.batch} per step on one CPU replica (steps/s, medians of {args.repetitions})",
        ["at once", f"{args.accumulation} micro-batches", "ratio", "ratio per repetition"],
        [[str(figures["whole_steps_per_s"]), str(figures["accumulated_steps_per_s"]), str(figures["ratio"]),
          ", ".join(map(str, figures["ratio_spread"]))]])
    return figures, [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step", action="store_true", help="part step: the agent's call alone (run by the TF venv)")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--steps", type=int, help="steps a run (emulator, default 300) or a timed block (step, 40)")
    parser.add_argument("--batch", type=int, default=256, help="step: the global batch of every optimizer step")
    parser.add_argument("--accumulation", type=int, default=4, help="step: the micro-batches of an accumulated step")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    result_file.add_argument(parser)
    args = parser.parse_args()
    if args.repetitions < 1 or (args.steps is not None and (args.steps < STEPS_PER_CALL
                                                            or args.steps % STEPS_PER_CALL)):
        parser.error(f"--repetitions must be >= 1 and --steps a positive multiple of {STEPS_PER_CALL}")
    part = "step" if args.step else "emulator"
    args.steps = args.steps or (40 if args.step else 300)
    measuring = result_file.Run("bench_accumulation")
    figures, tables = (in_process if args.step else on_emulator)(args)
    if args.result:
        print(measuring.write(figures, tables, part=part), file=sys.stderr)
    if args.json:
        print(json.dumps(figures, indent=1, allow_nan=False))
    else:
        for table in tables:
            print(table.caption)
            for row in [table.columns, *table.rows]:
                print("  ".join(f"{cell:>24}" for cell in row))


if __name__ == "__main__":
    main()
