"""Goodput of a digits run on the emulator with 0, 1 and 3 preemptions, one recovery's timeline, a 24-h projection.

Run:  .venv/bin/python bench/bench_goodput.py [--steps 90000] [--repeats 3] [--json]

Each repetition trains the digits CNN (``experiments/digits_cnn.yaml`` lengthened to ``--steps``
steps, about three minutes billed on this machine, a checkpoint every 2,000 steps) three times,
driven like ``tpuops train`` on an emulator whose nodes boot in 2 s: without preemption, and
preempted by SIGTERM (30-s notice: the agent checkpoints and exits) once and three times, evenly
spaced in steps. Every figure comes from what a user sees: the run's goodput split
(``tpuops.accounting.goodput``: the ledger's billed READY time, the agent's attempt clocks) and the
emulator's billing record (the truth the ledger is compared with).

- goodput = productive / billed per scenario (medians of the repetitions), and goodput with
  three preemptions as a share of the uninterrupted run's (goal >= 0.9), and the billed seconds
  each preemption adds (``billed_s_per_preemption``: the 3-preemption run's billed time minus the
  uninterrupted one's of the same repetition, over 3), which does not depend on the run's length;
- the first recovery of a preempted run, stage by stage from the preemption: PREEMPTED (billing
  stops), noticed (the controller's "preempted" event), create (its "create" event), READY
  (billing restarts), startup script, agent process, agent (TensorFlow imported), model
  restored, first step (completed: the agent's ``first_step_at``, the end of the replacement's
  first training call, its tracing and compilation included); ``recovery_overhead_s`` =
  PREEMPTED -> READY minus the emulated boot: what the control plane adds (goal < 3 s);
  ``recovery_to_first_step_s`` = PREEMPTED -> first completed step, ``tf_import_s`` the
  replacement agent's process start -> agent start (its one TensorFlow import), and
  ``recovery_less_boot_and_import_s`` the rest;
- the ledger's billed seconds against the emulator's billing (goal within 2 %);
- a projection for a 24-hour job preempted every 2 hours at a real v3-8's boot time: READY
  90 s after the create (Cloud TPU VMs report READY in roughly 60-120 s; the middle is taken),
  everything else as measured here (setup, checkpoint and eval shares, the notice-to-READY
  overhead, the tail after the agent's end).

``--json`` prints one object whose keys name each figure (``goodput_0_preemptions``,
``goodput_1_preemption``, ``goodput_3_preemptions``, ``goodput_3_vs_0``, ``billed_s_per_preemption``,
``recovery_overhead_s``, ``recovery_to_first_step_s``, ``tf_import_s``,
``recovery_less_boot_and_import_s``, ``ledger_vs_billing``, ``projected_goodput_24h``, ``timeline``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import result_file
from bench_controller import PROJECT, TF_PYTHON, TF_ZONE, World, billing_of, digits_spec, world

from tpuops import runs
from tpuops.controller.drive import Finished, drive
from tpuops.core.formats import format_seconds
from tpuops.data.samples import digits
from tpuops.launch.jobs import declare, plan_train

BOOT_S = 2.0
GRACE_S = 30.0
CHECKPOINT_EVERY = 2000
HEARTBEAT_S = 1.0
DRIVE_POLL_S = 0.5
SCENARIOS = (0, 1, 3)
REAL_BOOT_S = 90.0
JOB_HOURS, PREEMPT_EVERY_HOURS = 24.0, 2.0
STAGES = ("PREEMPTED", "noticed", "create", "READY", "script", "process", "agent", "restored", "first step")


@dataclass
class Outcome:
    """One driven run: what the controller returned, the emulator's billing and when we preempted."""

    preemptions: int
    finished: Finished
    billing: list[dict[str, Any]]
    preempted_at: list[float] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        split = self.finished.goodput
        return split.goodput or 0.0 if split else 0.0

    @property
    def billed_truth_s(self) -> float:
        return sum(i["end_epoch"] - i["start_epoch"] for i in self.billing)

    def timeline(self) -> dict[str, float] | None:
        """The first recovery, each stage in seconds after the preemption (None without one)."""
        attempts = self.finished.status.attempts
        if not self.preempted_at or len(self.billing) < 2 or len(attempts) < 2:
            return None
        t0 = self.preempted_at[0]
        events = self.finished.memory.events
        noticed = next(e["at"] for e in events if e["kind"] == "preempted")
        created = next(e["at"] for e in events if e["kind"] == "create" and e["at"] >= noticed)
        second = attempts[1]
        moments = (self.billing[0]["end_epoch"], noticed, created, self.billing[1]["start_epoch"], second.started_at,
                   second.process_at, second.agent_at, second.loaded_at, second.first_step_at)
        return {stage: round((moment or t0) - t0, 2) for stage, moment in zip(STAGES, moments, strict=True)}


