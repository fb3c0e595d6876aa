"""How a reconcile pass scales with runs: this tree's controller against a baseline tree, in one run.

    .venv/bin/python bench/bench_controller_scale.py [--baseline DIR] [--quick] [--goals] [--only gcs|local] [--json]

``--baseline`` is a checkout of the commit to compare with (default: ``$TPUOPS_BASELINE`` or
/tmp/tpuops-baseline; make one with ``git archive a052406 | tar -x -C DIR``). Each case runs in a
fresh process per implementation (``PYTHONPATH`` puts that tree's ``tpuops`` first; both use this
environment's packages) and prints seconds per pass, median of 3 repetitions, and store calls:

1. N active runs on a Cloud Storage store (fake-gcs-server): every run's node is READY and its agent
   is training. "steady" is a pass after the controller has seen everything once (what ``tpuops
   watch`` pays every interval); "all statuses due" is this tree's pass when every run's status is
   read again on every pass (``status_refresh_s=0``; by default a READY run's status.json is read
   again at most every ``min(hang_after_s, boot_timeout_s) / 12`` unless its node's state changed,
   see tpuops/controller/reconcile.py): the worst pass, and what a pass costs when statuses are due.
2. N finished runs (each with the ~17 objects a real run leaves: checkpoints, logs, events) plus 50
   active ones on the local store.

The Cloud TPU API is a stand-in that lists the runs' nodes as READY: this benchmark measures what
a pass costs on the store side; ``bench_controller.py`` measures ListNodes against the emulator.
Nothing is asserted; the goals (2,000 active on GCS < 1 s, 20,000 finished + 50 active < 0.5 s)
are printed next to the figures.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import result_file
from baseline import add_argument as add_baseline_argument
from baseline import tree as baseline_tree

from tpuops.core.clock import UTC

ROOT = Path(__file__).resolve().parents[1]
ZONE = "us-central1-b"
REPS = 3
LIVE_STATUS = {"command": "train", "attempt": 1, "phase": "training", "step": 100, "total_steps": 100_000,
               "exit_class": None, "heartbeat": "2026-01-01T00:00:00+00:00"}
HISTORY = [f"logs/{i:06d}.log" for i in range(8)] + [f"ckpt/ckpt-{s}.{x}" for s in (100, 200, 300)
                                                        for x in ("index", "data-00000-of-00001")] + \
          ["ckpt/checkpoint", "tb/events.out.tfevents.1.node", "status.json", "spec.json"]


# -- the worker: runs in a process whose tpuops is one implementation ---------------------------------


class Counting:
    """A store proxy that counts calls by method (works with any implementation's Store)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


class ListingApi:
    """Stands in for the node provider: one zone whose listing shows a READY node for each active run."""

    def __init__(self, project: str, names: list[str]) -> None:
        from datetime import datetime

        from tpuops.core.kinds import Capacity

        try:  # a baseline tree from before the provider seam (c4ce28f and older) has the types in tpu.py
            from tpuops.tpu import NodeInfo, NodeState
        except ImportError:
            from tpuops.providers.nodes import NodeInfo, NodeState

        created = datetime.now(UTC)
        self.nodes = [NodeInfo(name=n, zone=ZONE, project=project, accelerator="v2-8", runtime="tpu-vm-tf-2.9.3",
                               capacity=Capacity.SPOT, state=NodeState.READY, health="HEALTHY",
                               labels={"managed-by": "tpuops", "tpuops-run": n}, create_time=created, uid=n)
                      for n in names]
        self.calls: Counter[str] = Counter()

    def list_nodes(self, zone: str) -> list[Any]:
        self.calls["ListNodes"] += 1
        return list(self.nodes) if zone == ZONE else []

    def find_node(self, zone: str, name: str) -> Any:
        self.calls["GetNode"] += 1
        return next((n for n in self.nodes if n.name == name and n.zone == zone), None)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a steady pass called {name}")


def _seed(store: Any, active: list[str], finished: list[str]) -> None:
    """Runs as each implementation's declare leaves them (the new one indexes them), in parallel.

    On a local store the files are written directly (an object is the file ``<root>/<key>``, its
    generation its mtime, as for the agent's own files), so that 340,000 history files take seconds.
    """
    from concurrent.futures import ThreadPoolExecutor

    try:
        from tpuops import runs
    except ImportError:
        runs = None

    def record(run_id: str) -> bytes:
        if runs is None:
            return json.dumps({"run_id": run_id, "kind": "train", "experiment": "bench", "node": run_id,
                               "accelerator": "v2-8", "capacity": "spot", "zones": [ZONE],
                               "bundle_sha256": "0" * 64, "keep": False, "budget_usd": None}).encode()
        from tpuops.core.kinds import Capacity

        node = runs.NodeSpec(name=run_id, accelerator="v2-8", runtime="tpu-vm-tf-2.9.3", capacity=Capacity.SPOT,
                             zones=[ZONE], labels={"managed-by": "tpuops", "tpuops-run": run_id},
                             metadata={"startup-script": "#!/bin/bash\n" + "# a rendered script\n" * 200})
        return runs.RunRecord(run_id=run_id, kind=runs.RunKind.TRAIN, node=node, experiment="bench").model_dump_json(
        ).encode()

    root = Path(store.uri) if "://" not in store.uri else None

    def put(key: str, data: bytes) -> None:
        if root is None:
            store.write_bytes(key, data)
            return
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def one(item: tuple[str, bool]) -> None:
        run_id, done = item
        put(f"runs/{run_id}/run.json", record(run_id))
        put(f"runs/{run_id}/status.json", json.dumps({**LIVE_STATUS, "run_id": run_id,
                                                                   "exit_class": "succeeded" if done else None,
                                                                   "phase": "done" if done else "training"}).encode())
        if done:
            control = {"phase": "finished", "outcome": "succeeded", "attempts": 1, "zone": ZONE}
            put(f"runs/{run_id}/memory.json", json.dumps(control).encode())
            for name in HISTORY:
                if name != "status.json":
                    put(f"runs/{run_id}/{name}", b"x")
        if runs is not None:
            put(f"index/runs/{run_id}", b"")
            if not done:
                put(f"index/active/{run_id}", b"")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, [(r, False) for r in active] + [(r, True) for r in finished]))
    if runs is not None:
        put("index/built", b"")


