"""A job on a pod slice against the same job on one host: where the time goes, recovery, memory, speed.

    .venv/bin/python bench/bench_slices.py [--repetitions 3] [--steps 40] [--json] [--result]

Side by side in one run, on one emulator whose nodes run real TF 2.9 (boot 0.2 s): the digits CNN trained
with ``tpuops train NAME --json`` (a separate process, as a user runs it) on a v2-32 slice (4 workers, 4
replicas of 8 records) and on a v3-8 (one host, 1 replica of 32 records): the same global batch. Per
repetition and shape, one uninterrupted run and one preempted (``emulator preempt``, 20 s grace) once its
checkpoint at step 20 is stored. Measured (every figure is what was seen; there is no goal but the ratios):

- **create -> first step**: from the train command's start to the first call of steps (10) the status
  shows (polled every 0.2 s), split at what the worker-0 logs say: node booted (startup script's first
  line; 1 s resolution), every worker's runtime answering (slices), the job started, TensorFlow
  connected (the agent's ``runtime:`` line: the resolver, ``connect_to_cluster``, the strategy), the
  first call of steps;
- **recovery**: from the preemption to the first step of the second attempt;
- **memory**: the largest RSS of each worker's process groups (startup script, job, runtime), sampled
  every 0.2 s, and their sum for the slice;
- **steps/s**: steps over the run's productive seconds (its goodput split), 4 workers against 1, at the
  same global batch (2 shared cores: reported, no goal).

A run that fails, or a preempted run that ends without resuming, is recorded with its exit class and message
(its figures None), not the end of the bench. Tables show medians; ``--json`` prints every repetition's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import result_file

from tpuops.emulator import AdminClient, EmulatorInfo, start_background, stop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import digits_project  # noqa: E402 - test-only helper, found through the line above

TF_PYTHON = ROOT / ".venv-tf29" / "bin" / "python"
PROJECT, ZONE = "tpuops-local", "us-central1-a"
SHAPES = {"slice": ("v2-32", 8), "host": ("v3-8", 32)}  # accelerator, records per replica: global batch 32
PHASES = ("create+boot", "runtime up", "job start", "tensorflow connect", "first step")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)(Z|\+00:00)")


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def project(work: Path, steps: int) -> None:
    """The digits project with one experiment per shape, evaluated every 20 steps, no target."""
    text = digits_project(work)
    experiments = work / "experiments"
    for old, new in (("steps: 600", f"steps: {steps}"), ("steps_per_call: 20", "steps_per_call: 10"),
                     ("every_steps: 100", "every_steps: 20"), ("\neval:\n", "\neval:\n  every_steps: 20\n"),
                     ("target:\n  metric: accuracy\n  at_least: 0.95\n", "")):
        text = text.replace(old, new)
    for shape, (accelerator, per_replica) in SHAPES.items():
        (experiments / f"{shape}.yaml").write_text(
            text.replace("accelerator: v3-8", f"accelerator: {accelerator}")
            .replace("per_replica: 64", f"per_replica: {per_replica}") + "expected_hours: 0.01\n")


def env_for(work: Path, info: EmulatorInfo) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    config = work / "tpuops.toml"
    config.write_text(f'zones = ["{ZONE}"]\n')
    return {**env, "TPUOPS_HOME": str(work / "home"), "TPUOPS_CONFIG": str(config),
            "TPUOPS_TPU_ENDPOINT": info.endpoint, "TPUOPS_POLL_INTERVAL_S": "0.2"}


def status(work: Path, run: str) -> dict[str, Any]:
    try:
        return json.loads((work / "home" / "store" / "runs" / run / "status.json").read_text())
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 900.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def group_rss_mb(pgid: int | None) -> float:
    """Resident memory of every process in group ``pgid`` (MB)."""
    if not pgid:
        return 0.0
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            total += int(next(line.split()[1] for line in (entry / "status").read_text().splitlines()
                              if line.startswith("VmRSS:")))
        except (OSError, ValueError, IndexError, StopIteration):  # gone meanwhile, or a kernel thread
            continue
    return total / 1024


@contextmanager
def sampling(admin: AdminClient, run: str, work: Path) -> Iterator[dict[str, Any]]:
    """Samples the run's workers' RSS and notes when the status first shows a step, until the block ends."""
    seen: dict[str, Any] = {"rss_mb": {}, "first_step_at": None}
    halt = threading.Event()

    def loop() -> None:
        while not halt.wait(0.2):
            if seen["first_step_at"] is None and (status(work, run).get("step") or 0) > 0:
                seen["first_step_at"] = time.time()
            try:
                nodes = [n for n in admin.nodes() if n.get("name", "").endswith(f"/nodes/{run}")]
            except Exception:  # the emulator busy for a moment: the next sample counts
                continue
            for node in nodes:
                for number, worker in enumerate(node.get("workers") or [{"pgid": node.get("pgid")}]):
                    rss = sum(group_rss_mb(worker.get(key)) for key in ("pgid", "runtime_pgid"))
                    seen["rss_mb"][number] = max(seen["rss_mb"].get(number, 0.0), rss)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        halt.set()
        thread.join(10)


def stamps(log: Path, marks: dict[str, str]) -> dict[str, float]:
    """The first time (epoch s) each mark's text appears in ``log``."""
    found: dict[str, float] = {}
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        match = STAMP.match(line)
        if not match:
            continue
        for name, needle in marks.items():
            if name not in found and needle in line:
                found[name] = datetime.fromisoformat(match.group(1) + "+00:00").timestamp()
    return found


