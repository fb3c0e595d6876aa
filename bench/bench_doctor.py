"""How long ``tpuops doctor`` takes against the local emulator (goal: under 3 s wall).

Three ways, side by side in one run, 3 repetitions each, medians: the CLI as a user runs it
(``tpuops doctor --json`` in a fresh process: interpreter start and imports included), the
library with its checks in parallel (what the CLI does), and the baseline of the same checks
one after another. Every run must report all OK (a healthy local setup), or the bench fails.

    .venv/bin/python bench/bench_doctor.py [--json] [--result]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import result_file

from tpuops import emulator
from tpuops.config import load_settings
from tpuops.doctor import exit_code, run_checks

REPS = 3
ROOT = Path(__file__).resolve().parents[1]


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_doctor")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        config = home / "tpuops.toml"
        config.write_text(f'zones = ["us-central1-a", "us-central1-b"]\nstore = "{home / "store"}"\n')
        env = {**os.environ, "TPUOPS_HOME": str(home), "TPUOPS_CONFIG": str(config)}
        env.pop("TPUOPS_TPU_ENDPOINT", None)
        os.environ.update(TPUOPS_HOME=str(home), TPUOPS_CONFIG=str(config))
        emulator.start_background(home / "emulator", boot_delay_s=0.1)
        try:
            settings = load_settings()

            def cli() -> None:
                done = subprocess.run([sys.executable, "-m", "tpuops", "doctor", "--json"], env=env, cwd=ROOT,
                                      capture_output=True, text=True, check=False)
                assert done.returncode == 0, done.stdout + done.stderr

            def library(parallel: bool) -> None:
                assert exit_code(run_checks(settings, parallel=parallel)) == 0

            rows = {
                "tpuops doctor (CLI, fresh process)": [_timed(cli) for _ in range(REPS)],
                "run_checks, parallel (library)": [_timed(lambda: library(True)) for _ in range(REPS)],
                "baseline: run_checks one by one": [_timed(lambda: library(False)) for _ in range(REPS)],
            }
        finally:
            emulator.stop(home / "emulator")
    medians = {name: statistics.median(times) for name, times in rows.items()}
    figures = {"reps": REPS, "goal_s": 3.0, "median_s": medians, "runs_s": rows}
    if args.result:
        goal = "met" if medians["tpuops doctor (CLI, fresh process)"] < 3.0 else "not met"
        measuring.write(figures, [result_file.Table(
            f"Healthy local setup (every check OK), {REPS} repetitions, medians; goal for the CLI: under 3 s ({goal}).",
            ["what", "median s", "runs (s)"],
            [[name, f"{medians[name]:.2f}", ", ".join(f"{t:.2f}" for t in times)] for name, times in rows.items()])])
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"{'what':40} {'median s':>9}   runs (s)          goal < 3 s")
    for name, times in rows.items():
        print(f"{name:40} {medians[name]:9.2f}   {', '.join(f'{t:.2f}' for t in times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
