"""The wings keep their floors: each package imports only what its docstring says it may.

``tpuops/`` is a few packages named for what they hold (docs/design.md, "Layout"), each with a
docstring that states its job and what it may import. This test holds the code to those
docstrings, reading every import of every module (at the top, inside functions and under
``TYPE_CHECKING``), so a shortcut that would pull a wing up through the floors fails here, with
the file, the line and the import, before it becomes a circle.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

import tpuops

pytestmark = pytest.mark.unit

PACKAGE = Path(tpuops.__file__).parent

MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "contract": ("tpuops.contract",),
    "agent": ("tpuops.agent", "tpuops.contract"),
    "core": ("tpuops.core", "tpuops.contract"),
    "store": ("tpuops.store", "tpuops.core"),
    "providers": ("tpuops.providers", "tpuops.core"),
    "emulator": ("tpuops.emulator", "tpuops.core", "tpuops.providers"),
    "tfenv": ("tpuops.tfenv", "tpuops.core", "tpuops.config", "tpuops.providers"),
    "billing": ("tpuops.billing", "tpuops.core", "tpuops.config", "tpuops.providers"),
    "data": ("tpuops.data", "tpuops.core", "tpuops.store"),
    "runs": ("tpuops.runs", "tpuops.core", "tpuops.store", "tpuops.providers", "tpuops.contract"),
    "accounting": ("tpuops.accounting", "tpuops.runs", "tpuops.billing", "tpuops.providers", "tpuops.core",
                   "tpuops.contract"),
    "notify": ("tpuops.notify", "tpuops.core", "tpuops.runs", "tpuops.config", "tpuops.billing"),
    "launch": ("tpuops.launch", "tpuops.core", "tpuops.config", "tpuops.billing", "tpuops.providers",
               "tpuops.store", "tpuops.data", "tpuops.runs", "tpuops.contract"),
    "controller": ("tpuops.controller", "tpuops.core", "tpuops.config", "tpuops.store", "tpuops.runs",
                   "tpuops.billing", "tpuops.accounting", "tpuops.providers", "tpuops.notify", "tpuops.fleet",
                   "tpuops.contract"),
    "sweeps": ("tpuops.sweeps", "tpuops.core", "tpuops.config", "tpuops.store", "tpuops.runs", "tpuops.billing",
               "tpuops.accounting", "tpuops.data", "tpuops.launch", "tpuops.notify", "tpuops.fleet",
               "tpuops.contract"),
    "sim": ("tpuops.sim", "tpuops.core", "tpuops.config", "tpuops.store", "tpuops.runs", "tpuops.billing",
            "tpuops.providers", "tpuops.launch", "tpuops.sweeps", "tpuops.controller", "tpuops.fleet",
            "tpuops.session", "tpuops.contract", "tpuops.notify"),
    "api": ("tpuops.api", "tpuops.core", "tpuops.config", "tpuops.store", "tpuops.runs", "tpuops.billing",
            "tpuops.accounting", "tpuops.providers", "tpuops.data", "tpuops.launch", "tpuops.notify", "tpuops.fleet",
            "tpuops.controller", "tpuops.sweeps", "tpuops.sim", "tpuops.session", "tpuops.doctor",
            "tpuops.schedule", "tpuops.tfenv", "tpuops.emulator", "tpuops.contract"),
    "dashboard": ("tpuops.dashboard", "tpuops.api", "tpuops.runs", "tpuops.accounting", "tpuops.sweeps",
                  "tpuops.store", "tpuops.config", "tpuops.core", "tpuops.session"),
    "cli": ("tpuops.cli", "tpuops.api", "tpuops.config", "tpuops.core"),
}
"""Per wing, the tpuops modules it may import (a prefix admits its submodules), for every module under the wing's
folder however deep (a sub-wing keeps its wing's rule; it may add a narrower one of its own). Every wing has one
(``test_every_wing_has_a_written_rule``), and its docstring names each (``test_each_wing_says_what_it_may_import``).
The bare root package (``import tpuops``, to find where the installation is) holds nothing and is no import of a
wing."""

SIDE_BY_SIDE = ("tpuops.runs", "tpuops.billing")
"""Rooms on one floor that never import each other: what joins them lives above both (``tpuops.accounting``)."""

UI = ("tpuops.dashboard", "tpuops.cli")
"""What stands on top, side by side: nothing else in tpuops imports them, and neither imports the other
(the program, ``tpuops/__main__.py``, composes the two)."""

MAX_LOOSE_MODULES = 5
"""The modules that stand loose in ``tpuops/`` today (config, doctor, fleet, schedule, session): a sixth belongs
in a wing."""


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a tpuops module in ``path``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("tpuops")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("tpuops"):
            if node.module == "tpuops":
                found += [(node.lineno, f"tpuops.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def _admitted(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _wing_imports(wing: str) -> list[tuple[str, str]]:
    """("file:line", module) of every import of a tpuops module in the package ``wing``."""
    return [(f"{path.relative_to(PACKAGE.parent)}:{line}", module)
            for path in sorted((PACKAGE / wing).rglob("*.py")) for line, module in _imports(path) if module != "tpuops"]


def _wings() -> list[str]:
    """Every package directly under ``tpuops/``."""
    return sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))


def test_every_wing_has_a_written_rule() -> None:
    assert sorted(MAY_IMPORT) == _wings(), "each wing of tpuops/ says what it may import, here and in its docstring"


@pytest.mark.parametrize("wing", sorted(MAY_IMPORT))
def test_each_wing_says_what_it_may_import(wing: str) -> None:
    """The docstring is the rule a reader meets first: its "May import:" names every wing the test admits."""
    docstring = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text(encoding="utf-8"))) or ""
    assert "May import:" in docstring, f"tpuops/{wing}/__init__.py's docstring has no \"May import:\" paragraph"
    rule = docstring[docstring.index("May import:"):]
    unnamed = [prefix for prefix in MAY_IMPORT[wing] if prefix != f"tpuops.{wing}" and prefix not in rule]
    assert not unnamed, f"tpuops/{wing}/__init__.py's \"May import:\" does not name {', '.join(unnamed)}"


@pytest.mark.parametrize("wing", sorted(MAY_IMPORT))
def test_a_wing_imports_only_what_its_docstring_allows(wing: str) -> None:
    allowed = MAY_IMPORT[wing]
    bad = [f"{where} imports {module}" for where, module in _wing_imports(wing) if not _admitted(module, allowed)]
    assert not bad, f"tpuops/{wing}/ may import only {', '.join(allowed)}:\n" + "\n".join(bad)


def test_runs_and_billing_stand_side_by_side() -> None:
    """A run's files and money share a floor; an import between them (one lazy import is enough) puts one on the
    other and the whole house a floor higher."""
    bad = [f"{where} imports {module}" for wing in SIDE_BY_SIDE
           for where, module in _wing_imports(wing.removeprefix("tpuops."))
           if _admitted(module, tuple(other for other in SIDE_BY_SIDE if other != wing))]
    assert not bad, "runs and billing import nothing of each other (tpuops.accounting joins them):\n" + "\n".join(bad)


def _ui_of(path: Path) -> str | None:
    """The UI wing ``path`` belongs to (``tpuops.cli``, ``tpuops.dashboard``), or None."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return next((ui for ui in UI if _admitted(module, (ui,))), None)


def test_nothing_below_imports_the_dashboard_or_the_cli() -> None:
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
           for path in sorted(PACKAGE.rglob("*.py"))
           if _ui_of(path) is None and path != PACKAGE / "__main__.py"
           for line, module in _imports(path) if _admitted(module, UI)]
    assert not bad, "the dashboard and the CLI stand on top (the front door imports no UI):\n" + "\n".join(bad)