def train(work: Path, env: dict[str, str], shape: str, run: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tpuops", "train", f"experiments/{shape}.yaml", "--name", run,
                             "--json"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The run's ``--json`` result, also when it failed (a failed run is a figure, not the end of the bench)."""
    out, err = proc.communicate(timeout=1800)
    try:
        return json.loads(out)
    except ValueError:
        return {"exit_class": "no result", "message": err.strip()[-300:], "step": 0, "attempts": None}


def one_run(work: Path, env: dict[str, str], admin: AdminClient, shape: str, run: str) -> dict[str, Any]:
    began = time.time()
    with sampling(admin, run, work) as seen:
        result = finished(train(work, env, shape, run))
    log = work / "home" / "emulator" / "nodes" / PROJECT / ZONE / run / "tpuops" / "startup.log"
    at = stamps(log, {"booted": "tpuops-startup: boot 1 of node", "runtime up": "the TPU runtime answers on",
                      "job start": "starting the job", "connected": "INFO runtime: TensorFlow"})
    first = seen["first_step_at"]
    points = [began, at.get("booted"), at.get("runtime up", at.get("booted")), at.get("job start"),
              at.get("connected"), first]
    phases = {name: round(b - a, 2) if a is not None and b is not None else None
              for name, a, b in zip(PHASES, points[:-1], points[1:], strict=True)}
    if result.get("exit_class") != "succeeded":
        progress(f"{run} ended {result.get('exit_class')}: {result.get('message', '')[:200]}")
    split = result.get("goodput") or {}
    rss = [round(seen["rss_mb"][n], 1) for n in sorted(seen["rss_mb"])]
    return {"exit_class": result.get("exit_class"), "to_first_step_s": round(first - began, 2) if first else None,
            "phases_s": phases,
            "steps_per_s": round(result["step"] / split["productive_s"], 2) if split.get("productive_s") else None,
            "rss_mb_per_worker": rss, "rss_mb_total": round(sum(rss), 1)}


def preempted_run(work: Path, env: dict[str, str], admin: AdminClient, shape: str, run: str) -> dict[str, Any]:
    proc = train(work, env, shape, run)
    wait_for(lambda: (status(work, run).get("last_checkpoint_step") or 0) >= 20, f"{run}'s checkpoint at step 20")
    cut = time.time()
    admin.preempt(PROJECT, ZONE, run, grace_s=20.0)

    def resumed() -> bool:
        now = status(work, run)
        return now.get("attempt") == 2 and (now.get("step") or 0) > (now.get("resumed_from_step") or 0)

    wait_for(lambda: resumed() or proc.poll() is not None, f"{run}'s first step after recovery, or its end")
    recovered = round(time.time() - cut, 2) if resumed() else None
    result = finished(proc)
    return {"recovery_s": recovered, "attempts": result.get("attempts"), "exit_class": result.get("exit_class"),
            "message": result.get("message", "")[:300] if result.get("exit_class") != "succeeded" else ""}


def median(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    def of(shape: str, key: str, part: str = "run") -> float | None:
        return median([rep[shape][part][key] for rep in reps])

    shown: dict[str, Any] = {}
    for shape in SHAPES:
        shown[shape] = {"to_first_step_s": of(shape, "to_first_step_s"), "recovery_s": of(shape, "recovery_s", "cut"),
                        "steps_per_s": of(shape, "steps_per_s"), "rss_mb_total": of(shape, "rss_mb_total"),
                        "phases_s": {p: median([rep[shape]["run"]["phases_s"][p] for rep in reps]) for p in PHASES}}
    per_worker = [w for rep in reps for w in rep["slice"]["run"]["rss_mb_per_worker"]]
    shown["slice"]["rss_mb_per_worker"] = median(per_worker)

    def ratio(key: str) -> float | None:
        a, b = shown["slice"][key], shown["host"][key]
        return round(a / b, 2) if a and b else None

    shown["ratios"] = {"to_first_step": ratio("to_first_step_s"), "recovery": ratio("recovery_s"),
                       "steps_per_s": ratio("steps_per_s"), "memory": ratio("rss_mb_total")}
    return shown


def cell(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"


def tables(shown: dict[str, Any], repetitions: int) -> list[result_file.Table]:
    slice_, host, ratios = shown["slice"], shown["host"], shown["ratios"]
    rows = [
        ["create -> first step", cell(slice_["to_first_step_s"], " s"), cell(host["to_first_step_s"], " s"),
         cell(ratios["to_first_step"], "x")],
        *[[f"  {phase}", cell(slice_["phases_s"][phase], " s"), cell(host["phases_s"][phase], " s"), ""]
          for phase in PHASES],
        ["recovery of a preemption (to its first step)", cell(slice_["recovery_s"], " s"),
         cell(host["recovery_s"], " s"), cell(ratios["recovery"], "x")],
        ["memory (RSS), all workers", cell(slice_["rss_mb_total"], " MB"), cell(host["rss_mb_total"], " MB"),
         cell(ratios["memory"], "x")],
        ["memory (RSS), per worker", cell(slice_["rss_mb_per_worker"], " MB"), cell(host["rss_mb_total"], " MB"), ""],
        ["steps/s (global batch 32)", cell(slice_["steps_per_s"]), cell(host["steps_per_s"]),
         cell(ratios["steps_per_s"], "x")],
    ]
    return [result_file.Table(f"v2-32 slice (4 workers) vs v3-8 (one host), medians of {repetitions}",
                              ["measure", "slice", "one host", "slice / host"], rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_slices")
    reps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-slices-") as tmp:
        work = Path(tmp)
        project(work, args.steps)
        info = start_background(work / "home" / "emulator", boot_delay_s=0.2, grace_s=20.0,
                                image_python=str(TF_PYTHON))
        try:
            env, admin = env_for(work, info), AdminClient(info.endpoint, token=info.token)
            for rep in range(args.repetitions):
                reps.append({})
                for shape in SHAPES:
                    progress(f"repetition {rep + 1}: {shape}")
                    reps[-1][shape] = {"run": one_run(work, env, admin, shape, f"{shape}-{rep}"),
                                       "cut": preempted_run(work, env, admin, shape, f"{shape}-cut-{rep}")}
        finally:
            stop(info.state_dir)
    shown = summary(reps)
    report = {"repetitions": args.repetitions, "steps": args.steps, "medians": shown, "runs": reps}
    if args.result:
        measuring.write(report, tables(shown, args.repetitions))
    if args.json:
        print(json.dumps(report, indent=1, allow_nan=False))
    else:
        for table in tables(shown, args.repetitions):
            print(table.caption)
            for row in table.rows:
                print("  ".join(f"{c:<46}" if i == 0 else f"{c:>12}" for i, c in enumerate(row)))


if __name__ == "__main__":
    main()