def _controller(settings: Any, store: Any, api: ListingApi, **options: Any) -> Any:
    """This tree's controller holds a Fleet over the provider and is handed the sweep step that a user's
    controller has (a pass lists the active sweeps); a baseline's takes the API and a ledger, and advances the
    sweeps itself."""
    from tpuops.billing.ledger import Ledger
    from tpuops.controller.reconcile import Controller

    ledger = Ledger(settings.ledger_path)
    if "sweeps" in inspect.signature(Controller).parameters:
        from tpuops.sweeps.advance import SweepStep

        options["sweeps"] = SweepStep()
    if "ledger" in inspect.signature(Controller).parameters:  # the editable install answers imports of new modules
        return Controller(settings, store, api, ledger, **options)
    from tpuops.fleet import Fleet

    fleet = Fleet(api, settings, ledger)
    if "billing" in inspect.signature(Controller).parameters:
        options["billing"] = fleet.billing
    return Controller(settings, store, fleet, **options)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from tpuops.config import Settings
    from tpuops.controller.reconcile import Controller
    from tpuops.store import open_store

    home = Path(args.home)
    settings = Settings(zones=[ZONE], home=home, store=args.store, lease_ttl_s=3600.0)
    inner = open_store(args.store, gcs_endpoint=args.gcs_endpoint or None)
    active = [f"act-{i:05d}" for i in range(args.active)]
    started = time.perf_counter()
    _seed(inner, active, [f"fin-{i:05d}" for i in range(args.finished)])
    seeded = time.perf_counter() - started
    store = Counting(inner)
    api = ListingApi(settings.project, active)
    controller = _controller(settings, store, api, holder="bench")
    first = []
    for _ in range(2):  # adopt the nodes, then notice them READY: from here on a pass changes nothing
        started = time.perf_counter()
        controller.run_pass()
        first.append(time.perf_counter() - started)
    steady, calls = [], Counter()
    for _ in range(REPS):
        store.calls.clear()
        started = time.perf_counter()
        report = controller.run_pass()
        steady.append(time.perf_counter() - started)
        calls = Counter(store.calls)
        assert not report.acted and not report.errors, report
    due = []
    if "status_refresh_s" in inspect.signature(Controller).parameters:  # this tree: every status due every pass
        controller.release()
        eager = _controller(settings, store, api, holder="bench-eager", status_refresh_s=0.0)
        eager.run_pass()
        for _ in range(REPS):
            started = time.perf_counter()
            eager.run_pass()
            due.append(time.perf_counter() - started)
    return {"seed_s": seeded, "first_s": first, "steady_s": steady, "due_s": due, "store_calls": dict(calls),
            "api_calls": dict(api.calls)}


# -- the driver ----------------------------------------------------------------------------------------