def test_the_cli_and_the_dashboard_stand_beside_each_other() -> None:
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
           for path in sorted(PACKAGE.rglob("*.py"))
           if (ui := _ui_of(path)) is not None
           for line, module in _imports(path) if _admitted(module, tuple(other for other in UI if other != ui))]
    assert not bad, "neither UI imports the other (tpuops/__main__.py composes them):\n" + "\n".join(bad)


def test_no_more_modules_stand_loose_in_tpuops_than_do_today() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, f"{len(loose)} modules loose in tpuops/ (group them into a wing): {loose}"


def _heights() -> dict[str, int]:
    """Each wing's floor by its rule: one above the highest wing it may import (loose modules stand on the rules
    of no wing here and count as the ground floor)."""
    heights: dict[str, int] = {}

    def height(wing: str) -> int:
        if wing not in heights:
            below = [prefix.removeprefix("tpuops.") for prefix in MAY_IMPORT[wing] if prefix != f"tpuops.{wing}"]
            heights[wing] = 1 + max((height(other) for other in below if other in MAY_IMPORT), default=0)
        return heights[wing]

    for wing in MAY_IMPORT:
        height(wing)
    return heights


def wings_picture() -> str:
    """The picture of the wings in docs/design.md ("The wings"), drawn from ``MAY_IMPORT``: top floor first."""
    heights = _heights()
    rows = [f"{'floor':>5}  {'wing':<11} may import (besides itself)"]
    for wing in sorted(MAY_IMPORT, key=lambda w: (-heights[w], w)):
        below = ", ".join(prefix.removeprefix("tpuops.") for prefix in MAY_IMPORT[wing] if prefix != f"tpuops.{wing}")
        lines = textwrap.wrap(below or "(nothing of tpuops)", 92, break_on_hyphens=False)
        rows.append(f"{heights[wing]:>5}  {wing + '/':<11} {lines[0]}")
        rows += [f"{'':<19}{line}" for line in lines[1:]]
    return "\n".join(rows)


