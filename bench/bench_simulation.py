"""The simulation's own speed: simulated seconds per CPU second on a 1,000-trial sweep, and Optuna's share of it.

    .venv/bin/python bench/bench_simulation.py [--trials 1000] [--parallel 50] [--repetitions 3] [--json] [--result]

What the fault swarm can reach is seeds per minute, and a seed is a whole simulation (``tpuops.sim``): the real
controller, sweep passes, Fleet, ledger and store over the simulated cloud, on one virtual clock. Measured here:
``tpuops simulate`` of ``sweeps/digits_lr.yaml`` grown to ``--trials`` trials, ``--parallel`` at a time (the
digits CNN's 600 steps, median pruner, budget too large to bind), a pass every 300 s as cron runs it, once with
Optuna's random sampler and once with TPE, each repetition with its own seed (0, 1, ...) in a fresh process
(``api.simulate``, what the command calls, in a child of this script).

Per sampler and repetition: the simulated seconds; the CPU time of the simulation loop (``SimReport.cpu_s``, the
process's CPU time from the first pass to the last: what a seed of the swarm costs) and of the whole child
process (imports and setting up included); their ratio, the speed-up (goal with the random sampler: >= 1,000x,
in CPU time because the machine is shared and wall time moves with the others' load); and the CPU time spent
inside Optuna's ``Study.ask`` (the sampler's work: TPE fits its model there), per trial and as a share of the
loop's CPU time. A real sweep pays the same ask per trial (once per trial, on the controller's machine), so
TPE's share is reported apart, with the speed-up the simulation would have without it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import result_file

ROOT = Path(__file__).resolve().parents[1]
SAMPLERS = ("random", "tpe")
GOAL = 1000.0
"""Simulated seconds per CPU second of the simulation loop, with the random sampler (issue 38, scope 5)."""
CRON_S = 300.0
CHILD_TIMEOUT_S = 900.0


def project(work: Path, sampler: str, trials: int, parallel: int) -> Path:
    """The sweep file of one measurement in ``work`` (see the module docstring), with ``sampler``."""
    from bench_faults import SWEEP_ZONES, sweep_project  # the parent's alone: the child measured imports neither

    sweep = sweep_project(work, trials, parallel)
    text = sweep.read_text()
    if "type: tpe" not in text:
        raise SystemExit("sweeps/digits_lr.yaml no longer says 'type: tpe': update bench_simulation.project")
    sweep.write_text(text.replace("type: tpe", f"type: {sampler}"))
    (work / "tpuops.toml").write_text(f"zones = {json.dumps(list(SWEEP_ZONES))}\n")
    return sweep


def child(sweep: Path, seed: int) -> dict[str, Any]:
    """One simulation in this process (the child's side): the report's figures and the CPU time inside Optuna's
    ask. ``Study.ask`` is timed by wrapping it: the bench measures, it changes nothing Optuna does."""
    import optuna

    from tpuops import api
    from tpuops.config import load_settings

    asked = {"cpu_s": 0.0, "calls": 0}
    ask = optuna.study.Study.ask

    def timed(study: optuna.Study, *args: Any, **kwargs: Any) -> optuna.trial.Trial:
        began = time.process_time()
        try:
            return ask(study, *args, **kwargs)
        finally:
            asked["cpu_s"] += time.process_time() - began
            asked["calls"] += 1

    optuna.study.Study.ask = timed  # type: ignore[method-assign]
    report = api.simulate(load_settings(), sweep, seed=seed, cron_s=CRON_S)
    trials = report.runs
    return {"simulated_s": report.simulated_s, "cpu_s": report.cpu_s, "wall_s": report.wall_s,
            "passes": report.passes, "ended": report.ended, "trials_run": len(trials),
            "succeeded": sum(r.outcome == "succeeded" for r in trials), "usd": report.usd,
            "ledger_usd": report.ledger_usd, "ask_cpu_s": asked["cpu_s"], "asks": asked["calls"]}


def measure(work: Path, sampler: str, seed: int, trials: int, parallel: int) -> dict[str, Any]:
    """One repetition in a fresh process: what ``child`` saw, with the whole process's CPU time."""
    folder = work / f"{sampler}-{seed}"
    folder.mkdir(parents=True)
    sweep = project(folder, sampler, trials, parallel)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    env.update(TPUOPS_HOME=str(folder / "home"), TPUOPS_CONFIG=str(folder / "tpuops.toml"),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, __file__, "--child", str(sweep), "--seed", str(seed)], cwd=folder, env=env,
                          check=False, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(folder, ignore_errors=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"seed": seed, "exit": done.returncode, "line": lines[-1] if lines else ""}
    seen = json.loads(done.stdout)
    process_cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    loop = seen["cpu_s"]
    return {"seed": seed, "exit": 0, **{k: round(v, 4) if isinstance(v, float) else v for k, v in seen.items()},
            "process_cpu_s": round(process_cpu_s, 3),
            "speedup": round(seen["simulated_s"] / loop, 1),
            "process_speedup": round(seen["simulated_s"] / process_cpu_s, 1),
            "ask_ms_per_trial": round(1000 * seen["ask_cpu_s"] / max(1, seen["asks"]), 2),
            "ask_share": round(seen["ask_cpu_s"] / loop, 4),
            "speedup_without_ask": round(seen["simulated_s"] / max(1e-9, loop - seen["ask_cpu_s"]), 1)}


def summary(seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and ranges) over the repetitions that ran; ``met``: every repetition ran and reached the goal."""
    good = [s for s in seen if s["exit"] == 0]
    if not good:
        return {"ran": 0, "repetitions": seen, "met": False}

    def spread(key: str) -> dict[str, float]:
        values = [s[key] for s in good]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    keys = ("speedup", "process_speedup", "cpu_s", "process_cpu_s", "simulated_s", "ask_ms_per_trial", "ask_share",
            "speedup_without_ask")
    return {"ran": len(good), **{key: spread(key) for key in keys},
            "ended": all(s["ended"] for s in good), "met": len(good) == len(seen) and all(
                s["speedup"] >= GOAL for s in good), "repetitions": seen}


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


COLUMNS = ("sampler", "speed-up (loop CPU)", "range", "loop CPU s", "process CPU s (speed-up)", "simulated h",
           "Optuna ask per trial", "ask share of loop CPU", "speed-up without ask", "goal", "")


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """The console's and the result file's rows: one per sampler, medians over the repetitions."""
    rows = []
    for sampler, s in report["samplers"].items():
        goal = f">= {GOAL:,.0f}x" if sampler == "random" else "reported apart"
        verdict = ("met" if s["met"] else "MISSED") if sampler == "random" else ""
        if not s["ran"]:
            rows.append([sampler, f"failed: {s['repetitions'][0].get('line', '')}"[:120], "", "", "", "", "", "", "",
                         goal, "MISSED" if sampler == "random" else ""])
            continue
        rows.append([sampler, f"{s['speedup']['median']:,.0f}x",
                     f"{s['speedup']['min']:,.0f}-{s['speedup']['max']:,.0f}x", f"{s['cpu_s']['median']:.2f}",
                     f"{s['process_cpu_s']['median']:.2f} ({s['process_speedup']['median']:,.0f}x)",
                     f"{s['simulated_s']['median'] / 3600:.2f}", f"{s['ask_ms_per_trial']['median']:.2f} ms",
                     f"{100 * s['ask_share']['median']:.1f} %", f"{s['speedup_without_ask']['median']:,.0f}x",
                     goal, verdict])
    return rows


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"simulated {report['trials']}-trial sweep, {report['parallel']} at a time, "
                        f"medians of {report['repetitions']}")
    for column in COLUMNS:
        table.add_column(column)
    for row in table_rows(report):
        table.add_row(*row)
    Console(width=220).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=50)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--sampler", action="append", choices=SAMPLERS, help="only this sampler (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    result_file.add_argument(parser)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.seed)))
        return
    measuring = result_file.Run("bench_simulation")
    began = time.monotonic()
    samplers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-simulation-") as tmp:
        for sampler in [s for s in SAMPLERS if s in (args.sampler or SAMPLERS)]:
            seen = []
            for seed in range(args.repetitions):
                seen.append(measure(Path(tmp), sampler, seed, args.trials, args.parallel))
                progress(f"{sampler}, seed {seed}: {seen[-1]}")
            samplers[sampler] = summary(seen)
    report = {"trials": args.trials, "parallel": args.parallel, "repetitions": args.repetitions, "cron_s": CRON_S,
              "seconds": round(time.monotonic() - began), "samplers": samplers}
    if args.result:
        measuring.write(report, [result_file.Table(
            f"simulated {args.trials}-trial sweep, {args.parallel} at a time, medians of {args.repetitions}",
            list(COLUMNS), table_rows(report))])
    if args.json:
        print(json.dumps(report, indent=1, allow_nan=False))
    else:
        render(report)


if __name__ == "__main__":
    main()