def drive_one(w: World, work: Path, spec: Path, run_id: str, preemptions: int, steps: int) -> Outcome:
    """Train one run like ``tpuops train``, preempting it ``preemptions`` times evenly over its steps."""
    plan = plan_train(w.settings, spec, w.store, run_id=run_id, base_dir=work)
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, heartbeat_seconds=HEARTBEAT_S))
    declare(plan, w.store, w.settings, lambda _text: None)
    result: list[Finished] = []
    failures: list[BaseException] = []

    def drive_run() -> None:
        try:
            result.append(drive(w.controller(), run_id, poll_s=DRIVE_POLL_S, on_status=lambda _s: None))
        except BaseException as err:  # re-raised in the main thread
            failures.append(err)

    thread = threading.Thread(target=drive_run, name=f"drive-{run_id}", daemon=True)
    thread.start()
    preempted_at: list[float] = []
    deadline = time.monotonic() + 1800
    while thread.is_alive():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: run {run_id} did not finish within 30 min")
        done = len(preempted_at)
        if done < preemptions:
            status = runs.read_status(w.store, run_id)
            due = steps * (done + 1) // (preemptions + 1)
            if status is not None and status.attempt == done + 1 and status.step >= due and \
                    status.exit_class is None and str(status.phase) == "training":
                preempted_at.append(time.time())
                w.admin.preempt(PROJECT, TF_ZONE, run_id, grace_s=GRACE_S)
        thread.join(0.1)
    if failures:
        raise failures[0]
    return Outcome(preemptions, result[0], billing_of(w.admin, run_id), preempted_at)


