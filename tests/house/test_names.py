"""One name per meaning: no two public classes of tpuops/ share a name.

A class name is what a reader searches for and what an import shows; two ``Forecast`` classes (one
per policy, one per calibration run) make every reader open both to learn which is meant, and an
import of the wrong one still type-checks where the fields match. A name that is private to its
module (a leading underscore: each server's ``_Handler``) is read only where it stands, so it may
repeat; one meaning that two modules need lives in one of them (or in ``tpuops.core``) and is
imported, as ``core.documents.StrictModel`` is by the experiment and the sweep specs.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import tpuops

pytestmark = pytest.mark.unit

PACKAGE = Path(tpuops.__file__).parent


def public_classes(root: Path) -> dict[str, list[str]]:
    """Every public class name defined anywhere under ``root`` (nested ones too), with where it stands."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_two_public_classes_share_a_name() -> None:
    twins = {name: places for name, places in public_classes(PACKAGE).items() if len(places) > 1}
    assert not twins, "two classes, one name (rename one to what it is, or give one meaning one home):\n" + "\n".join(
        f"{name}: {', '.join(places)}" for name, places in sorted(twins.items()))


def test_the_check_sees_a_twin(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "a").mkdir(parents=True)
    (tmp_path / "pkg" / "a" / "x.py").write_text("class Forecast:\n    pass\n\nclass _Handler:\n    pass\n")
    (tmp_path / "pkg" / "y.py").write_text("def f():\n    class Forecast:\n        pass\n\nclass _Handler:\n    pass\n")
    twins = {name: places for name, places in public_classes(tmp_path / "pkg").items() if len(places) > 1}
    assert twins == {"Forecast": ["pkg/a/x.py:1", "pkg/y.py:2"]}
