"""Forecast calibration (issue 23, scope 7): the simulator, set to the emulator's timings, against real emulator runs.

    .venv/bin/python bench/bench_calibration.py [--runs 20] [--wave 5] [--steps 300] [--per-minute 0.5]
        [--repetitions 1] [--json]

Real side: ``--runs`` digits CNN runs (real TF 2.9 agent) on the local emulator, ``--wave`` at a time,
recovered by ``tpuops watch`` (``api.watch``, a pass every 2 s, with the wake-up) while the emulator
preempts READY spot nodes at random (``preempt_rate_per_s``, seeded). Per run: wall time from its first
create to its agent's success, cost from the emulator's billing records (a spot node preempted within
a minute of its create is free), preemptions.

Simulated side (``tpuops.sim.calibrate``): the same job on the simulator set to this session's measured
timings (each run's last attempt, first attempts and replacements apart, a replacement by when it started;
40 worlds of 5 runs or more, every first attempt in as many), the emulator's hazard and grace, a node that
ends when its agent exits (a notice during the TensorFlow import waits for it), create -> READY, the
agent's exit and the node's self-delete as this session timed them, the same pass interval and wake-up.
Reported: how many runs fall inside the forecast's p10-p90 band for wall time and cost (goal: at least
16 of 20 for both) and how likely that few would be for an exact forecast (``coverage_p``), and the
median absolute error against the p50 (goal <= 10 %) beside the one an exact forecast would score
(the floor the outcome's own spread sets). A calibrated forecast puts a run inside p10-p90 with
probability 0.8, so one band's count goal is met with probability 0.63 even by an exact simulator (see
``tpuops.sim.calibrate``); inside both bands is rarer still (``Forecast.both_chance``, 0.61-0.67 here: the
runs that miss the wall band are not those that miss the cost band), so beside the count inside both the
bench prints how likely so few would be for an exact forecast, and how likely the goal's 16 of 20 is for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import result_file
from bench_controller import TF_PYTHON, TF_ZONE, World, digits_spec, world
from bench_detection import watching

from tpuops import runs
from tpuops.billing.cost import catalog_for
from tpuops.data.samples import digits
from tpuops.launch.jobs import declare, plan_train
from tpuops.sim.calibrate import Session, coverage_p, forecast, score

PASS_S = 2.0
PER_MINUTE = 0.5
"""Preemptions per READY minute (``--per-minute``): at 0.5 about three runs in four meet none. At 1, the setup
measured first, two in five met one or more, so a session where half its runs met one came about once in
four even for an exact forecast, and its median run, hence its median error against the p50, was a
preempted one (18 % in such a session against 2-6 % in the others): the error goal then measured the
luck of the draw, not the simulator."""
GOAL_INSIDE = 16
"""Issue 23's goal: at least 16 of 20 runs inside both bands."""
GRACE_S = 30.0
"""The emulator's notice: a preempted node whose agent has not exited ends this long after it."""


def measure(w: World, work: Path, spec: Path, count: int, wave: int, seed: int, per_minute: float
            ) -> tuple[Session, dict[str, Any], dict[str, Any], str]:
    """Run ``count`` runs, ``wave`` at a time, under random preemptions; what the session measured, the runs'
    billing intervals and records (attempts, events, intervals: to re-score offline), by run, and their
    accelerator."""
    w.admin.set_faults(preempt_rate_per_s=per_minute / 60, seed=seed)
    ids = [f"calib-{seed}-{index:02d}" for index in range(count)]
    accelerator = ""
    started = time.monotonic()
    with watching(w.settings, PASS_S, wake=True) as failures:
        for first in range(0, count, wave):
            batch = ids[first:first + wave]
            for run_id in batch:
                plan = plan_train(w.settings, spec, w.store, run_id=run_id, base_dir=work)
                plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, heartbeat_seconds=0.5))
                declare(plan, w.store, w.settings, lambda _text: None)
                accelerator = plan.record.node.accelerator
            deadline = time.monotonic() + 900
            while not all(runs.load_memory(w.store, run_id)[0].finished for run_id in batch):
                if time.monotonic() > deadline or failures:
                    raise SystemExit(f"bench: runs {batch} did not finish within 15 min ({failures})")
                time.sleep(0.2)
            print(f"bench: {first + len(batch)}/{count} runs done ({time.monotonic() - started:.0f} s)",
                  file=sys.stderr)
    w.admin.set_faults(preempt_rate_per_s=0.0)
    session, billing, records = Session(), {}, {}
    billing_records, catalog = w.admin.billing(), catalog_for(w.settings)
    for run_id in ids:
        status = runs.read_status(w.store, run_id)
        if status is None:
            continue
        memory = runs.load_memory(w.store, run_id)[0]
        intervals = session.add_emulated(run_id, status, memory, billing_records, catalog)
        if not intervals:
            continue
        records[run_id] = {"attempts": [a.model_dump(mode="json") for a in status.attempts],
                           "resumed_from_step": status.resumed_from_step, "events": memory.events,
                           "intervals": intervals}
        first = intervals[0]["created_epoch"]
        billing[run_id] = [{"created_s": round(i["created_epoch"] - first, 2), "ready_s": round(i["seconds"], 2),
                            "billed_s": round(i["billed_seconds"], 2), "reason": i["end_reason"]} for i in intervals]
    return session, billing, records, accelerator


