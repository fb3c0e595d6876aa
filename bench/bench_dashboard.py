"""What ``tpuops dashboard`` costs: first paint, live latency, and its reads and memory, measured in one run.

    .venv/bin/python bench/bench_dashboard.py [--runs N] [--only local|gcs] [--window S] [--json]

Each figure is the median of 3 repetitions; the dashboard is the real app served by uvicorn on
127.0.0.1 in this process, read over HTTP as the browser reads it, over a store seeded with runs
as ``declare`` writes them (record, spec, index markers) plus a training status each.

1. First paint of the Runs page with N runs (default 2,000), on the local store and on
   fake-gcs-server: the whole HTML of ``/runs``, served from the run index alone. Side by side,
   the baseline is what a page built from every run's files costs: ``tpuops.api.run_rows`` over
   every run (the files ``tpuops runs`` reads), the ratio is baseline / ours. Goal < 0.5 s.
2. Status write to the browser: 50 active runs, one client on ``/live/runs``; the time from an
   agent-style rewrite of one run's status.json to the event naming it and the row fetched again
   (what the page does on the event). Goal < 2 s.
3. Store reads per minute and resident memory of the dashboard with 50 active runs: idle (no page
   open) and with the Runs page's live stream open, over ``--window`` seconds scaled to a minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import result_file

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

from bench_controller_scale import Counting  # noqa: E402  (the store proxy counting calls by method)

REPS = 3
TOKEN = "bench-token"
LIVE = {"command": "train", "attempt": 1, "phase": "training", "step": 100, "total_steps": 100_000,
        "exit_class": None, "heartbeat": "2026-01-01T00:00:00+00:00"}


def _record(run_id: str) -> Any:
    from tpuops.core.kinds import Capacity
    from tpuops.runs import NodeSpec, RunKind, RunRecord

    node = NodeSpec(name=run_id, accelerator="v3-8", runtime="tpu-vm-tf-2.9.3", capacity=Capacity.SPOT,
                    zones=["us-central1-a"], labels={"managed-by": "tpuops", "tpuops-run": run_id})
    return RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=node, experiment="digits",
                     created="2026-12-01T00:00:00+00:00")


def seed(store: Any, count: int, prefix: str = "run") -> list[str]:
    from tpuops import runs

    ids = [f"{prefix}-{i:05d}" for i in range(count)]
    runs.ensure_index(store)  # indexed while empty, as a store tpuops made is: the runs below are indexed as declared

    def one(run_id: str) -> None:
        runs.declare(store, _record(run_id), {"version": 1, "run_id": run_id})
        store.write_bytes(runs.status_key(run_id), json.dumps({**LIVE, "run_id": run_id}).encode())

    runs.parallel_map(one, ids)
    return ids


@contextmanager
def served(settings: Any, store: Any, refresh_s: float = 1.0) -> Iterator[str]:
    """The dashboard app over ``store`` on a free loopback port; its base URL."""
    from tpuops.dashboard.app import Dashboard
    from tpuops.dashboard.serve import listen, server
    from tpuops.dashboard.source import bound_source

    app = Dashboard(bound_source(settings, root=store), token=TOKEN, read_only=True, refresh_s=refresh_s).asgi()
    sock = listen(0)
    uvicorn = server(app)
    thread = threading.Thread(target=uvicorn.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        uvicorn.should_exit = True
        thread.join(10)
        sock.close()


def _client() -> Any:
    import httpx

    return httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


def median_of(fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(REPS))


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def first_paint(settings: Any, store: Any, count: int) -> dict[str, Any]:
    from tpuops.api.pages import run_ids, run_rows

    ids = seed(store, count)
    with served(settings, store) as base, _client() as http:
        def ours() -> float:
            return timed(lambda: http.get(f"{base}/runs").raise_for_status())

        def baseline() -> float:
            return timed(lambda: run_rows(settings, run_ids(settings, root=store), root=store))

        assert http.get(f"{base}/runs").text.count("data-run=") == len(ids)
        rows: list[tuple[float, float]] = [(baseline(), ours()) for _ in range(REPS)]  # taking turns
    b, o = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
    return {"runs": count, "baseline_s": b, "ours_s": o, "ratio": b / o, "goal_s": 0.5}


def status_to_browser(settings: Any, store: Any) -> dict[str, Any]:
    from tpuops import runs

    ids = seed(store, 50, prefix="live")
    with served(settings, store) as base, _client() as http:
        def once() -> float:
            with http.stream("GET", f"{base}/live/runs") as stream:
                lines = stream.iter_lines()
                next(line for line in lines if line.startswith(": tick"))  # its first look is taken
                target = ids[int(time.time()) % len(ids)]
                started = time.perf_counter()
                store.write_bytes(runs.status_key(target), json.dumps({**LIVE, "run_id": target,
                                                                        "step": int(time.time())}).encode())
                for line in lines:
                    if line.startswith("data:") and target in line:
                        http.get(f"{base}/data/runs", params={"ids": target}).raise_for_status()
                        return time.perf_counter() - started
            raise AssertionError("the stream ended before the change was seen")

        return {"active_runs": len(ids), "seconds": median_of(once), "goal_s": 2.0}


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reads_and_memory(settings: Any, store: Any, window_s: float) -> dict[str, Any]:
    seed(store, 50, prefix="busy")
    counting = Counting(store)
    rows = {}
    with served(settings, counting) as base, _client() as http:
        for case in ("idle", "one open page"):
            reads = []
            for _ in range(REPS):
                counting.calls.clear()
                if case == "idle":
                    time.sleep(window_s)
                else:
                    with http.stream("GET", f"{base}/live/runs") as stream:
                        deadline = time.monotonic() + window_s
                        for _line in stream.iter_lines():
                            if time.monotonic() > deadline:
                                break
                reads.append(sum(counting.calls.values()) * 60 / window_s)
            rows[case] = {"store_calls_per_min": statistics.median(reads), "rss_mb": _rss_mb()}
    return {"active_runs": 50, "window_s": window_s, **rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--only", choices=("local", "gcs"))
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_dashboard")

    from fake_gcs import FakeGcsServer  # test-only helper (tests/fake_gcs.py)

    from tpuops.config import Settings
    from tpuops.core.kinds import Cloud
    from tpuops.store import LocalStore, gcs_client
    from tpuops.store.gcs import GcsStore

    out: dict[str, Any] = {"reps": REPS, "first_paint": [], "status_to_browser": None, "reads_and_memory": None}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        def settings(name: str) -> Settings:
            return Settings(tpu_endpoint=Cloud.GCP, node_provider="memory", project="p", zones=["us-central1-a"],
                            home=work / name / "home", store=str(work / name / "store"))

        if args.only in (None, "local"):
            out["first_paint"].append({"store": "local", **first_paint(settings("local"),
                                                                         LocalStore(work / "local" / "store"),
                                                                         args.runs)})
        if args.only in (None, "gcs"):
            with FakeGcsServer() as server:
                server.create_bucket("bench")
                gcs = GcsStore("bench", "root", client=gcs_client(server.endpoint), deadline_s=30)
                out["first_paint"].append({"store": "gcs (fake-gcs-server)",
                                           **first_paint(settings("gcs"), gcs, args.runs)})
        out["status_to_browser"] = status_to_browser(settings("live"), LocalStore(work / "live" / "store"))
        out["reads_and_memory"] = reads_and_memory(settings("busy"), LocalStore(work / "busy" / "store"),
                                                   args.window)
    if args.result:
        measuring.write(out, [result_file.Table(
            f"First paint of /runs, median of {REPS}; baseline: a page built from every run's files.",
            ["store", "runs", "baseline s", "ours s", "ratio", "goal s"],
            [[row["store"], str(row["runs"]), f"{row['baseline_s']:.3f}", f"{row['ours_s']:.3f}",
              f"{row['ratio']:.1f}", f"{row['goal_s']:.1f}"] for row in out["first_paint"]])],
            part=args.only or "")
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"first paint of /runs (median of {REPS}; baseline: every run's files read)")
    print(f"{'store':<24}{'runs':>6}{'baseline s':>12}{'ours s':>10}{'ratio':>8}{'goal s':>8}")
    for row in out["first_paint"]:
        print(f"{row['store']:<24}{row['runs']:>6}{row['baseline_s']:>12.3f}{row['ours_s']:>10.3f}"
              f"{row['ratio']:>8.1f}{row['goal_s']:>8.1f}")
    live = out["status_to_browser"]
    print(f"\nstatus write -> event + row fetched, {live['active_runs']} active runs: {live['seconds']:.3f} s "
          f"(goal {live['goal_s']:.0f} s)")
    busy = out["reads_and_memory"]
    print(f"\n{'dashboard, 50 active runs':<28}{'store calls/min':>16}{'RSS MB':>9}")
    for case in ("idle", "one open page"):
        print(f"{case:<28}{busy[case]['store_calls_per_min']:>16.0f}{busy[case]['rss_mb']:>9.0f}")


if __name__ == "__main__":
    main()
