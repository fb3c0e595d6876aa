"""Conformance of the local emulator to clients nobody on this project wrote: ours vs the baseline.

For each client — the Google Cloud CLI (``tests/emulator/test_conformance_gcloud.py``: one step per
``gcloud compute tpus`` command) and the official Python client (``tests/emulator/test_conformance_client.py``:
one step per RPC, v2 and v2alpha1, with the inputs of Google's samples) — it counts the steps
that pass unmodified against this checkout's emulator (``--no-auth``, as for any third-party
client) and against a baseline emulator started from another checkout (``--baseline DIR``,
the code before this work), side by side in one run. The counts are deterministic, so one
repetition is run; wall time is reported for information.

    .venv/bin/python bench/bench_conformance.py [--baseline PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import result_file

ROOT = Path(__file__).resolve().parents[1]
SUITES = {"gcloud compute tpus": "tests/emulator/test_conformance_gcloud.py",
          "google-cloud-tpu (Python) RPCs": "tests/emulator/test_conformance_client.py"}
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


def _run_suite(suite: str, endpoint: str | None) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        env = {**os.environ}
        env.pop("TPUOPS_CONFORMANCE_ENDPOINT", None)
        if endpoint:
            env["TPUOPS_CONFORMANCE_ENDPOINT"] = endpoint
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite, f"--junitxml={report}"],
                       cwd=ROOT, env=env, capture_output=True, check=False)
        wall = time.monotonic() - started
        cases = ET.parse(report).getroot().iter("testcase")
        results = {case.get("name"): not any(child.tag in ("failure", "error", "skipped") for child in case)
                   for case in cases}
    return {"passed": sum(results.values()), "total": len(results), "wall_s": round(wall, 1),
            "failing": sorted(name for name, ok in results.items() if not ok)}


def _start_baseline(checkout: Path, state_dir: Path) -> tuple[subprocess.Popen[str], str]:
    # -S: no site packages, so the editable install of this checkout cannot shadow the baseline's
    # package (the emulator needs the standard library only); -m finds it in the cwd.
    proc = subprocess.Popen([sys.executable, "-S", "-m", "tpuops.emulator", "serve", "--port", "0", "--state-dir",
                             str(state_dir), "--boot-delay", "0.1"], cwd=checkout, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        found = _LISTENING.search(line)
        if found:
            return proc, found.group(1)
    raise RuntimeError("the baseline emulator did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="checkout of the baseline")
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_conformance")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline, endpoint = (None, None)
        if (args.baseline / "tpuops" / "emulator").is_dir():
            baseline, endpoint = _start_baseline(args.baseline, Path(tmp) / "baseline")
        try:
            for client, suite in SUITES.items():
                ours = _run_suite(suite, None)
                base = _run_suite(suite, endpoint) if endpoint else None
                rows.append({"client": client, "ours": ours, "baseline": base})
        finally:
            if baseline is not None:
                baseline.terminate()
                baseline.wait(timeout=30)
    if args.result:
        measuring.write({"baseline": str(args.baseline), "rows": rows}, [result_file.Table(
            "Steps that pass, run unmodified against this emulator and against the baseline's.",
            ["client", "steps", "pass, this emulator", "pass, baseline"],
            [[row["client"], str(row["ours"]["total"]), str(row["ours"]["passed"]),
              str(row["baseline"]["passed"]) if row["baseline"] else "n/a"] for row in rows])])
    if args.json:
        print(json.dumps({"baseline": str(args.baseline), "rows": rows}, indent=2))
        return 0
    print(f"{'client':34} {'ours (pass/total)':>18} {'baseline ' + str(args.baseline):>26}")
    for row in rows:
        ours, base = row["ours"], row["baseline"]
        base_text = f"{base['passed']}/{base['total']}" if base else "n/a"
        print(f"{row['client']:34} {ours['passed']:>8}/{ours['total']:<9} {base_text:>26}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
