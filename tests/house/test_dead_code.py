"""No dead code in tpuops/: every function, class, constant and public method is used by the product.

A cheap reading of what vulture does, without a dependency: a name tpuops/ defines must occur again somewhere
the product is (tpuops/, templates/, experiments/, bench/, the Makefile and pyproject.toml). A test does not
count: code that only its own test calls is dead in the product (the check found ``burn_rate`` and
``Store.crc32c_of`` that way). Decorated functions are left out (validators, commands, properties are called
by the framework that holds them), and so are the overrides below, which a library calls by name. A name
defined twice counts as used; a reader of the failure finds the definition by the path and line it names.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator

import pytest
from helpers import REPO

pytestmark = pytest.mark.unit

PACKAGE = REPO / "tpuops"
PRODUCT = [PACKAGE, REPO / "templates", REPO / "experiments", REPO / "bench", REPO / "Makefile",
           REPO / "pyproject.toml"]
TEXT = {".py", ".j2", ".sh", ".html", ".js", ".css", ".yaml", ".toml", ".json", ".txt", ".cfg", ""}
OVERRIDES = {
    "do_POST", "do_PATCH", "do_DELETE", "handle_error",  # http.server / socketserver handlers
    "formatTime",  # logging.Formatter
    "on_train_begin", "on_test_end",  # Keras callbacks
    "seekable", "readinto",  # io.RawIOBase
    "infer_relative_search_space",  # Optuna's BaseSampler
}
SPECIFIED = {"COMMANDS", "EXIT_CLASSES", "EVAL_FIELDS"}  # the status contract's vocabulary, which the schema test
# (tests/contract/test_contract.py) holds the agent's writer and the control plane's reader to


def _product_words() -> Counter[str]:
    words: Counter[str] = Counter()
    for root in PRODUCT:
        files = [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file())
        for path in files:
            if path.suffix in TEXT and "__pycache__" not in path.parts:
                words.update(re.findall(r"[A-Za-z_]\w*", path.read_text(encoding="utf-8", errors="replace")))
    return words


def definitions(source: str) -> Iterator[tuple[int, str]]:
    """The names a module defines that someone must use: top-level functions, classes and constants, and the
    public methods of its classes; undecorated, not dunder, not a library's override."""
    def wanted(node: ast.AST) -> bool:
        return not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list)

    for node in ast.parse(source).body:
        names: list[tuple[int, str]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and wanted(node):
            names.append((node.lineno, node.name))
        if isinstance(node, ast.ClassDef):
            names += [(item.lineno, item.name) for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and wanted(item)
                      and not item.name.startswith("_")]
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [(node.lineno, target.id) for target in targets if isinstance(target, ast.Name)]
        yield from ((line, name) for line, name in names
                    if not name.startswith("__") and name not in OVERRIDES | SPECIFIED)


def test_every_name_tpuops_defines_is_used_by_the_product() -> None:
    words = _product_words()
    dead = [f"{path.relative_to(REPO)}:{line} {name}" for path in sorted(PACKAGE.rglob("*.py"))
            for line, name in definitions(path.read_text(encoding="utf-8")) if words[name] < 2]
    assert not dead, ("defined in tpuops/ and used nowhere in the product (a test alone does not count): remove "
                      "them, or, for a library's override, name it in OVERRIDES:\n" + "\n".join(dead))


def test_the_reading_sees_definitions_and_leaves_hooks_out() -> None:
    source = ("X = 1\n@property\ndef hooked(): ...\ndef alone(): ...\n"
              "class Handler:\n    def do_POST(self): ...\n    def public(self): ...\n    def _private(self): ...\n")
    assert [name for _, name in definitions(source)] == ["X", "alone", "Handler", "public"]