def projection(outcome: Outcome) -> dict[str, float]:
    """Goodput of a 24-h job preempted every 2 h, from one preempted run's measured segments."""
    split = outcome.finished.goodput
    attempts = outcome.finished.status.attempts
    timeline = outcome.timeline()
    assert split is not None and timeline is not None
    productive = split.productive_s
    per_productive = (split.checkpoint_s + split.eval_s) / productive  # checkpoints and evals scale with work
    setup = statistics.median(a.setup_s for a in attempts[1:])
    control = timeline["READY"] - timeline["PREEMPTED"] - BOOT_S
    tail = split.idle_after_end_s / len(attempts)
    work = JOB_HOURS * 3600
    restarts = int(JOB_HOURS / PREEMPT_EVERY_HOURS) - 1
    billed = (work * (1 + per_productive) + (restarts + 1) * (REAL_BOOT_S + setup + tail) + restarts * control
              + split.save_s)
    return {"productive_h": round(work / 3600, 2), "billed_h": round(billed / 3600, 2),
            "goodput": round(work / billed, 4), "preemptions": restarts, "boot_s": REAL_BOOT_S,
            "setup_s": round(setup, 2), "control_s": round(control, 2), "tail_s": round(tail, 2),
            "checkpoint_eval_share": round(per_productive, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=90000, help="training steps per run (~3 min billed here)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_goodput")
    began = time.monotonic()
    outcomes: dict[int, list[Outcome]] = {k: [] for k in SCENARIOS}
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        work = Path(tmp)
        digits(work / "data" / "digits", overwrite=True)
        spec = digits_spec(work, args.steps, CHECKPOINT_EVERY)
        emulator = {"boot_delay_s": BOOT_S, "grace_s": GRACE_S, "image_python": str(TF_PYTHON)}
        with world(work / "home", [TF_ZONE], emulator, poll_interval_s=0.2) as w:
            for repeat in range(args.repeats):
                for k in SCENARIOS:
                    outcome = drive_one(w, work, spec, f"goodput-{k}p-{repeat}", k, args.steps)
                    outcomes[k].append(outcome)
                    print(f"bench: {k} preemption(s), repeat {repeat + 1}: goodput {outcome.goodput:.3f}, "
                          f"{outcome.finished.outcome.value} ({time.monotonic() - began:.0f} s)", file=sys.stderr)
    report = summarise(outcomes, args.steps, time.monotonic() - began)
    if args.result:
        measuring.write(report)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        render(report)


def summarise(outcomes: dict[int, list[Outcome]], steps: int, seconds: float) -> dict[str, Any]:
    med = statistics.median
    goodput = {k: med(o.goodput for o in outcomes[k]) for k in SCENARIOS}
    recoveries = [o for k in SCENARIOS if k for o in outcomes[k] if o.timeline() is not None]
    timelines = [o.timeline() or {} for o in recoveries]
    timeline = {stage: med(t[stage] for t in timelines) for stage in STAGES}
    splits = {k: [o.finished.goodput.to_json() for o in outcomes[k] if o.finished.goodput] for k in SCENARIOS}
    heaviest = next(o for o in reversed(outcomes[max(SCENARIOS)]) if o.timeline() is not None)
    return {
        "steps": steps, "repeats": len(outcomes[0]), "boot_delay_s": BOOT_S, "seconds": round(seconds),
        "goodput_0_preemptions": round(goodput[0], 4), "goodput_1_preemption": round(goodput[1], 4),
        "goodput_3_preemptions": round(goodput[3], 4), "goodput_3_vs_0": round(goodput[3] / goodput[0], 4),
        "billed_s_per_preemption": round(med((o3.finished.goodput.billed_s - o0.finished.goodput.billed_s) / 3
                                             for o0, o3 in zip(outcomes[0], outcomes[3], strict=True)
                                             if o0.finished.goodput and o3.finished.goodput), 2),
        "recovery_overhead_s": round(med(t["READY"] - t["PREEMPTED"] - BOOT_S for t in timelines), 2),
        "recovery_to_first_step_s": round(med(t["first step"] - t["PREEMPTED"] for t in timelines), 2),
        "tf_import_s": round(med(t["agent"] - t["process"] for t in timelines), 2),
        "recovery_less_boot_and_import_s": round(med(t["first step"] - t["PREEMPTED"] - BOOT_S
                                                     - (t["agent"] - t["process"]) for t in timelines), 2),
        "ledger_vs_billing": {str(k): round(med(o.finished.goodput.billed_s / o.billed_truth_s for o in outcomes[k]
                                                if o.finished.goodput), 4) for k in SCENARIOS},
        "timeline": timeline,
        "split": {str(k): {name: round(med(s[name] for s in splits[k]), 2) for name in splits[k][0]
                           if isinstance(splits[k][0][name], float)} for k in SCENARIOS if splits[k]},
        "projected_goodput_24h": projection(heaviest),
    }


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(title=f"goodput: digits {report['steps']} steps on the emulator (boot {report['boot_delay_s']:g} s), "
                        f"medians of {report['repeats']}")
    for column in ("preemptions", "billed s", "boot", "setup", "productive", "recomputed", "checkpoint", "eval",
                   "save", "idle after end", "unaccounted", "goodput", "ledger / billing"):
        table.add_column(column)
    for k, split in report["split"].items():
        table.add_row(k, *(format_seconds(split[name]) for name in ("billed_s", "boot_s", "setup_s", "productive_s",
                                                               "recomputed_s", "checkpoint_s", "eval_s", "save_s",
                                                               "idle_after_end_s", "unaccounted_s")),
                      f"{split['goodput']:.3f}", f"{report['ledger_vs_billing'][k]:.3f}")
    console.print(table)
    console.print(f"goodput with 3 preemptions / uninterrupted: {report['goodput_3_vs_0']:.3f} (goal >= 0.9); "
                  f"each preemption adds {report['billed_s_per_preemption']:.1f} s billed")
    stages = Table(title="one recovery, seconds after the preemption (SIGTERM, 30-s notice), medians")
    for stage in STAGES:
        stages.add_column(stage)
    stages.add_row(*(f"{report['timeline'][stage]:.2f}" for stage in STAGES))
    console.print(stages)
    console.print(f"recovery overhead (PREEMPTED -> READY minus the {report['boot_delay_s']:g}-s boot): "
                  f"{report['recovery_overhead_s']:.2f} s (goal < 3 s); PREEMPTED -> first completed step "
                  f"{report['recovery_to_first_step_s']:.2f} s, of which the replacement's TensorFlow import "
                  f"{report['tf_import_s']:.2f} s: {report['recovery_less_boot_and_import_s']:.2f} s besides "
                  "boot and import")
    p = report["projected_goodput_24h"]
    console.print(f"projected: {JOB_HOURS:g}-h job preempted every {PREEMPT_EVERY_HOURS:g} h ({p['preemptions']} "
                  f"preemptions), READY {p['boot_s']:g} s after create, setup {p['setup_s']} s, control plane "
                  f"{p['control_s']} s, tail {p['tail_s']} s: goodput {p['goodput']:.3f} "
                  f"({p['billed_h']} h billed for {p['productive_h']} h of training)")
    console.print(f"total {report['seconds']} s")


if __name__ == "__main__":
    main()
