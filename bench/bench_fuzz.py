"""Benchmark the bad-input fuzzer: throughput and distinct crash signatures, this tree vs the tree before issue 21.

Run:  .venv/bin/python bench/bench_fuzz.py --base /tmp/base-input [--cases 300] [--repeats 3] [--json]

``--base`` is a checkout of the tree to compare with (e.g. ``git archive c4ce28f | tar -x -C /tmp/base-input``).
Both trees are fuzzed by the same harness (``tests/fuzzing.py``: the CLI's argument space drawn from
the Typer app, run in-process against a config whose endpoint nothing listens on), each repetition
in a fresh process per tree, the two trees taking turns, with the same seeds. Per tree and repetition:

- ``cases_per_s``: cases run per second of wall time;
- ``signatures``: distinct broken promises (``fuzzing.verdict`` with numbers and paths stripped:
  a crash is its exception type and innermost tpuops frame);
- ``max_refused_s``: the longest any refused case (exit 2) took;
- ``max_rss_mb``: the process's peak resident memory over the whole run (an upper bound for
  any single case; the harness's own imports take most of it). The process runs under a 3 GB
  address-space limit, so an input that would take more ends as a MemoryError signature.

Then every file of ``tests/corpus`` is given to ``train FILE --dry-run`` (the config ones to
``--config FILE status``), each in a fresh process per tree under the same limits and a 60 s
timeout: ``corpus_max_s`` and ``corpus_max_rss_mb`` are the worst of them, and the files that
did not end in a refusal (exit 2) or ran out of time or memory are listed.

Ratios: ours / base for throughput; signatures are printed as counts, and the union's list is in ``--json``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import result_file

REPO = Path(__file__).resolve().parents[1]
ADDRESS_SPACE = 3 << 30


def worker(tree: Path, cases: int, seed: int) -> dict[str, Any]:
    """Fuzz ``tree``'s CLI in this process: ``cases`` cases from ``seed``."""
    import resource
    import tempfile
    import time

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    sys.path[:0] = [str(tree), str(REPO / "tests")]
    from fuzzing import Sandbox, cli_cases, run_case, verdict
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as with_seed

    import tpuops

    assert Path(tpuops.__file__).resolve().is_relative_to(tree.resolve()), tpuops.__file__
    found: dict[str, list[str]] = {}
    refused_s = [0.0]
    count = [0]

    @with_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(argv=cli_cases())
    def fuzz(argv: list[str]) -> None:
        count[0] += 1
        sandboxes.append(Sandbox.make(Path(tempfile.mkdtemp()) / "case"))
        outcome = run_case(sandboxes[-1], argv)
        if outcome.code == 2:
            refused_s[0] = max(refused_s[0], outcome.seconds)
        problem = verdict(outcome)
        if problem:
            found.setdefault(_signature(problem, argv), argv)

    sandboxes: list[Sandbox] = []
    started = time.monotonic()
    fuzz()
    seconds = time.monotonic() - started
    for sandbox in sandboxes:  # a server started late by a thread a case left behind
        if sandbox.stop_server():
            found.setdefault("left an emulator running after its case", [])
    return {"cases": count[0], "seconds": seconds, "cases_per_s": count[0] / seconds, "signatures": sorted(found),
            "max_refused_s": refused_s[0], "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def corpus_worker(tree: Path, sample: Path) -> dict[str, Any]:
    """One corpus file through ``tree``'s CLI in this process: exit code, seconds, peak memory."""
    import resource
    import tempfile

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    sys.path[:0] = [str(tree), str(REPO / "tests")]
    from fuzzing import Sandbox, run_case

    argv = ["--config", str(sample), "status"] if sample.suffix == ".toml" else ["train", str(sample), "--dry-run"]
    outcome = run_case(Sandbox.make(Path(tempfile.mkdtemp()) / "case"), argv)
    code = outcome.code if outcome.crash is None else type(outcome.crash).__name__
    return {"file": sample.name, "code": code, "seconds": outcome.seconds, "rss_mb": outcome.peak_mb}


def _corpus(tree: Path) -> dict[str, Any]:
    worst = {"corpus_max_s": 0.0, "corpus_max_rss_mb": 0.0, "not_refused": []}
    for sample in sorted((REPO / "tests" / "corpus").iterdir()):
        if sample.suffix == ".json":
            continue  # manifests are read from the store, not named on the command line
        try:
            done = subprocess.run([sys.executable, __file__, "--corpus-case", str(sample), "--worker", str(tree)],
                                  capture_output=True, text=True, timeout=60, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            result = json.loads(lines[-1]) if lines else {"file": sample.name, "code": "died", "seconds": 0.0,
                                                          "rss_mb": ADDRESS_SPACE / 2**20}
        except subprocess.TimeoutExpired:
            result = {"file": sample.name, "code": "timeout", "seconds": 60.0, "rss_mb": 0.0}
        worst["corpus_max_s"] = max(worst["corpus_max_s"], result["seconds"])
        worst["corpus_max_rss_mb"] = max(worst["corpus_max_rss_mb"], result["rss_mb"])
        if result["code"] != 2:
            worst["not_refused"].append(f"{result['file']}: {result['code']}")
    return worst


def _signature(problem: str, argv: list[str]) -> str:
    """The kind of broken promise and the command: values, numbers and paths stripped."""
    command = " ".join(word for word in argv[:2] if re.fullmatch(r"[a-z]+", word))
    kind = re.sub(r"\d+(\.\d+)?", "N", problem.split(":")[0].split("[")[0])[:80]
    return f"{command}: {kind}".strip()


def _run(tree: Path, cases: int, seed: int, timeout_s: float) -> dict[str, Any]:
    try:
        done = subprocess.run([sys.executable, __file__, "--worker", str(tree), "--cases", str(cases), "--seed",
                               str(seed)], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"cases": 0, "seconds": timeout_s, "cases_per_s": 0.0, "signatures": ["the whole run hung"],
                "max_refused_s": timeout_s, "max_rss_mb": 0.0}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"cases": 0, "seconds": 0.0, "cases_per_s": 0.0, "signatures": [f"the run died: {tail[0][:120]}"],
                "max_refused_s": 0.0, "max_rss_mb": 0.0}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="checkout of the tree to compare with")
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one tree's run may take")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--corpus-case", type=Path, help=argparse.SUPPRESS)
    result_file.add_argument(parser)
    args = parser.parse_args()
    if args.worker and args.corpus_case:
        print(json.dumps(corpus_worker(args.worker, args.corpus_case)))
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.cases, args.seed)))
        return
    measuring = result_file.Run("bench_fuzz")
    trees = {"ours": REPO, **({"base": args.base} if args.base else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for repeat in range(args.repeats):
        for name, tree in trees.items():
            runs[name].append(_run(tree, args.cases, 1000 + repeat, args.timeout))
    summary = {name: {"cases_per_s": statistics.median(r["cases_per_s"] for r in results),
                      "signatures": len(set().union(*(r["signatures"] for r in results))),
                      "max_refused_s": max(r["max_refused_s"] for r in results),
                      "max_rss_mb": max(r["max_rss_mb"] for r in results)}
               for name, results in runs.items()}
    for name, tree in trees.items():
        summary[name].update(_corpus(tree))
    if "base" in summary and summary["base"]["cases_per_s"]:
        summary["throughput_ratio"] = summary["ours"]["cases_per_s"] / summary["base"]["cases_per_s"]
    if args.result:
        measuring.write({"summary": summary, "runs": runs}, [result_file.Table(
            f"{args.cases} cases x {args.repeats} repetitions per tree, medians; ours: this tree, base: {args.base}.",
            ["tree", "cases/s", "distinct failure signatures", "slowest refused case", "peak RSS",
             "corpus files not refused"],
            [[name, f"{summary[name]['cases_per_s']:.1f}", str(summary[name]["signatures"]),
              f"{summary[name]['max_refused_s']:.2f} s", f"{summary[name]['max_rss_mb']:.0f} MB",
              ", ".join(summary[name]["not_refused"]) or "0"] for name in trees])])
    if args.json:
        print(json.dumps({"summary": summary, "runs": runs}, indent=2, sort_keys=True))
        return
    print(f"{'tree':<6} {'cases/s':>8} {'signatures':>11} {'max refused s':>14} {'max RSS MB':>11} "
          f"{'corpus max s':>13} {'corpus max MB':>14}  corpus files not refused")
    for name in trees:
        row = summary[name]
        print(f"{name:<6} {row['cases_per_s']:>8.1f} {row['signatures']:>11} {row['max_refused_s']:>14.2f} "
              f"{row['max_rss_mb']:>11.0f} {row['corpus_max_s']:>13.2f} {row['corpus_max_rss_mb']:>14.0f}  "
              f"{', '.join(row['not_refused']) or '-'}")
    if "throughput_ratio" in summary:
        print(f"throughput ours/base: {summary['throughput_ratio']:.2f}")


if __name__ == "__main__":
    main()
