"""Detection latency (issue 23, scope 5): time to result under cron, ``watch`` and the wake-up.

    .venv/bin/python bench/bench_detection.py [--repetitions 3] [--skip-emulator | --skip-simulator] [--json]

Simulator: a 24-hour job (10 steps/s, 10-min checkpoints, 10-s saves, 2-min setup, 20-s restore, a v3-8
READY 90 s after its create) preempted 11 times: every spot node is preempted at the same READY age
(``CloudModel.lifetime``, 7,800 s), so every mode meets exactly 11 preemptions and differs only in when it
notices them. Modes: the scheduled reconcile every 5 minutes (the baseline), ``watch`` every 30 s, and each
with the wake-up (``tpuops.sim.engine.WakeUp``): locally ``watch`` lists the markers every second (first
hurried pass 1 s after the marker); on Google Cloud the agent starts the reconcile Cloud Run job, whose
start-up is ASSUMED to take 20 s (not measured: Google cannot be reached from here). Reported per mode:
hours to the result, the extra time per preemption against the same job never preempted, and the ratio of
time to result against cron. Repetitions use other seeds (the READY and delete latencies are drawn).

Emulator: one real run per mode (digits CNN, real TF 2.9 agent, the local emulator), preempted 3 times at
fixed steps, recovered by ``tpuops watch`` (``api.watch``) every 30 s without and with the wake-up.
Reported: seconds from launch to the run's end and, per preemption, from the notice to the replacement
create (the controller's events).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import result_file

from tpuops.config import Settings, load_settings
from tpuops.providers.cloud_model import CloudModel, Latency
from tpuops.sim.calibrate import replicas
from tpuops.sim.engine import Simulation, WakeUp
from tpuops.sim.model import AgentModel, Segments

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

DAY_JOB = AgentModel(total_steps=24 * 3600 * 10, steps_per_s=10,
                     segments=Segments(setup_s=120, checkpoint_every_s=600, save_s=10, restore_s=20))
LIFETIME_S = 7800.0
"""READY age at which every spot node is preempted: 11 preemptions for the day job (12 attempts)."""
CLOUD_RUN_START_S = 20.0
"""ASSUMED start-up of a Cloud Run job execution (jobs.run to the container's first pass)."""
MODES = {
    "cron 5 min": (300.0, None),
    "watch 30 s": (30.0, None),
    "cron 5 min + wake-up (Cloud Run job)": (300.0, WakeUp(delay_s=CLOUD_RUN_START_S)),
    "watch 30 s + wake-up": (30.0, WakeUp(delay_s=1.0)),
}


def _settings(work: Path) -> Settings:
    work.mkdir(parents=True, exist_ok=True)
    (work / "tpuops.toml").write_text("")
    return load_settings(config_path=work / "tpuops.toml", environ={"TPUOPS_HOME": str(work / "home"),
                                                                    "TPUOPS_ZONES": "us-central1-a"})


def simulate_day(cron_s: float, wake: WakeUp | None, seed: int, preempted: bool = True) -> dict[str, Any]:
    """One day job under one mode: hours to result, preemptions, simulation speed."""
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        settings = _settings(work)
        cloud = CloudModel(spot_hazard_per_hour=0.0, lifetime=Latency(LIFETIME_S, 0.0) if preempted else None)
        sim = Simulation(settings, work / "world", cloud, DAY_JOB, cron_s=cron_s, seed=seed, wake=wake)
        sim.declare(replicas(settings, 1, prefix="day"))
        report = sim.run(max_hours=24 * 3)
    (run,) = report.runs
    return {"hours_to_result": run.hours_to_result, "preemptions": run.preemptions, "usd": run.usd,
            "speedup": report.speedup, "passes": report.passes}


def simulator_table(repetitions: int) -> list[dict[str, Any]]:
    rows = []
    cron = {}
    for label, (cron_s, wake) in MODES.items():
        results = [simulate_day(cron_s, wake, seed) for seed in range(repetitions)]
        ideal = [simulate_day(cron_s, wake, seed, preempted=False) for seed in range(repetitions)]
        hours = [r["hours_to_result"] for r in results]
        lost = [(r["hours_to_result"] - i["hours_to_result"]) * 3600 / max(1, r["preemptions"])
                for r, i in zip(results, ideal, strict=True)]
        cron.setdefault("hours", hours)
        rows.append({"mode": label, "pass_every_s": cron_s, "wake_delay_s": wake.delay_s if wake else None,
                     "preemptions": sorted({r["preemptions"] for r in results}),
                     "hours_to_result": _spread(hours),
                     "seconds_lost_per_preemption": _spread(lost),
                     "vs_cron": _spread([h / c for h, c in zip(hours, cron["hours"], strict=True)]),
                     "passes": _spread([float(r["passes"]) for r in results]),
                     "speedup": _spread([r["speedup"] for r in results])})
    return rows


EMULATOR_STEPS = 2400
EMULATOR_PREEMPTIONS = 3
WATCH_S = 30.0


def emulator_run(w: Any, work: Path, spec: Path, run_id: str, wake: bool) -> dict[str, Any]:
    """One detached run recovered by ``api.watch`` every 30 s (with or without the wake-up), preempted evenly."""
    import dataclasses

    from bench_controller import PROJECT, TF_ZONE
    from helpers import watching  # test-only helper (tests/helpers.py): api.watch in a thread

    from tpuops import runs
    from tpuops.launch.jobs import declare, plan_train

    plan = plan_train(w.settings, spec, w.store, run_id=run_id, base_dir=work)
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, heartbeat_seconds=0.25))
    launched = time.time()
    declare(plan, w.store, w.settings, lambda _text: None)
    with watching(w.settings, WATCH_S, wake=wake) as failures:
        preempted_at: list[float] = []
        deadline = time.monotonic() + 1800
        while not runs.load_memory(w.store, run_id)[0].finished:
            if time.monotonic() > deadline or failures:
                raise SystemExit(f"bench: run {run_id} did not finish within 30 min ({failures})")
            status = runs.read_status(w.store, run_id)
            due = EMULATOR_STEPS * (len(preempted_at) + 1) // (EMULATOR_PREEMPTIONS + 1)
            if len(preempted_at) < EMULATOR_PREEMPTIONS and status is not None and \
                    status.attempt == len(preempted_at) + 1 and status.step >= due and status.exit_class is None:
                preempted_at.append(time.time())
                w.admin.preempt(PROJECT, TF_ZONE, run_id, grace_s=30.0)
            time.sleep(0.1)
    memory = runs.load_memory(w.store, run_id)[0]
    creates = [e["at"] for e in memory.events if e["kind"] == "create"][1:]
    finished = next(e["at"] for e in memory.events if e["kind"] == "finished")
    return {"mode": "watch 30 s + wake-up" if wake else "watch 30 s", "outcome": str(memory.outcome),
            "preemptions": memory.preemptions, "seconds_to_result": finished - launched,
            "notice_to_create_s": [c - p for p, c in zip(preempted_at, creates, strict=False)]}


