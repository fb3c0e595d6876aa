"""Benchmark sweeps: a reconcile pass over a big sweep, and the study storages' ask+tell round trip.

    .venv/bin/python bench/bench_sweeps.py [--json] [--quick]

Measures, side by side in one run (3 repetitions, medians; nothing is asserted):

1. A reconcile pass (``Controller.run_pass``: the sweep pass, then the runs) over a sweep of 500
   trials of which 50 are running, their nodes READY on the local emulator (stand-in images that
   sleep where the job would train, as in bench_controller.py), against the same pass over 1000
   trials (still 50 running) and over 500 trials with 100 running: wall time, API calls by RPC,
   store reads/writes/lists. Goals: under 2 s; one ListNodes per zone as without sweeps; store
   reads that grow with the running trials, not with the finished ones.
2. Ask+tell round trip per trial, 50 trials, each from a freshly opened storage (as a cron pass
   opens it) and from one kept open: the journal in the store (tpuops, local store), PostgreSQL 15
   (a throwaway server, ``tests/local_postgres.py``) and Optuna's own ``JournalFileBackend``
   on a local file (the baseline: no object store, one machine).
3. 10 threads x 20 appends through one journal backend: how many logs a fresh reader finds (all
   200 is Optuna's promise for a backend) and the wall time, the store journal against Optuna's
   ``JournalFileBackend``.

Not measured (left for later): the digits sweep with parallel 1 vs 4 and with the median pruner
vs without (real TF trials, minutes each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import result_file
from bench_controller import measure, wait_for, world
from helpers import stand_in_image  # tests/helpers.py: bench_controller puts tests/ on the path

from tpuops.data.samples import digits
from tpuops.store import LocalStore
from tpuops.sweeps import ops as sweep_ops
from tpuops.sweeps import studies
from tpuops.sweeps.journal import StoreJournal
from tpuops.sweeps.spec import SweepSpec
from tpuops.sweeps.start import plan_sweep, start_sweep
from tpuops.sweeps.template import trial_run_id

ROOT = Path(__file__).resolve().parents[1]
ZONE = "us-central1-a"  # offers v3-8, the digits experiment's accelerator
REPS = 3
SWEEP = """
name: big
experiment: {experiment}
space:
  learning_rate: {{type: float, low: 0.0001, high: 0.1, log: true}}
  filters: {{type: categorical, choices: [8, 16, 32]}}
