"""Benchmark the node layer on the local emulator and print one table.

    .venv/bin/python bench/bench_nodes.py [--nodes 64] [--listed 200]

Measures, side by side in one run:
- ``tpuops --help`` wall time (goal < 0.3 s: commands import only what they need), against
  ``python -c pass`` as the floor every Python CLI pays;
- ``tpuops status`` with 0 and with ``--listed`` nodes in the emulator, and the ListNodes
  calls it made (goal: one per zone and page, independent of the node count), against a
  naive status that lists names and then calls GetNode per node;
- creating and deleting ``--nodes`` nodes concurrently: wall time and API calls per node.
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import result_file

from tpuops.core.kinds import Capacity
from tpuops.emulator import AdminClient, start_background, stop
from tpuops.providers.base import wait_for
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.providers.nodes import NodeRequest

ZONES = ["us-central1-a", "us-central1-b"]
PROJECT = "tpuops-local"


def _wall(cmd: list[str], env: dict[str, str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _calls(admin: AdminClient, fn: Callable[[], object]) -> tuple[float, dict[str, int]]:
    admin.reset_stats()
    seconds = _timed(fn)
    return seconds, admin.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--listed", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_nodes")

    tpuops = str(Path(sys.executable).with_name("tpuops"))
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as home:
        info = start_background(Path(home) / "emulator", boot_delay_s=0.05, grace_s=1.0)
        try:
            admin = AdminClient(info.endpoint)
            config = Path(home) / "tpuops.toml"
            config.write_text(f"zones = {json.dumps(ZONES)}\n")
            env = {**os.environ, "TPUOPS_HOME": home, "TPUOPS_CONFIG": str(config),
                   "TPUOPS_TPU_ENDPOINT": info.endpoint}

            floor = _wall([sys.executable, "-c", "pass"], env, args.repeat)
            helped = _wall([tpuops, "--help"], env, args.repeat)
            rows.append(("tpuops --help", f"{helped:.3f} s", f"python -c pass {floor:.3f} s",
                         f"{'met' if helped < 0.3 else 'MISSED'} (< 0.3 s)"))

            api = TpuApi(PROJECT, endpoint=info.endpoint, token=info.token, poll_interval_s=0.05)
            admin.reset_stats()
            empty = _wall([tpuops, "status", "--json"], env, args.repeat)
            lists_empty = admin.stats().get("ListNodes", 0) / args.repeat
            rows.append(("tpuops status, 0 nodes", f"{empty:.3f} s", "", f"{lists_empty:.0f} ListNodes"))

            def request(i: int) -> NodeRequest:
                return NodeRequest(name=f"bench-{i:04d}", accelerator="v3-8", runtime="tpu-vm-tf-2.9.3",
                                   capacity=Capacity.SPOT, labels={"managed-by": "tpuops"})

            def create(i: int) -> None:
                zone = ZONES[i % len(ZONES)]
                wait_for(api, api.create_node(zone, request(i)), timeout_s=120)

            def delete(i: int) -> None:
                zone = ZONES[i % len(ZONES)]
                operation = api.delete_node(zone, request(i).name)
                if operation is not None:
                    wait_for(api, operation, timeout_s=120)

            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(create, range(args.listed)))
            admin.reset_stats()
            full = _wall([tpuops, "status", "--json"], env, args.repeat)
            lists_full = admin.stats().get("ListNodes", 0) / args.repeat

            def naive_status() -> None:
                names = [(n.zone, n.name) for zone in ZONES for n in api.list_nodes(zone)]
                with ThreadPoolExecutor(max_workers=8) as pool:
                    list(pool.map(lambda zn: api.get_node(*zn), names))

            naive_s, naive_calls = _calls(admin, naive_status)
            rows.append((f"tpuops status, {args.listed} nodes", f"{full:.3f} s",
                         f"GetNode per node {naive_s:.3f} s ({sum(naive_calls.values())} calls)",
                         f"{lists_full:.0f} ListNodes ({lists_full / len(ZONES):.0f} per zone)"))
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(delete, range(args.listed)))

            n = args.nodes
            with ThreadPoolExecutor(max_workers=n) as pool:
                create_s, create_calls = _calls(admin, lambda: list(pool.map(create, range(n))))
                delete_s, delete_calls = _calls(admin, lambda: list(pool.map(delete, range(n))))
            per_node = (sum(create_calls.values()) + sum(delete_calls.values())) / n
            rows.append((f"create {n} nodes concurrently", f"{create_s:.2f} s",
                         f"{sum(create_calls.values()) / n:.1f} calls/node", "boot delay 0.05 s"))
            rows.append((f"delete {n} nodes concurrently", f"{delete_s:.2f} s",
                         f"{sum(delete_calls.values()) / n:.1f} calls/node", f"{per_node:.1f} calls/node in all"))
        finally:
            stop(info.state_dir)

    if args.result:
        measuring.write({"nodes": args.nodes, "listed": args.listed, "repeat": args.repeat}, [result_file.Table(
            f"Medians of {args.repeat} fresh processes per command; the local emulator, zones {', '.join(ZONES)}.",
            ["measure", "tpuops", "baseline", "goal / note"], [list(row) for row in rows])])
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tpuops node layer on the local emulator")
    for column in ("measure", "tpuops", "baseline", "goal / note"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
