"""The tree a benchmark compares this one with: where it is, and one line when it is missing.

A baseline is a plain copy of an older commit (``git archive COMMIT | tar -x -C DIR``), imported
in a child process with ``PYTHONPATH`` pointing at it, so both trees run side by side in one run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--baseline DIR`` (default ``$TPUOPS_BASELINE`` or /tmp/tpuops-baseline)."""
    parser.add_argument("--baseline", default=os.environ.get("TPUOPS_BASELINE", "/tmp/tpuops-baseline"),
                        help="a copy of the commit to compare with")


def tree(args: argparse.Namespace, commit: str) -> Path:
    """The baseline tree the arguments name; exits with how to make one when it is not there."""
    baseline = Path(args.baseline)
    if not (baseline / "tpuops" / "__init__.py").is_file():
        raise SystemExit(f"bench: no baseline tree at {baseline} (git archive {commit} | tar -x -C {baseline})")
    return baseline