def run_case(tree: Path, store_kind: str, active: int, finished: int, gcs: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tpuops-scale-") as tmp:
        if store_kind == "gcs":
            bucket = f"scale-{os.getpid()}-{int(time.time() * 1000) % 10**9}"
            gcs.create_bucket(bucket)
            store, endpoint = f"gs://{bucket}/root", gcs.endpoint
        else:
            store, endpoint = str(Path(tmp) / "store"), ""
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, __file__, "--worker", "--home", str(Path(tmp) / "home"), "--store",
                               store, "--gcs-endpoint", endpoint, "--active", str(active), "--finished",
                               str(finished)], env=env, capture_output=True, text=True, check=False, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"bench: worker failed in {tree}:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def _goal(goal: float | None, seconds: float) -> str:
    return f"< {goal} s: {'met' if seconds < goal else 'MISSED'}" if goal else "-"


def calls_text(calls: dict[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in sorted(calls.items())) or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_baseline_argument(parser)
    parser.add_argument("--quick", action="store_true", help="200 active on GCS, 2,000 finished + 50 active")
    parser.add_argument("--goals", action="store_true", help="only the two cases with goals (the largest)")
    parser.add_argument("--only", choices=("gcs", "local"), help="only the cases on this store")
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--gcs-endpoint", default="", help=argparse.SUPPRESS)
    parser.add_argument("--active", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--finished", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    measuring = result_file.Run("bench_controller_scale")
    baseline = baseline_tree(args, "a052406")
    sys.path.insert(0, str(ROOT / "tests"))
    from fake_gcs import FakeGcsServer  # test-only helper (tests/fake_gcs.py)

    cases = [("gcs", 200, 0, None), ("gcs", 2000, 0, 1.0), ("local", 50, 2000, None), ("local", 50, 20000, 0.5)]
    if args.quick:
        cases = [("gcs", 200, 0, None), ("local", 50, 2000, None)]
    if args.goals:
        cases = [case for case in cases if case[3] is not None]
    if args.only:
        cases = [case for case in cases if case[0] == args.only]
    rows = []
    with FakeGcsServer(backend="memory") as gcs:
        for store_kind, active, finished, goal in cases:
            results = {name: run_case(tree, store_kind, active, finished, gcs)
                       for name, tree in (("baseline", baseline), ("this tree", ROOT))}
            base, ours = results["baseline"], results["this tree"]
            b, o = statistics.median(base["steady_s"]), statistics.median(ours["steady_s"])
            row = {"case": f"{store_kind}: {active} active + {finished} finished runs", "baseline_s": b,
                   "ours_s": o, "speedup": b / o if o else None,
                   "ours_all_statuses_due_s": statistics.median(ours["due_s"]) if ours["due_s"] else None,
                   "goal_s": goal, "baseline_store_calls": base["store_calls"], "ours_store_calls": ours["store_calls"],
                   "ours_first_passes_s": ours["first_s"]}
            rows.append(row)
            if not args.json:
                print(f"{row['case']}: baseline {b:.3f} s/pass ({calls_text(base['store_calls'])}); this tree "
                      f"{o:.3f} s/pass ({calls_text(ours['store_calls'])}); x{row['speedup']:.1f}; all statuses due "
                      f"{row['ours_all_statuses_due_s'] or 0:.3f} s; goal "
                      f"{_goal(goal, o)}", flush=True)
    if args.result:
        measuring.write({"reps": REPS, "rows": rows}, [result_file.Table(
            f"Controller pass, median of {REPS} (steady: nothing changed since the last pass).",
            ["case", "baseline s/pass", "this tree s/pass", "speedup", "all statuses due", "goal"],
            [[row["case"], f"{row['baseline_s']:.3f}", f"{row['ours_s']:.3f}", f"x{row['speedup']:.1f}",
              f"{row['ours_all_statuses_due_s'] or 0:.3f}", _goal(row["goal_s"], row["ours_s"])] for row in rows])],
            part=args.only or "")
    if args.json:
        print(json.dumps({"reps": REPS, "rows": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"controller pass, median of {REPS} (steady: nothing changed since the last pass)")
    for column in ("case", "baseline s/pass", "this tree s/pass", "speedup", "all statuses due", "goal"):
        table.add_column(column)
    for row in rows:
        goal = row["goal_s"]
        table.add_row(row["case"], f"{row['baseline_s']:.3f}", f"{row['ours_s']:.3f}", f"x{row['speedup']:.1f}",
                      f"{row['ours_all_statuses_due_s'] or 0:.3f}",
                      _goal(goal, row["ours_s"]))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
