"""When the run itself goes wrong: what a user's mistake, an unhealthy API and a damaged document cost.

    .venv/bin/python bench/bench_faults.py [--only PART ...] [--repetitions 3] [--trials 1000] [--json] [--result]

Measures, side by side in one run, whatever the tree does today (every figure is what was seen; a goal
that is missed is printed as missed, nothing is asserted). Parts, each selectable with ``--only``:

``user-errors``
    Deterministic user errors trained with ``tpuops train NAME --json`` (a separate process, as a user
    runs it) on an emulator whose nodes run real TF 2.9 (boot 0.5 s): a compiled model whose loss is
    ``"no_such_loss"``; a dataset with one corrupt record in a shard whose manifest was made from the
    damaged bytes (whole-shard size and crc32c agree, the record's checksum does not); ``seed: -5``.
    Per case: nodes created (the emulator's CreateNode count), boots (READY intervals in its billing)
    and billed seconds, the outcome and exit code. Goal: at most 1 node and 1 boot, never "succeeded".
``idle``
    A short digits run (60 steps) trained in two zones at Cloud TPU API error rates 0, 0.1 and 0.5
    (``emulator fault --error-rate``, seeded by the repetition): billed "idle after end", the emulator's
    billing end of the run's last node minus the agent's end (its last attempt's ``ended_at``), and the
    ledger's figure from ``train --json``'s goodput split. Goal: < 10 s. A run still going after
    ``RUN_TIMEOUT_S`` is reported so.
``ledger``
    ``tpuops simulate SWEEP --json`` (a separate process) of ``sweeps/digits_lr.yaml`` grown to ``--trials``
    trials, ``--parallel`` at a time (TPE, median pruner; the digits CNN's 600 steps, so trials last minutes
    and many live between two passes), reconcile every 300 s (cron every 5 minutes), its budget too large
    to bind: the ledger's dollars against the simulated cloud's billing
    (goal within 2 %), trials billed that the ledger has no dollar for (goal 0), and ``cpu_speedup``
    (simulated seconds per CPU second of the simulation; goal >= 1,000x).
``damaged``
    200 runs in the store (each as ``jobs.declare`` leaves it, with a live status) and one of them
    damaged, in turn: its ``memory.json``, ``status.json``, then ``run.json`` garbled. Commands run as a
    user would: ``status``, ``runs``, ``runs --json``, ``events`` of a healthy run and of the damaged
    one, and the dashboard's Nodes page (``/nodes`` and ``/data/nodes``, in-process). A command works
    when it exits 0 (``--json``: strict JSON) without a traceback; the damaged run's own ``events`` may
    also exit 1 with one line. Goal: all.

Every part runs ``--repetitions`` times (the simulation with seeds 0, 1, ...); tables show medians
and ``--json`` prints one object: ``{"parts": {PART: {...}}, ...}`` with every repetition's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import result_file
from bench_controller import TF_PYTHON, TF_ZONE, World, billing_of, seed_run, world

from tpuops import runs
from tpuops.data.manifest import MANIFEST, parse_manifest
from tpuops.data.samples import digits
from tpuops.store import LocalStore
from tpuops.store.files import crc32c_of_bytes

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("user-errors", "idle", "ledger", "damaged")
BOOT_S = 0.5
GRACE_S = 5.0
RUN_TIMEOUT_S = 900.0
BILLING_WAIT_S = 120.0
"""After ``train`` returns, how long a node left billing is waited for (its idle time counts meanwhile)."""
ERROR_RATES = (0.0, 0.1, 0.5)
SWEEP_ZONES = ("us-central1-a", "us-central1-b")
IDLE_ZONES = (TF_ZONE, "us-central1-b")
"""Two zones that offer v3-8: an unhealthy API's failing ListNodes in one must not hold up a delete in the other."""
DAMAGED_RUNS = 200
IDLE_GOAL_S = 10.0
BAD_MODEL = '''

def bad_loss(hparams):
    """A compiled model whose loss does not exist: a deterministic user error."""
    model = digits_cnn(hparams)
    model.compile(optimizer="adam", loss="no_such_loss", metrics=["accuracy"])
    return model
'''


