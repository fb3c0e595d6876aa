"""How many package files a node provider is named in: this tree against a baseline tree, in one run.

    .venv/bin/python bench/bench_provider_seam.py [--baseline DIR] [--json]

A new provider has to touch every file that names the one it stands next to. In this tree each
registered provider (``tpuops.providers.registry.PROVIDERS``) is counted: the files under
``tpuops/`` that name its module or its class. In the baseline (``--baseline``, default
``$TPUOPS_BASELINE`` or /tmp/tpuops-baseline; make one with ``git archive c4ce28f | tar -x -C DIR``),
which has no registry, the one adapter is counted the same way (``tpuops.tpu``, ``TpuApi``): those
files import the adapter or its types, and a second provider would have to be threaded through each.
The count is of text, so it is exact: one run, no repetitions. Goal: 2 files for a new provider.

The proof (a second table): a provider whose vocabulary is not Cloud TPU's, the test-only JobSet one
(``tests/provider_jobset.py``: TPUs on GKE kept as manifests), which passes the contract suite and runs a run
(``tests/providers/test_provider_jobset.py``). Counted for it: its module, its registry lines (where ``PROVIDERS`` gets
it: the tests put the one line in with ``monkeypatch.setitem``) and the package files that name it. Goal: one
module, one registry line, no package file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import result_file

ROOT = Path(__file__).resolve().parents[1]
GOAL = 2
PROOF_MODULE = "provider_jobset"
PROOF_CLASS = "JobSetProvider"


def naming_files(tree: Path, patterns: list[str]) -> list[str]:
    """The package's files (tpuops/**/*.py) in which any of ``patterns`` (regular expressions) occurs."""
    found = re.compile("|".join(patterns))
    return sorted(str(path.relative_to(tree)) for path in (tree / "tpuops").rglob("*.py")
                  if found.search(path.read_text(encoding="utf-8")))


def this_tree() -> list[dict[str, object]]:
    from tpuops.providers.registry import PROVIDERS

    rows = []
    for name, path in PROVIDERS.items():
        module, _, cls = path.partition(":")
        files = naming_files(ROOT, [rf"\b{re.escape(module)}\b", rf"\b{cls}\b"])
        rows.append({"tree": "this tree", "provider": name, "files": files, "count": len(files)})
    return rows


def baseline_tree(baseline: Path) -> dict[str, object]:
    """The one adapter of a tree from before the seam, counted as a provider is here."""
    if not (baseline / "tpuops" / "tpu.py").is_file():
        raise SystemExit(f"bench: no baseline tree with tpuops/tpu.py at {baseline} "
                         f"(git archive c4ce28f | tar -x -C {baseline})")
    files = naming_files(baseline, [r"\btpuops\.tpu\b", r"from tpuops import tpu\b", r"\bTpuApi\b"])
    return {"tree": "baseline", "provider": "cloud tpu (tpu.py)", "files": files, "count": len(files)}


def proof() -> dict[str, object]:
    """What adding the test-only JobSet provider took: its module, its registry lines, the package files naming it."""
    line = re.compile(rf"[\"']{PROOF_MODULE}:{PROOF_CLASS}[\"']")
    registry = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "tests").rglob("*.py"))
                for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.search(text)]
    package = naming_files(ROOT, [rf"\b{PROOF_MODULE}\b", rf"\b{PROOF_CLASS}\b"])
    return {"provider": "jobset (test-only, GKE JobSet manifests)", "module": f"tests/{PROOF_MODULE}.py",
            "registry_lines": registry, "package_files": package,
            "files_touched": 1 + len({entry.split(":")[0] for entry in registry}) + len(package)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = os.environ.get("TPUOPS_BASELINE", "/tmp/tpuops-baseline")
    parser.add_argument("--baseline", type=Path, default=Path(default))
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_provider_seam")
    rows = [baseline_tree(args.baseline), *this_tree()]
    added = proof()
    proof_columns = ["provider", "its module", "registry lines", "package files naming it", "files touched"]
    proof_row = [str(added["provider"]), str(added["module"]), ", ".join(added["registry_lines"]),  # type: ignore[arg-type]
                 str(len(added["package_files"])), str(added["files_touched"])]  # type: ignore[arg-type]
    if args.result:
        measuring.write({"goal_files": GOAL, "rows": rows, "proof": added}, [result_file.Table(
            f"Package files that name a node provider (goal for a new one: {GOAL}).",
            ["tree", "provider", "files", "which"],
            [[str(row["tree"]), str(row["provider"]), str(row["count"]), ", ".join(row["files"])]  # type: ignore[arg-type]
             for row in rows]), result_file.Table(
            "A provider of another vocabulary, added (goal: 1 module, 1 registry line, 0 package files).",
            proof_columns, [proof_row])])
    if args.json:
        print(json.dumps({"goal_files": GOAL, "rows": rows, "proof": added}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"package files that name a node provider (goal for a new one: {GOAL})")
    for column in ("tree", "provider", "files", "which"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row["tree"]), str(row["provider"]), str(row["count"]), ", ".join(row["files"]))  # type: ignore[arg-type]
    proven = Table(title="a provider of another vocabulary, added (goal: 1 module, 1 registry line, 0 package files)")
    for column in proof_columns:
        proven.add_column(column)
    proven.add_row(*proof_row)
    Console(width=200).print(table, proven)


if __name__ == "__main__":
    main()
