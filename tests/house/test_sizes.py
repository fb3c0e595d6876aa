"""Rooms a reader can hold in mind: no module in tpuops/ over 700 lines, none of the front door's over 400, and
no function over 60 lines of code unless a comment above it says why.

A module that needs an exemption for its size is two modules (docs/design.md, "Layout"): the limit is a test so
that the next 50 lines go into a new module of their own subject instead. A function's length is its code, from
its first statement after the docstring to its last line, so a docstring that says why costs nothing; a longer
function carries a ``# Long: <why>`` comment on the lines just above its ``def`` (or its decorators).

Run as a script (``python tests/house/test_sizes.py``) it prints the longest modules and functions: the measure.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "tpuops"
MAX_MODULE_LINES = 700
MAX_FACE_LINES = 400
"""The front door (``tpuops/api/``) is one call per command, split by subject: its modules stay small."""
MAX_FUNCTION_LINES = 60
WHY = "# Long:"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = function.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return (function.end_lineno or function.lineno) - body[0].lineno + 1


def _says_why(lines: list[str], function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the comment block right above the function (above its decorators) starts with ``WHY``."""
    first = min([function.lineno, *(d.lineno for d in function.decorator_list)]) - 1  # 0-based line of the def
    block = []
    for line in reversed(lines[:first]):
        if not line.strip().startswith("#"):
            break
        block.insert(0, line.strip())
    return bool(block) and block[0].startswith(WHY)


def long_functions() -> list[tuple[int, str, bool]]:
    """(code lines, "path:line name", whether it says why) of every function over ``MAX_FUNCTION_LINES``."""
    found = []
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _code_lines(node) > MAX_FUNCTION_LINES:
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
                found.append((_code_lines(node), where, _says_why(lines, node)))
    return sorted(found, reverse=True)


def test_no_module_in_tpuops_is_over_700_lines() -> None:
    big = {path.relative_to(PACKAGE).as_posix(): _lines(path) for path in _modules()
           if _lines(path) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split each by subject): {big}"


def test_no_module_of_the_front_door_is_over_400_lines() -> None:
    big = {path.name: _lines(path) for path in sorted((PACKAGE / "api").glob("*.py")) if _lines(path) > MAX_FACE_LINES}
    assert not big, f"tpuops/api/ modules over {MAX_FACE_LINES} lines (a new module of its subject): {big}"


def test_a_function_over_60_lines_says_why() -> None:
    silent = [f"{where} ({lines} lines)" for lines, where, why in long_functions() if not why]
    assert not silent, (f"functions over {MAX_FUNCTION_LINES} lines of code without a {WHY!r} comment above "
                        "(split them, or say why they are one):\n" + "\n".join(silent))


def test_the_why_comment_is_read_above_the_def_and_its_decorators() -> None:
    source = "x = 1\n# Long: one table\n@staticmethod\ndef f():\n    return 1\n\n# unrelated\ndef g():\n    return 2\n"
    functions = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)]
    assert [_says_why(source.splitlines(), f) for f in functions] == [True, False]


if __name__ == "__main__":
    for path in sorted(_modules(), key=_lines, reverse=True)[:10]:
        print(f"{_lines(path):5d}  {path.relative_to(PACKAGE.parent)}")
    for lines, where, why in long_functions():
        print(f"{lines:5d}  {where}{'' if why else '  (no # Long: comment)'}")
