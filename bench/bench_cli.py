"""Wall time of everyday commands: this tree against a baseline tree, side by side in one run.

    .venv/bin/python bench/bench_cli.py [--baseline DIR] [--json]

Times ``tpuops --help``, ``tpuops status`` with 200 active runs and 0 then 200 nodes, and ``tpuops runs``
with 200 runs, each a fresh ``python -m tpuops`` process (what a user waits for), median of 3 repetitions
after one warm-up, the two trees taking turns, beside the interpreter alone (``python -c pass``: the floor
no command goes under, and what a loaded machine adds to every row). ``--baseline`` is a checkout of the
commit to compare with (default ``$TPUOPS_BASELINE`` or /tmp/tpuops-baseline; ``git archive c4ce28f | tar -x -C DIR``);
both trees run on this environment's packages, the baseline's ``tpuops`` first on ``PYTHONPATH``, each process
in its tree's home (Python puts the working directory before ``PYTHONPATH``: run from a checkout, both columns
would time that checkout).
Both trees are byte-compiled first, as an install leaves them. The nodes live in one local emulator whose nodes
run a one-line sleep; each tree has its own home (ledger) and a store seeded with runs in its own format
(``bench_controller_scale._seed``). Goals: no slower than the baseline, ``tpuops status`` with 200 active runs
and 0 nodes under 0.6 s, ``--help`` under 0.2 s (on a quiet machine: read a loaded one's figures against the
interpreter's row and the load the result file records). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import result_file
from baseline import add_argument as add_baseline_argument
from baseline import tree as baseline_tree

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
REPS = 3
NODES = 200
ZONE = "us-central1-b"
SEED = """
import sys
sys.path.insert(0, {bench!r})
from bench_controller_scale import _seed
from tpuops.store import open_store
_seed(open_store({store!r}), [f"run-{{i:04d}}" for i in range({runs})], [])
"""


INTERPRETER = ("-c", "pass")
"""The interpreter alone: what every row pays before tpuops imports anything."""


def run_once(tree: Path, env: dict[str, str], args: tuple[str, ...]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one fresh ``python -m tpuops ARGS`` (``python -c pass`` for
    INTERPRETER) with ``tree`` first on the path. The CPU time is what a loaded machine inflates least."""
    argv = [sys.executable, *(args if args == INTERPRETER else ("-m", "tpuops", *args))]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env={**env, "PYTHONPATH": str(tree)}, cwd=env["TPUOPS_HOME"], capture_output=True,
                          text=True, check=False, timeout=600)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[1:])} failed in {tree}:\n{done.stderr[-2000:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def timed(trees: dict[str, Path], envs: dict[str, dict[str, str]], *args: str) -> dict[str, float]:
    """Median wall seconds per tree (``NAME``) and median CPU seconds (``NAME cpu``) over REPS runs after
    one warm-up, the trees taking turns.

    Taking turns (baseline, this tree, baseline, ...) spreads a busy machine's load over both
    trees alike, so the ratio holds when the absolute times drift.
    """
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for rep in range(REPS + 1):
        for name, tree in trees.items():
            measured = run_once(tree, envs[name], args)
            if rep:
                times[name].append(measured)
    return {key: statistics.median(value[i] for value in values)
            for name, values in times.items() for i, key in enumerate((name, f"{name} cpu"))}


COLUMNS = ("command", "baseline s", "this tree s", "ratio", "baseline CPU s", "this tree CPU s")


def table_rows(rows: list[tuple[str, dict[str, float]]]) -> list[list[str]]:
    """The cells of the table, the same on the page and on the terminal."""
    return [[command, f"{values['baseline']:.3f}", f"{values['this tree']:.3f}",
             f"x{values['baseline'] / values['this tree']:.2f}", f"{values['baseline cpu']:.3f}",
             f"{values['this tree cpu']:.3f}"] for command, values in rows]


def make_nodes(endpoint: str, count: int) -> None:
    from tpuops.core.kinds import Capacity
    from tpuops.core.naming import labels_for
    from tpuops.emulator import token_for
    from tpuops.providers.cloud_tpu.adapter import TpuApi
    from tpuops.providers.nodes import NodeRequest

    api = TpuApi("tpuops-local", endpoint=endpoint, token=token_for(endpoint), poll_interval_s=0.05)
    for i in range(count):
        api.create_node(ZONE, NodeRequest(name=f"node-{i:04d}", accelerator="v2-8", runtime="tpu-vm-tf-2.9.3",
                                          capacity=Capacity.SPOT, labels=labels_for(),
                                          metadata={"startup-script": "#!/bin/bash\nexec sleep 3600\n"}))
    deadline = time.monotonic() + 300
    while sum(n.state.value == "READY" for n in api.list_nodes(ZONE)) < count:
        if time.monotonic() > deadline:
            raise SystemExit("bench: the nodes did not become READY")
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_baseline_argument(parser)
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_cli")
    baseline = baseline_tree(args, "c4ce28f")
    from tpuops.emulator import start_background, stop

    trees = {"baseline": baseline, "this tree": ROOT}
    for tree in trees.values():  # as an install leaves them (this machine sets PYTHONDONTWRITEBYTECODE)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "tpuops")], check=True, timeout=600,
                       capture_output=True)
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="tpuops-cli-") as tmp:
        work = Path(tmp)
        info = start_background(work / "emulator", boot_delay_s=0.05, grace_s=1.0)
        try:
            envs = {}
            for name, tree in trees.items():
                home = work / name.replace(" ", "-")
                config = home / "tpuops.toml"
                home.mkdir()
                config.write_text(f'zones = ["{ZONE}"]\nstore = "{home / "store"}"\n')
                envs[name] = {**{k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")},
                              "TPUOPS_HOME": str(home), "TPUOPS_CONFIG": str(config),
                              "TPUOPS_TPU_ENDPOINT": info.endpoint}
                subprocess.run([sys.executable, "-c", SEED.format(bench=str(BENCH), store=str(home / "store"),
                                                                  runs=NODES)],
                               env={**os.environ, "PYTHONPATH": str(tree)}, cwd=home, check=True, timeout=600)
            rows.append(("python -c pass (the interpreter alone)", timed(trees, envs, *INTERPRETER)))
            rows.append(("tpuops --help", timed(trees, envs, "--help")))
            rows.append((f"tpuops status, {NODES} active runs, 0 nodes", timed(trees, envs, "status")))
            rows.append((f"tpuops runs, {NODES} runs", timed(trees, envs, "runs")))
            make_nodes(info.endpoint, NODES)
            rows.append((f"tpuops status, {NODES} active runs, {NODES} nodes", timed(trees, envs, "status")))
        finally:
            stop(info.state_dir)
    figures = {"reps": REPS, "rows": [{"command": c, **v} for c, v in rows]}
    if args.result:
        measuring.write(figures, [result_file.Table(
            f"Wall and CPU time, median of {REPS} fresh processes, the two trees taking turns; baseline: {baseline}.",
            list(COLUMNS), table_rows(rows))])
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"command wall time, median of {REPS} fresh processes")
    for column in COLUMNS:
        table.add_column(column)
    for cells in table_rows(rows):
        table.add_row(*cells)
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