def calibrate(count: int, wave: int, steps: int, seed: int, per_minute: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-calibration-") as tmp:
        work = Path(tmp)
        digits(work / "data" / "digits", overwrite=True)
        spec = digits_spec(work, steps, max(1, steps // 3))
        emulator = {"boot_delay_s": 0.2, "grace_s": GRACE_S, "image_python": str(TF_PYTHON)}
        with world(work / "home", [TF_ZONE], emulator, poll_interval_s=0.2) as w:
            began = time.monotonic()
            session, billing, records, accelerator = measure(w, work, spec, count, wave, seed, per_minute)
            real_s = time.monotonic() - began
            began = time.monotonic()
            settings = w.settings.model_copy(update={"accelerator": accelerator})
            predicted = forecast(settings, session.profiles, steps, session.cloud(per_minute, GRACE_S),
                                 pass_every_s=PASS_S, wake=session.wake(PASS_S), exit_s=session.agent_exit_s,
                                 seed=seed)
            sim_s = time.monotonic() - began
    scored = score(session.measured, predicted)
    cloud = session.cloud(per_minute, GRACE_S)
    return {"runs": count, "wave": wave, "steps": steps, "seed": seed, "preemptions_per_ready_minute": per_minute,
            "real_wall_s": round(real_s, 1),
            "simulation_wall_s": round(sim_s, 1), "forecast": {
                "seconds": predicted.seconds.to_json(), "usd": predicted.usd.to_json(),
                "expected_preemptions": round(predicted.preemptions, 3), "simulated_runs": predicted.simulated,
                "floor_median_abs_error_seconds": round(predicted.floor_seconds, 4),
                "floor_median_abs_error_usd": round(predicted.floor_usd, 4),
                "both_chance": round(predicted.both_chance, 3)},
            "score": {**scored.to_json(),
                      "coverage_p_seconds": round(coverage_p(scored.seconds_inside, scored.runs), 4),
                      "coverage_p_usd": round(coverage_p(scored.usd_inside, scored.runs), 4),
                      "coverage_p_both": round(coverage_p(scored.inside, scored.runs, predicted.both_chance), 4),
                      "goal_chance_exact": round(1 - coverage_p(GOAL_INSIDE - 1, scored.runs, predicted.both_chance),
                                                 4)},
            "self_delete_s": {"median": round(cloud.self_delete.median_s, 2),
                              "sigma": round(cloud.self_delete.sigma, 3), "samples": len(session.self_delete_s)},
            "agent_exit_s": round(session.agent_exit_s, 2),
            "recovery_s": round(statistics.median(session.recovery_s), 2) if session.recovery_s else None,
            "measured": [{"run_id": m.run_id, "seconds": round(m.seconds, 2), "usd": round(m.usd, 6),
                          "preemptions": m.preemptions, "billing": billing.get(m.run_id)} for m in session.measured],
            "profiles": [{"attempt": p.attempt, "offset_s": round(p.offset_s, 2), "setup_s": round(p.pace.setup_s, 2),
                          "listen_s": round(p.pace.listen_s or 0.0, 2), "steps_per_s": round(p.pace.steps_per_s, 1),
                          "final_s": round(p.pace.final_s or 0.0, 2)} for p in session.profiles],
            "records": records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--wave", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--per-minute", type=float, default=PER_MINUTE, help="preemptions per READY minute")
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_calibration")
    if not 0 <= args.per_minute <= 6000:  # the emulator's preempt_rate_per_s is within [0, 100]
        parser.error(f"--per-minute {args.per_minute:g} is not a rate between 0 and 6000 preemptions per READY minute")
    out = [calibrate(args.runs, args.wave, args.steps, seed, args.per_minute) for seed in range(args.repetitions)]
    if args.result:
        measuring.write({"sessions": out})
    if args.json:
        print(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=220)
    table = Table(title=f"forecast calibration: {args.runs} digits runs on the emulator, {args.per_minute:g} "
                        "preemptions per READY minute")
    for column in ("seed", "p10-p50-p90 wall s", "p10-p50-p90 USD", "inside both / wall / cost",
                   "P(<= inside) both / wall / cost", "exact: inside both, P(goal)",
                   "median abs error wall / cost (exact forecast's)",
                   "preemptions measured (forecast mean)", "self-delete s", "real s"):
        table.add_column(column)
    for row in out:
        f, s = row["forecast"], row["score"]
        table.add_row(str(row["seed"]), "-".join(f"{f['seconds'][k]:.1f}" for k in ("p10", "p50", "p90")),
                      "-".join(f"{f['usd'][k]:.5f}" for k in ("p10", "p50", "p90")),
                      f"{s['inside_both']} / {s['seconds_inside']} / {s['usd_inside']} of {s['runs']}",
                      f"{s['coverage_p_both']:.3f} / {s['coverage_p_seconds']:.3f} / {s['coverage_p_usd']:.3f}",
                      f"{f['both_chance']:.2f}, {s['goal_chance_exact']:.2f}",
                      f"{s['median_abs_error_seconds']:.1%} / {s['median_abs_error_usd']:.1%} "
                      f"({f['floor_median_abs_error_seconds']:.1%} / {f['floor_median_abs_error_usd']:.1%})",
                      f"{sum(m['preemptions'] for m in row['measured']) / max(1, len(row['measured'])):.2f} "
                      f"({f['expected_preemptions']:.2f})", f"{row['self_delete_s']['median']:.2f}",
                      f"{row['real_wall_s']:.0f}")
    console.print(table)


if __name__ == "__main__":
    main()