sampler: {{type: random, seed: 1}}
trials: {trials}
parallel: {running}
pruner: {{type: median}}
"""


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _seed_sweep(work: Path, w: Any, trials: int, running: int) -> None:
    """A sweep with ``trials - running`` trials told (three intermediate values each) and ``running`` in flight."""
    path = work / "big.yaml"
    path.write_text(SWEEP.format(experiment=ROOT / "experiments" / "digits_cnn.yaml", trials=trials, running=running))
    plan = plan_sweep(w.settings, path, w.store, base_dir=work)
    start_sweep(plan, w.store, lambda _text: None)
    spec = plan.spec
    study = studies.load_study(spec, studies.open_storage(spec, w.store, exclusive=True))
    sweep = sweep_ops.read_sweep(w.store, spec.name)
    for number in range(trials):
        trial = studies.ask(study, spec)
        trial.set_user_attr("run_id", trial_run_id(spec.name, number))
        for step in (100, 200, 300):
            trial.report(0.5 + number / (10 * trials), step)
        if number < trials - running:
            study.tell(trial, 0.9)
        else:
            sweep_ops.declare_trial_run(w.store, sweep, number, studies.trial_params(trial.params))
            status = {"step": 300, "attempt": 1, "phase": "training", "exit_class": None,
                      "evals": [{"step": s, "metrics": {"accuracy": 0.5}} for s in (100, 200, 300)]}
            w.store.write_bytes(f"runs/{trial_run_id(spec.name, number)}/status.json",
                                json.dumps(status).encode())


def bench_pass(work: Path, trials: int, running: int) -> dict[str, Any]:
    image = stand_in_image(work / "image")
    emulator = {"boot_delay_s": 0.05, "grace_s": 1.0, "image_python": str(image)}
    home = work / f"pass-{trials}-{running}"
    home.mkdir(parents=True)
    digits(home / "data" / "digits")
    with world(home, [ZONE], emulator, max_run_hours=0) as w:
        _seed_sweep(home, w, trials, running)
        controller = w.controller()
        controller.run_pass()  # creates the running trials' nodes; the first sweep pass compacts the journal
        wait_for(lambda: sum(n["state"] == "READY" for n in w.admin.nodes()) == running, f"{running} nodes READY")
        controller.run_pass()
        samples = [measure(w, controller.run_pass) for _ in range(REPS)]
    return {
        "trials": trials, "running": running,
        "seconds": _median([s.seconds for s in samples]),
        "api_calls": samples[-1].calls,
        "store": {k: int(_median([s.store.get(k, 0) for s in samples])) for k in ("reads", "writes", "lists")},
        "actions": samples[-1].actions,
    }


def _round_trip(open_storage: Callable[[], Any], spec: SweepSpec, trials: int, fresh: bool) -> float:
    """Seconds per ask+tell (with one intermediate value), each from a new storage when ``fresh``."""
    storage = open_storage()
    study = studies.create_study(spec, storage)
    started = time.perf_counter()
    for _ in range(trials):
        if fresh:
            study = studies.load_study(spec, open_storage())
        trial = studies.ask(study, spec)
        trial.report(0.5, 1)
        study.tell(trial, 0.5)
    return (time.perf_counter() - started) / trials


def bench_storages(work: Path, trials: int) -> list[dict[str, Any]]:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    def spec(name: str, storage: dict[str, Any] | None = None) -> SweepSpec:
        raw: dict[str, Any] = {"name": name, "experiment": "x.yaml", "trials": trials,
                               "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
                               "sampler": {"type": "random"}}
        if storage:
            raw["storage"] = storage
        return SweepSpec.model_validate(raw)

    store = LocalStore(work / "store")
    cases: list[tuple[str, Callable[[str], tuple[Callable[[], Any], SweepSpec]]]] = [
        ("journal in the store (tpuops)", lambda n: ((lambda: studies.open_storage(spec(n), store)), spec(n))),
        ("Optuna JournalFileBackend (baseline)",
         lambda n: ((lambda: JournalStorage(JournalFileBackend(str(work / f"{n}.log")))), spec(n))),
    ]
    sys.path.insert(0, str(ROOT / "tests"))
    from local_postgres import LocalPostgres, find_bindir  # test-only helper (tests/local_postgres.py)

    server = None
    if find_bindir() is not None:
        server = LocalPostgres().start()
        env = {"BENCH_PG": server.password}
        pg = {"kind": "database", "url": server.url, "password_env": "BENCH_PG"}
        cases.insert(1, ("PostgreSQL 15 (RDB)", lambda n: ((lambda: studies.open_storage(spec(n, pg), store,
                                                                                         environ=env)), spec(n, pg))))
    rows = []
    try:
        for label, make in cases:
            for fresh in (True, False):
                values = []
                for rep in range(REPS):
                    opener, sweep_spec = make(f"s{len(rows)}-{rep}")
                    values.append(_round_trip(opener, sweep_spec, trials, fresh))
                rows.append({"storage": label, "open": "fresh per trial" if fresh else "kept open",
                             "ms_per_trial": round(_median(values) * 1000, 2)})
    finally:
        if server is not None:
            server.close()
    return rows


def _append_from_threads(backend: Any, threads: int, appends: int) -> float:
    """Seconds for ``threads`` threads to append ``appends`` one-log batches each through one ``backend``."""
    def write(tag: int) -> None:
        for i in range(appends):
            backend.append_logs([{"writer": tag, "i": i}])

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, range(threads)))
    return time.perf_counter() - started


def bench_concurrent_appends(work: Path, threads: int, appends: int) -> list[dict[str, Any]]:
    """Many threads appending through one journal backend: what a fresh reader finds, and the wall time."""
    from optuna.storages.journal import JournalFileBackend

    store = LocalStore(work / "appends")
    cases: list[tuple[str, Callable[[str], tuple[Any, Callable[[], Any]]]]] = [
        ("journal in the store (tpuops, local store)",
         lambda n: (StoreJournal(store, n), lambda: StoreJournal(store, n))),
        ("Optuna JournalFileBackend (baseline)",
         lambda n: (JournalFileBackend(str(work / f"{n}.log")), lambda: JournalFileBackend(str(work / f"{n}.log")))),
    ]
    rows = []
    for label, make in cases:
        seconds, readable = [], []
        for rep in range(REPS):
            backend, reader = make(f"appends-{len(rows)}-{rep}")
            seconds.append(_append_from_threads(backend, threads, appends))
            readable.append(len(list(reader().read_logs(0))))
        rows.append({"backend": label, "appends": threads * appends, "readable": min(readable),
                     "ms": round(_median(seconds) * 1000, 1)})
    return rows


def result_tables(result: dict[str, Any]) -> list[result_file.Table]:
    """The three tables of docs/benchmarks.md, from what ``--json`` prints."""
    storages, appends = result["storages"], result["appends"]
    base = next(r["ms_per_trial"] for r in storages if r["storage"].startswith("Optuna") and r["open"] == "kept open")
    base_ms = next(r["ms"] for r in appends if r["backend"].startswith("Optuna"))
    return [
        result_file.Table(
            f"A reconcile pass over a sweep (sweep pass + runs), local emulator, medians of {REPS}; goal < 2 s, "
            "one ListNodes per zone, store reads growing with the running trials, not the finished ones.",
            ["trials", "running", "wall s", "API calls", "store reads / writes / lists"],
            [[str(p["trials"]), str(p["running"]), f"{p['seconds']:.2f}",
              ", ".join(f"{n} {rpc}" for rpc, n in sorted(p["api_calls"].items())) or "none",
              f"{p['store']['reads']} / {p['store']['writes']} / {p['store']['lists']}"] for p in result["passes"]]),
        result_file.Table(
            f"Ask + report + tell per trial, medians of {REPS}; ratio: ms per trial / Optuna JournalFileBackend "
            "kept open.", ["storage", "opened", "ms per trial", "ratio"],
            [[r["storage"], r["open"], f"{r['ms_per_trial']:.2f}", f"{r['ms_per_trial'] / base:.1f}x"]
             for r in storages]),
        result_file.Table(
            f"10 threads x 20 appends through one journal backend, medians of {REPS}; readable: logs a fresh reader "
            "finds (fewest of 3); ratio: wall / Optuna JournalFileBackend.",
            ["backend", "appends", "readable", "wall ms", "ratio"],
            [[r["backend"], str(r["appends"]), str(r["readable"]), f"{r['ms']:.1f}", f"{r['ms'] / base_ms:.1f}x"]
             for r in appends]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quick", action="store_true", help="smaller sweeps (200 trials, 20 running)")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_sweeps")
    big, running = (200, 20) if args.quick else (500, 50)
    shapes = [(big, running), (2 * big, running), (big, 2 * running)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-sweeps-") as tmp:
        work = Path(tmp)
        passes = [bench_pass(work, trials, run) for trials, run in shapes]
        storages = bench_storages(work, 20 if args.quick else 50)
        appends = bench_concurrent_appends(work, 10, 20)
    result = {"passes": passes, "storages": storages, "appends": appends, "reps": REPS,
              "seconds": round(time.monotonic() - started)}
    if args.result:
        measuring.write(result, result_tables(result))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    table = Table(title="reconcile pass over a sweep (sweep pass + runs), local emulator, medians of 3",
                  caption="goal: < 2 s; one ListNodes per zone; store reads grow with running trials, not finished")
    for column in ("trials", "running", "wall s", "API calls", "store reads", "writes", "lists"):
        table.add_column(column)
    for p in passes:
        calls = ", ".join(f"{n} {rpc}" for rpc, n in sorted(p["api_calls"].items())) or "none"
        table.add_row(str(p["trials"]), str(p["running"]), f"{p['seconds']:.2f}", calls, str(p["store"]["reads"]),
                      str(p["store"]["writes"]), str(p["store"]["lists"]))
    console.print(table)
    base = next(r["ms_per_trial"] for r in storages if r["storage"].startswith("Optuna") and r["open"] == "kept open")
    table = Table(title="ask + report + tell per trial, medians of 3",
                  caption="ratio: ms per trial / Optuna JournalFileBackend kept open")
    for column in ("storage", "opened", "ms per trial", "ratio"):
        table.add_column(column)
    for r in storages:
        table.add_row(r["storage"], r["open"], f"{r['ms_per_trial']:.2f}", f"{r['ms_per_trial'] / base:.1f}x")
    console.print(table)
    base = next(r["ms"] for r in appends if r["backend"].startswith("Optuna"))
    table = Table(title="10 threads x 20 appends through one journal backend, medians of 3",
                  caption="readable: logs a fresh reader finds (fewest of 3); ratio: wall / Optuna JournalFileBackend")
    for column in ("backend", "appends", "readable", "wall ms", "ratio"):
        table.add_column(column)
    for r in appends:
        table.add_row(r["backend"], str(r["appends"]), str(r["readable"]), f"{r['ms']:.1f}", f"{r['ms'] / base:.1f}x")
    console.print(table)
    print(f"python {sys.version.split()[0]}; total {result['seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