def test_design_md_draws_the_wings_as_the_rules_are() -> None:
    """A newcomer reads the wings in docs/design.md before any code: the picture there is this test's rules."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text(encoding="utf-8")
    block = text.split("## The wings", 1)[1].split("```", 2)[1].strip("\n")
    assert block == wings_picture(), ("docs/design.md's picture of the wings differs from tests/house/test_wings.py's "
                                      "rules; paste the output of 'python tests/house/test_wings.py' there:\n"
                                      + wings_picture())


def _tree(relative: str) -> ast.Module:
    return ast.parse((PACKAGE / relative).read_text(encoding="utf-8"))


def test_only_the_simulators_world_holds_the_simulated_cloud() -> None:
    """The simulator reaches its world through one object (``tpuops.sim.world.SimWorld``); the controller, the
    Fleet and the simulation loop see the node-provider protocol only."""
    bad = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
           for path in sorted(PACKAGE.rglob("*.py"))
           if path.parent.name != "providers" and path.relative_to(PACKAGE).as_posix() != "sim/world.py"
           for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
           if isinstance(node, ast.ImportFrom) and node.module == "tpuops.providers.simulated"
           and any(alias.name == "SimulatedCloud" for alias in node.names)]
    assert not bad, "only tpuops/sim/world.py may build the simulated cloud:\n" + "\n".join(bad)


def test_the_node_engine_leaves_the_ledger_to_its_billing_observer() -> None:
    """``fleet.py`` acts; ``billing/observer.py`` dates. The engine never touches a ledger itself, and the
    controller writes nothing into the Fleet it is handed, nor reaches into it for the observer (it is handed that)."""
    engine = [node.lineno for node in ast.walk(_tree("fleet.py"))
              if isinstance(node, ast.Attribute) and node.attr == "ledger"]
    assert not engine, f"tpuops/fleet.py reaches a ledger at lines {engine}: report to self.billing instead"
    written = [node.lineno for path in sorted((PACKAGE / "controller").glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Assign | ast.AugAssign)
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
               and target.value.id == "fleet"]
    assert not written, f"the controller writes into its Fleet at lines {written}: pass collaborators in"
    reached = [node.lineno for path in sorted((PACKAGE / "controller").glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Attribute) and node.attr == "billing"
               and ((isinstance(node.value, ast.Name) and node.value.id == "fleet")
                    or (isinstance(node.value, ast.Attribute) and node.value.attr == "nodes"))]
    assert not reached, f"the controller reaches into its Fleet for its billing observer at lines {reached}"


# ----- the emulator: four sub-wings on a ground, behind one face -----------------------------------------------

EMULATOR_GROUND = tuple(f"tpuops.emulator.{name}" for name in ("apierror", "faults", "fsutil", "background", "stats"))
"""The modules every emulator wing stands on (``tpuops/emulator/*.py`` beside the face, the process and control)."""

EMULATOR_MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "emulator/vm": ("tpuops.emulator.vm", "tpuops.emulator.fsutil", "tpuops.emulator.background"),
    "emulator/cloud": ("tpuops.emulator.cloud", "tpuops.emulator.vm", "tpuops.emulator.apierror",
                       "tpuops.emulator.faults", "tpuops.emulator.fsutil", "tpuops.providers.cloud_tpu.catalog",
                       "tpuops.providers.cloud_tpu.billing_rules"),
    "emulator/gcs": ("tpuops.emulator.gcs", "tpuops.emulator.vm", "tpuops.emulator.faults", "tpuops.emulator.fsutil",
                     "tpuops.emulator.stats", "tpuops.emulator.background"),
    "emulator/api": ("tpuops.emulator.api", "tpuops.emulator.cloud", "tpuops.emulator.apierror",
                     "tpuops.emulator.faults", "tpuops.emulator.stats", "tpuops.providers.cloud_tpu.catalog"),
}
"""Per emulator sub-wing (its docstring says the same), the tpuops modules it may import."""


@pytest.mark.parametrize("wing", sorted(EMULATOR_MAY_IMPORT))
def test_an_emulator_wing_imports_only_what_its_docstring_allows(wing: str) -> None:
    allowed = EMULATOR_MAY_IMPORT[wing]
    bad = [f"{where} imports {module}" for where, module in _wing_imports(wing) if not _admitted(module, allowed)]
    assert not bad, f"tpuops/{wing}/ may import only {', '.join(allowed)}:\n" + "\n".join(bad)


def test_the_emulators_ground_stands_on_nothing_above_it() -> None:
    """``faults`` may name the errors it refuses with; the rest of the ground imports no tpuops module."""
    bad = [f"{name}.py:{line} imports {module}" for name in (g.rsplit(".", 1)[1] for g in EMULATOR_GROUND)
           for line, module in _imports(PACKAGE / "emulator" / f"{name}.py")
           if not (name == "faults" and module == "tpuops.emulator.apierror")]
    assert not bad, "the emulator's ground imports nothing of the wings above it:\n" + "\n".join(bad)


def _past_the_face(path: Path) -> list[tuple[int, str]]:
    """(line, what) of every import in ``path`` that reaches into the emulator past ``tpuops.emulator``'s names."""
    import tpuops.emulator

    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("tpuops.emulator.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("tpuops.emulator."):
                found.append((node.lineno, node.module))
            elif node.module == "tpuops.emulator":
                found += [(node.lineno, f"tpuops.emulator.{a.name}") for a in node.names
                          if a.name not in tpuops.emulator.__all__]
    return found


def test_nothing_outside_the_emulator_reaches_past_its_face() -> None:
    """The rest of tpuops, the benchmarks and the Makefile use the names ``tpuops/emulator/__init__.py`` exports.

    Tests may reach inside: the emulator's own tests (``test_emulator_*``, ``test_node_storage``) drive its
    parts one by one; every other test is better served by the face, as the program is.
    """
    outside = [p for p in sorted(PACKAGE.rglob("*.py")) if not p.is_relative_to(PACKAGE / "emulator")]
    outside += sorted((PACKAGE.parent / "bench").glob("*.py"))
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
           for path in outside for line, module in _past_the_face(path)]
    makefile = PACKAGE.parent / "Makefile"
    bad += [f"Makefile:{number} names {found}"
            for number, text in enumerate(makefile.read_text(encoding="utf-8").splitlines(), 1)
            for found in re.findall(r"tpuops\.emulator\.\w+", text)]
    assert not bad, "outside tpuops/emulator/, import only what tpuops.emulator exports:\n" + "\n".join(bad)


if __name__ == "__main__":
    print(wings_picture())