def emulator_table() -> list[dict[str, Any]]:
    """One real run per mode on the local emulator (real TF 2.9 agent), the same spec and preemption steps."""
    from bench_controller import TF_PYTHON, TF_ZONE, digits_spec, world

    from tpuops.data.samples import digits

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-detection-") as tmp:
        work = Path(tmp)
        digits(work / "data" / "digits", overwrite=True)
        spec = digits_spec(work, EMULATOR_STEPS, 600)
        emulator = {"boot_delay_s": 0.5, "grace_s": 30.0, "image_python": str(TF_PYTHON)}
        with world(work / "home", [TF_ZONE], emulator, poll_interval_s=0.2) as w:
            for index, wake in enumerate((False, True)):
                rows.append(emulator_run(w, work, spec, f"detect-{index}", wake))
    return rows


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _cell(spread: dict[str, float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(spread['median'])} ({fmt.format(spread['min'])}-{fmt.format(spread['max'])})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--skip-emulator", action="store_true")
    parser.add_argument("--skip-simulator", action="store_true",
                        help="the emulator runs only (the two parts fit one shared-machine slot each)")
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_detection")
    started = time.perf_counter()
    out: dict[str, Any] = {}
    if not args.skip_simulator:
        out["simulator"] = simulator_table(args.repetitions)
    if not args.skip_emulator:
        out["emulator"] = emulator_table()
    out["bench_wall_s"] = round(time.perf_counter() - started, 1)
    if args.result:
        tables = []
        if "simulator" in out:
            tables.append(result_file.Table(
                f"24-h job, 11 preemptions, simulator, {args.repetitions} seeds: median (min-max).",
                ["mode", "preemptions", "hours to result", "s lost per preemption", "vs cron", "speed vs real time"],
                [[row["mode"], ",".join(map(str, row["preemptions"])), _cell(row["hours_to_result"]),
                  _cell(row["seconds_lost_per_preemption"], "{:.0f}"), _cell(row["vs_cron"]),
                  _cell(row["speedup"], "{:,.0f}x")] for row in out["simulator"]]))
        if "emulator" in out:
            tables.append(result_file.Table(
                "One real emulator run per mode (digits CNN, 3 preemptions, watch every 30 s).",
                ["mode", "seconds to result", "notice -> replacement create, each preemption (s)"],
                [[row["mode"], f"{row['seconds_to_result']:.1f}",
                  ", ".join(f"{s:.1f}" for s in row["notice_to_create_s"])] for row in out["emulator"]]))
        part = "" if len(tables) == 2 else "simulator" if "simulator" in out else "emulator"
        measuring.write(out, tables, part=part)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    if "simulator" in out:
        table = Table(title=f"24-h job, 11 preemptions, simulator, {args.repetitions} seeds (median (min-max))")
        for column in ("mode", "preemptions", "hours to result", "s lost per preemption", "vs cron", "speed-up"):
            table.add_column(column)
        for row in out["simulator"]:
            table.add_row(row["mode"], ",".join(map(str, row["preemptions"])), _cell(row["hours_to_result"]),
                          _cell(row["seconds_lost_per_preemption"], "{:.0f}"), _cell(row["vs_cron"]),
                          _cell(row["speedup"], "{:,.0f}x"))
        console.print(table)
    if "emulator" in out:
        real = Table(title="one real emulator run per mode (digits CNN, 3 preemptions, watch every 30 s)")
        for column in ("mode", "seconds to result", "notice -> replacement create, s (each preemption)"):
            real.add_column(column)
        for row in out["emulator"]:
            real.add_row(row["mode"], f"{row['seconds_to_result']:.1f}",
                         ", ".join(f"{s:.1f}" for s in row["notice_to_create_s"]))
        console.print(real)


if __name__ == "__main__":
    main()