@dataclass(frozen=True)
class Done:
    code: int | None
    out: str
    err: str
    seconds: float

    @property
    def last_line(self) -> str:
        lines = [line for line in self.err.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.err


def tpuops(work: Path, env: dict[str, str], *args: str, timeout: float = 300.0) -> Done:
    """``tpuops ARGS`` as a user runs it: a separate process in ``work`` (None as the code: still running)."""
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "tpuops", *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        return Done(None, str(err.stdout or ""), str(err.stderr or ""), time.monotonic() - started)
    return Done(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def cli_env(work: Path, endpoint: str | None, zones: Sequence[str]) -> dict[str, str]:
    """The environment of a ``tpuops`` process in ``work``: its own home, config and (if given) emulator."""
    config = work / "tpuops.toml"
    config.write_text(f"zones = {json.dumps(list(zones))}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    env.update(TPUOPS_HOME=str(work / "home"), TPUOPS_CONFIG=str(config), TPUOPS_POLL_INTERVAL_S="0.2")
    if endpoint:
        env["TPUOPS_TPU_ENDPOINT"] = endpoint
    return env


def json_or_none(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=lambda constant: (_ for _ in ()).throw(ValueError(constant)))
    except ValueError:
        return None


def wait_until(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def billed(intervals: Sequence[dict[str, Any]], now: float) -> float:
    return sum((i["end_epoch"] if i["end_epoch"] is not None else now) - i["start_epoch"] for i in intervals)


@contextlib.contextmanager
def tf_world(work: Path, zones: Sequence[str] = (TF_ZONE,)) -> Iterator[World]:
    """An emulator whose nodes run real TF 2.9, in ``work``."""
    with world(work / "home", zones, {"boot_delay_s": BOOT_S, "grace_s": GRACE_S,
                                          "image_python": str(TF_PYTHON)}) as w:
        yield w


def digits_experiments(work: Path) -> str:
    """``work`` as a digits project (data, models.py with the bad model added); a 60-step spec's text."""
    digits(work / "data" / "digits", overwrite=True)
    (work / "experiments").mkdir(exist_ok=True)
    (work / "experiments" / "models.py").write_text((ROOT / "experiments" / "models.py").read_text() + BAD_MODEL)
    text = (ROOT / "experiments" / "digits_cnn.yaml").read_text()
    for old, new in (("steps: 600", "steps: 60"), ("steps_per_call: 20", "steps_per_call: 10"),
                     ("every_steps: 100", "every_steps: 20"), ("per_replica: 64", "per_replica: 32")):
        assert old in text, old
        text = text.replace(old, new)
    return text


def spec(work: Path, name: str, text: str) -> Path:
    path = work / "experiments" / f"{name}.yaml"
    path.write_text(text)
    return path


def corrupt_dataset(source: Path, target: Path) -> None:
    """A copy of a dataset whose second shard (or only one) has one bad record, its manifest made to match."""
    shutil.copytree(source, target)
    manifest = parse_manifest((target / MANIFEST).read_bytes(), MANIFEST)
    victim = manifest.shards[min(1, len(manifest.shards) - 1)]
    data = bytearray((target / victim.name).read_bytes())
    data[12 + 3] ^= 0x01  # a byte of the first record's data: its crc32c no longer matches
    (target / victim.name).write_bytes(bytes(data))
    shards = [s.model_copy(update={"crc32c": crc32c_of_bytes(bytes(data))}) if s is victim else s
              for s in manifest.shards]
    (target / MANIFEST).write_bytes(manifest.model_copy(update={"shards": shards}).to_bytes())


# -- user errors ---------------------------------------------------------------------------------------


def user_error_cases(work: Path) -> dict[str, Path]:
    text = digits_experiments(work)
    corrupt_dataset(work / "data" / "digits" / "train", work / "data" / "digits-bad" / "train")
    bad_loss = text.replace("model: models:digits_cnn", "model: models:bad_loss")
    bad_crc = text.replace("train: data/digits/train", "train: data/digits-bad/train")
    return {"loss no_such_loss": spec(work, "bad_loss", bad_loss), "bad record crc": spec(work, "bad_crc", bad_crc),
            "seed -5": spec(work, "bad_seed", text + "seed: -5\n")}


def one_user_error(w: World, work: Path, env: dict[str, str], path: Path, name: str) -> dict[str, Any]:
    w.admin.reset_stats()
    done = tpuops(work, env, "train", str(path), "--name", name, "--json", timeout=RUN_TIMEOUT_S)
    wait_until(lambda: all(i["end_epoch"] is not None for i in billing_of(w.admin, name)), BILLING_WAIT_S)
    intervals = billing_of(w.admin, name)
    result = json_or_none(done.out) or {}
    left = [n["name"] for n in w.admin.nodes() if n["name"].endswith(f"/nodes/{name}")]
    return {"nodes": w.admin.stats().get("CreateNode", 0), "boots": len(intervals),
            "billed_s": round(billed(intervals, time.time()), 1), "exit": done.code,
            "outcome": result.get("exit_class"), "line": result.get("message") or done.last_line,
            "nodes_left": len(left), "traceback": done.traceback, "seconds": round(done.seconds, 1)}


def part_user_errors(work: Path, repetitions: int) -> dict[str, Any]:
    cases = user_error_cases(work)
    found: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
    with tf_world(work) as w:
        env = cli_env(work, w.info.endpoint, [TF_ZONE])
        for repetition in range(repetitions):
            for index, (case, path) in enumerate(cases.items()):
                found[case].append(one_user_error(w, work, env, path, f"ue{index}-{repetition}"))
                progress(f"user error {case!r}, repetition {repetition + 1}: {found[case][-1]}")
    summary = {}
    for case, seen in found.items():
        met = all(s["nodes"] <= 1 and s["boots"] <= 1 and s["outcome"] != "succeeded" and s["exit"] != 0
                  and not s["nodes_left"] and not s["traceback"] for s in seen)
        summary[case] = {"nodes": med(s["nodes"] for s in seen), "boots": med(s["boots"] for s in seen),
                         "billed_s": med(s["billed_s"] for s in seen), "met": met, "repetitions": seen}
    return summary


# -- idle after end ------------------------------------------------------------------------------------


def one_idle(w: World, work: Path, env: dict[str, str], path: Path, name: str, rate: float,
             seed: int) -> dict[str, Any]:
    w.admin.set_faults(error_rate=rate, seed=seed)
    try:
        done = tpuops(work, env, "train", str(path), "--name", name, "--json", timeout=RUN_TIMEOUT_S)
        closed = wait_until(lambda: all(i["end_epoch"] is not None for i in billing_of(w.admin, name)),
                            BILLING_WAIT_S)
    finally:
        w.admin.clear_faults()
    intervals = billing_of(w.admin, name)
    status = runs.read_status(LocalStore(Path(w.settings.store_root)), name)
    ended = status.attempts[-1].last_alive if status and status.attempts else None
    result = json_or_none(done.out) or {}
    goodput = result.get("goodput") or {}
    truth = None
    if ended is not None and intervals:
        truth = round(max(0.0, (intervals[-1]["end_epoch"] or time.time()) - ended), 2)
    return {"idle_after_end_s": truth, "ledger_idle_after_end_s": goodput.get("idle_after_end_s"),
            "billing_closed": closed, "exit": done.code, "outcome": result.get("exit_class"),
            "line": result.get("message") or ("" if done.code == 0 else done.last_line), "boots": len(intervals),
            "billed_s": round(billed(intervals, time.time()), 1), "seconds": round(done.seconds, 1)}


def part_idle(work: Path, repetitions: int) -> dict[str, Any]:
    path = spec(work, "small", digits_experiments(work))
    found: dict[str, list[dict[str, Any]]] = {str(rate): [] for rate in ERROR_RATES}
    with tf_world(work, IDLE_ZONES) as w:
        env = cli_env(work, w.info.endpoint, IDLE_ZONES)
        for repetition in range(repetitions):
            for index, rate in enumerate(ERROR_RATES):
                seen = one_idle(w, work, env, path, f"idle{index}-{repetition}", rate, seed=repetition)
                found[str(rate)].append(seen)
                progress(f"idle after end at error rate {rate}, repetition {repetition + 1}: {seen}")
    summary = {}
    for rate, seen in found.items():
        idle = [s["idle_after_end_s"] for s in seen if s["idle_after_end_s"] is not None]
        summary[rate] = {"idle_after_end_s": med(idle) if idle else None,
                         "idle_after_end_s_max": max(idle) if idle else None,
                         "met": len(idle) == len(seen) and all(s["billing_closed"] for s in seen)
                         and max(idle) < IDLE_GOAL_S, "repetitions": seen}
    return summary


# -- the ledger on a simulated fleet sweep ---------------------------------------------------------------


def sweep_project(work: Path, trials: int, parallel: int) -> Path:
    """``work`` laid out as the repository is (digits experiment, its data, sweeps/digits_lr.yaml) with the sweep
    grown to ``trials`` trials, ``parallel`` at a time, under a budget too large to bind."""
    from tpuops.api import data_sample

    for folder, name in (("experiments", "digits_cnn.yaml"), ("experiments", "models.py"),
                         ("sweeps", "digits_lr.yaml")):
        (work / folder).mkdir(exist_ok=True)
        shutil.copy(ROOT / folder / name, work / folder / name)
    data_sample("digits", work / "data" / "digits")
    text = (work / "sweeps" / "digits_lr.yaml").read_text()
    for old, new in (("trials: 8", f"trials: {trials}"), ("parallel: 2", f"parallel: {parallel}"),
                     ("budget_usd: 10", f"budget_usd: {trials * 100}")):
        assert old in text, old
        text = text.replace(old, new)
    sweep = work / "sweeps" / "fleet.yaml"
    sweep.write_text(text)
    return sweep


def part_ledger(work: Path, repetitions: int, trials: int, parallel: int) -> dict[str, Any]:
    seen = []
    for repetition in range(repetitions):
        folder = work / f"sim-{repetition}"
        folder.mkdir(parents=True)
        sweep = sweep_project(folder, trials, parallel)
        env = cli_env(folder, None, SWEEP_ZONES)
        done = tpuops(folder, env, "simulate", str(sweep), "--seed", str(repetition), "--pass-every", "300",
                      "--json", timeout=3600)
        report = json_or_none(done.out)
        if done.code != 0 or not isinstance(report, dict):
            seen.append({"exit": done.code, "line": done.last_line, "seconds": round(done.seconds, 1)})
            continue
        trial_runs = report["runs"]
        billing = sum(r["usd"] for r in trial_runs)
        ledger = sum(r["ledger_usd"] for r in trial_runs)
        missing = [r for r in trial_runs if r["usd"] > 0 and r["ledger_usd"] <= 0]
        seen.append({"exit": 0, "trials_run": len(trial_runs), "billing_usd": round(billing, 4),
                     "ledger_usd": round(ledger, 4),
                     "ledger_vs_billing": round(ledger / billing, 4) if billing else None,
                     "missing": len(missing), "missing_usd": round(sum(r["usd"] for r in missing), 4),
                     "cpu_speedup": report["cpu_speedup"], "simulated_hours": report["simulated_hours"],
                     "cpu_s": report["cpu_s"], "ended": report["ended"], "seconds": round(done.seconds, 1)})
        progress(f"simulated sweep of {trials} trials, seed {repetition}: {seen[-1]}")
    good = [s for s in seen if s["exit"] == 0]
    if not good:
        return {"met": False, "repetitions": seen}
    ratio = [s["ledger_vs_billing"] for s in good if s["ledger_vs_billing"] is not None]
    return {"trials": trials, "parallel": parallel, "ledger_vs_billing": med(ratio) if ratio else None,
            "missing": max(s["missing"] for s in good), "cpu_speedup": med(s["cpu_speedup"] for s in good),
            "ledger_met": bool(ratio) and all(abs(r - 1) <= 0.02 for r in ratio) and all(
                s["missing"] == 0 for s in good) and len(good) == len(seen),
            "speed_met": len(good) == len(seen) and all(s["cpu_speedup"] >= 1000 for s in good),
            "repetitions": seen}


# -- one damaged run among many --------------------------------------------------------------------------

DAMAGES = {"memory.json": runs.memory_key, "status.json": runs.status_key, "run.json": runs.record_key}
GARBLED = b'{"run_id": "run-0000", "outcome": "succ'


def dashboard_nodes(settings: Any) -> dict[str, int]:
    """The Nodes page and its data call, in-process: the HTTP status of each."""
    from starlette.testclient import TestClient

    from tpuops.dashboard.app import Dashboard
    from tpuops.dashboard.auth import COOKIE
    from tpuops.dashboard.source import bound_source

    token = "bench-faults-token"
    client = TestClient(Dashboard(bound_source(settings), token=token, read_only=True, refresh_s=0.05).asgi(),
                        base_url="http://127.0.0.1")
    client.cookies.set(COOKIE, token)
    return {path: client.get(path).status_code for path in ("/nodes", "/data/nodes")}


def commands(work: Path, env: dict[str, str], settings: Any, victim: str, healthy: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for label, args, allowed in (("status", ("status",), {0}), ("runs", ("runs",), {0}),
                                 ("runs --json", ("runs", "--json"), {0}),
                                 ("events (a healthy run)", ("events", healthy), {0}),
                                 ("events (the damaged run)", ("events", victim), {0, 1})):
        done = tpuops(work, env, *args, timeout=120)
        strict = "--json" not in args or json_or_none(done.out) is not None
        found[label] = {"works": done.code in allowed and strict and not done.traceback, "exit": done.code,
                        "line": done.last_line, "seconds": round(done.seconds, 2)}
    try:
        pages = dashboard_nodes(settings)
        found["dashboard nodes"] = {"works": all(code == 200 for code in pages.values()), "status": pages}
    except Exception as err:  # a bench reports what broke, whatever it was
        found["dashboard nodes"] = {"works": False, "line": f"{type(err).__name__}: {err}"[:300]}
    return found


def part_damaged(work: Path, repetitions: int) -> dict[str, Any]:
    found: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in DAMAGES}
    with world(work / "home", [TF_ZONE], {"boot_delay_s": 0.05, "grace_s": 1.0}) as w:
        env = cli_env(work, w.info.endpoint, [TF_ZONE])
        run_ids = [f"run-{i:04d}" for i in range(DAMAGED_RUNS)]
        for run_id in run_ids:
            seed_run(w.settings, w.store, run_id, TF_ZONE)
        victim, healthy = run_ids[0], run_ids[1]
        for repetition in range(repetitions):
            for name, key in DAMAGES.items():
                seed_run(w.settings, w.store, victim, TF_ZONE)
                w.store.delete(runs.memory_key(victim))
                w.store.write_bytes(key(victim), GARBLED)
                found[name].append(commands(work, env, w.settings, victim, healthy))
                broken = [c for c, r in found[name][-1].items() if not r["works"]]
                progress(f"damaged {name}, repetition {repetition + 1}: broken {broken or 'none'}")
    summary: dict[str, Any] = {}
    for name, seen in found.items():
        labels = list(seen[0])
        summary[name] = {"works": {label: all(s[label]["works"] for s in seen) for label in labels},
                         "first": seen[0]}
        summary[name]["met"] = all(summary[name]["works"].values())
    return summary


# -- main --------------------------------------------------------------------------------------------------


def med(values: Any) -> float:
    return statistics.median(list(values))


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeatable)")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--trials", type=int, default=1000, help="trials of the simulated sweep (ledger)")
    parser.add_argument("--parallel", type=int, default=50, help="trials at a time in the simulated sweep")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_faults")
    chosen = [part for part in PARTS if part in (args.only or PARTS)]
    began = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        for part in chosen:
            work = Path(tmp) / part
            work.mkdir()
            started = time.monotonic()
            if part == "user-errors":
                results[part] = part_user_errors(work, args.repetitions)
            elif part == "idle":
                results[part] = part_idle(work, args.repetitions)
            elif part == "ledger":
                results[part] = part_ledger(work, args.repetitions, args.trials, args.parallel)
            else:
                results[part] = part_damaged(work, args.repetitions)
            progress(f"{part} took {time.monotonic() - started:.0f} s")
    report = {"repetitions": args.repetitions, "seconds": round(time.monotonic() - began), "parts": results}
    if args.result:  # one result file a part, so that a part measured again replaces only its own
        for part in chosen:
            shown = {"repetitions": args.repetitions, "seconds": report["seconds"], "parts": {part: results[part]}}
            measuring.write(shown, [result_file.Table(f"{part} (medians of {args.repetitions})", list(COLUMNS),
                                                      table_rows(shown))], part=part)
    if args.json:
        print(json.dumps(report, indent=1, allow_nan=False))
    else:
        render(report)


COLUMNS = ("measure", "tpuops", "goal", "")


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """The report as the table's rows (the console's and the result file's): measure, figure, goal, verdict."""
    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    rows: list[list[str]] = []
    parts = report["parts"]
    for case, s in parts.get("user-errors", {}).items():
        line = s["repetitions"][0]["line"]
        rows.append([f"user error: {case}", f"{s['nodes']:g} node(s), {s['boots']:g} boot(s), {s['billed_s']:.1f} s "
                     f"billed; {s['repetitions'][0]['outcome']}: {line[:80]}", "1 node, <= 1 boot", verdict(s["met"])])
    for rate, s in parts.get("idle", {}).items():
        shown = "no figure" if s["idle_after_end_s"] is None else \
            f"{s['idle_after_end_s']:.1f} s (max {s['idle_after_end_s_max']:.1f})"
        rows.append([f"billed idle after end, API error rate {rate}", shown, f"< {IDLE_GOAL_S:g} s", verdict(s["met"])])
    if "ledger" in parts:
        s = parts["ledger"]
        if s.get("ledger_vs_billing") is None:
            rows.append(["simulated sweep", f"failed: {s['repetitions'][0].get('line', '')}", "", "MISSED"])
        else:
            rows.append([f"ledger / billing, simulated {s['trials']}-trial sweep",
                         f"{s['ledger_vs_billing']:.4f}, {s['missing']} billed trial(s) missing",
                         "within 2 %, 0 missing", verdict(s["ledger_met"])])
            rows.append(["that simulation's CPU speed-up", f"{s['cpu_speedup']:,.0f}x", ">= 1,000x",
                         verdict(s["speed_met"])])
    for name, s in parts.get("damaged", {}).items():
        broken = [label for label, works in s["works"].items() if not works]
        rows.append([f"one garbled {name} among {DAMAGED_RUNS} runs",
                     f"{len(s['works']) - len(broken)} of {len(s['works'])} commands work"
                     + (f"; broken: {', '.join(broken)}" if broken else ""), "all", verdict(s["met"])])
    return rows


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"tpuops when the run goes wrong (medians of {report['repetitions']})",
                  caption=f"total {report['seconds']} s")
    for column in COLUMNS:
        table.add_column(column)
    for row in table_rows(report):
        table.add_row(*row)
    Console(width=200).print(table)

if __name__ == "__main__":
    main()
