"""The CLI goes through one front door: a command module imports ``tpuops.api`` and rendering helpers only.

Every ``tpuops`` command is parse + one ``tpuops.api`` call + render (docs/library.md), so
that anything a command does, a Python caller can do without the CLI, and a change below the
service layer never has to touch a command. This test reads the imports of every module in
``tpuops/cli/`` (at the top, inside functions and under ``TYPE_CHECKING``) and fails on any
other part of tpuops. What a command module may import, and why:

- ``tpuops.api``: the front door, and (type-only) the types its calls return, named there too;
- ``tpuops.cli`` and its modules: the CLI's own parsing and rendering helpers (``common``);
- ``tpuops.core.errors``: the failure classes a command raises or reports in one line;
- ``tpuops.core.kinds``: the plain enums a flag parses into (``Capacity``, ``Cloud``);
- ``tpuops.core.formats``: how sizes, dollars and parameters print, the same in the library's messages.

``tpuops/cli/dashboard.py`` parses ``tpuops dashboard`` and is handed the web app's server by the program
(``tpuops/__main__.py``): the web app (``tpuops.dashboard``) stands on the front door beside the CLI, and
neither imports the other (``tests/house/test_wings.py``).

``tpuops/cli/common.py`` also turns the global ``--config`` into ``Settings`` (``tpuops.config``)
and checks a run id flag as it is parsed (``tpuops.core.naming``, the naming rules): that is parsing
the command line, and the one place it happens.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tpuops.cli

pytestmark = pytest.mark.unit

CLI = Path(tpuops.cli.__file__).parent
ALLOWED = ("tpuops.api", "tpuops.cli", "tpuops.core.errors", "tpuops.core.kinds", "tpuops.core.formats")
ALSO_ALLOWED = {"common.py": ("tpuops.config", "tpuops.core.naming")}


def _tpuops_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a tpuops module, wherever it stands in the file."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "tpuops":  # from tpuops import api
                found += [(node.lineno, f"tpuops.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, module) for line, module in found if module.split(".")[0] == "tpuops"]


def _allowed(module: str, extra: tuple[str, ...] = ()) -> bool:
    return any(module == ok or module.startswith(ok + ".") for ok in (*ALLOWED, *extra))


def test_every_cli_module_imports_only_the_front_door_and_rendering_helpers() -> None:
    modules = sorted(CLI.glob("*.py"))
    assert len(modules) > 10, f"expected the CLI's modules in {CLI}"
    wrong = [f"{path.name}:{line} imports {module}"
             for path in modules
             for line, module in _tpuops_imports(path.read_text())
             if not _allowed(module, ALSO_ALLOWED.get(path.name, ()))]
    assert not wrong, "a CLI module reaches past tpuops.api:\n" + "\n".join(wrong)


def test_the_check_sees_imports_inside_functions_and_type_checking_blocks() -> None:
    """The rule would pass vacuously if the reader missed the lazy imports every command uses."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tpuops.runs import Run\n"
              "def f():\n    from tpuops import api, session\n    import tpuops.store\n")
    found = sorted(_tpuops_imports(source))
    assert found == [(3, "tpuops.runs"), (5, "tpuops.api"), (5, "tpuops.session"), (6, "tpuops.store")]
    assert [module for _, module in found if not _allowed(module)] == ["tpuops.runs", "tpuops.session", "tpuops.store"]
