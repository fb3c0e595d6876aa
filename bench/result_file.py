"""The one way a benchmark writes its result file, and what a result file holds (Python 3.8 too: the TF benches).

Every figure in docs/benchmarks.md comes from a file in ``bench/results/``, written here and
rendered by ``bench/report.py``; no figure is typed by hand. A bench takes ``--result`` (beside
its ``--json``): after its run it writes ``bench/results/<bench>.json`` (or
``<bench>.<part>.json`` when the run measured one part of it), then ``python bench/report.py``
regenerates docs/benchmarks.md, and both are committed together (``tests/house/test_docs_truth.py``
fails while the page and the result files disagree).

A result file is one JSON object:

- ``bench``, ``part``: the script (``bench_cli``) and the part measured (``""``: all of it);
- ``command``: the command line that produced it, as run from the repository root;
- ``date``: when the run started and ended (UTC);
- ``load``: the 1-, 5- and 15-minute load averages before and after the run (the machine is shared:
  read every figure against them), and ``machine`` (cores, platform, Python);
- ``commit``: the tree measured (``git describe --always --dirty``);
- ``tables``: what the page shows, each ``{"caption", "columns", "rows"}`` (cells are text, as the
  bench formats them); a bench that gives none is shown by its scalar ``figures``;
- ``notes``: paragraphs (Markdown) a person wrote about this run: what it shows, what changed;
- ``figures``: everything the bench's ``--json`` prints, so a later reader can compute more;
- ``carried_over``: ``true`` for figures carried over from the README (or the doc page named in
  ``source``) of an earlier tree, with the date and conditions it stated (in ``date`` and ``load`` as
  text); the next real run replaces them.

Writing a whole run (``part == ""``) removes the bench's part files, which it replaces; writing a
part replaces that part only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--result``: also write the result file that docs/benchmarks.md is generated from."""
    parser.add_argument("--result", action="store_true",
                        help="also write bench/results/<bench>[.<part>].json (then: python bench/report.py)")


@dataclass
class Table:
    """One table of the page: a caption, column names and rows of text cells."""

    caption: str
    columns: list[str]
    rows: list[list[str]]

    def to_json(self) -> dict[str, Any]:
        if any(len(row) != len(self.columns) for row in self.rows):
            raise ValueError(f"table {self.caption!r}: every row needs {len(self.columns)} cells")
        return {"caption": self.caption, "columns": self.columns, "rows": self.rows}


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Run:
    """A benchmark run being measured: started when the bench starts, so its load and date cover the run."""

    bench: str
    started: str = field(default_factory=_now)
    load_before: list[float] = field(default_factory=_load)

    def write(self, figures: dict[str, Any], tables: Sequence[Table] = (), *, part: str = "",
              notes: Sequence[str] = ()) -> Path:
        """Write ``bench/results/<bench>[.<part>].json`` for this run and return its path."""
        result = {
            "bench": self.bench, "part": part, "command": command_line(),
            "date": {"started": self.started, "ended": _now()},
            "load": {"before": self.load_before, "after": _load()},
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "commit": _commit(), "carried_over": False,
            "tables": [table.to_json() for table in tables], "notes": list(notes), "figures": figures,
        }
        if not part:  # a whole run replaces the parts measured apart before it
            for stale in RESULTS.glob(f"{self.bench}.*.json"):
                stale.unlink()
        return save(result)


def save(result: dict[str, Any]) -> Path:
    """Write one result where the report reads it: strict JSON, a figure that is not finite written as null."""
    RESULTS.mkdir(exist_ok=True)
    bench, part = result["bench"], result["part"]
    path = RESULTS / (f"{bench}.{part}.json" if part else f"{bench}.json")
    text = json.dumps(_finite(result), indent=1, ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (a ratio over a zero time must not cost the run its result)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def command_line() -> str:
    """This process's command line as typed from the repository root (interpreter and script relative)."""
    def shown(arg: str) -> str:
        try:  # (Python 3.8, where the TF benches run, has no Path.is_relative_to)
            return str(Path(os.path.normpath(arg)).relative_to(ROOT)) if Path(arg).is_absolute() else arg
        except ValueError:
            return arg

    interpreter = shown(sys.executable)
    return shlex.join([interpreter if interpreter != sys.executable else "python", *map(shown, sys.argv)])


def _commit() -> str:
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=False)
    except OSError:
        return ""
    return done.stdout.strip()
