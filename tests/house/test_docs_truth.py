"""The docs a newcomer reads agree with the code: commands, api calls, providers, rooms, benchmark figures.

Each check reads both sides from their source, so a new command, call, provider or module fails
here until the page that lists it names it, and a page that names something gone fails too:

- the README's command table against the Typer app (every command and sub-command);
- docs/library.md against the functions ``tpuops.api`` exports;
- docs/design.md's provider table against the provider registry;
- docs/design.md's layout block against the packages and top-level modules of ``tpuops/``;
- every repository path (``tpuops/...``, ``tests/...``, ``cloud_tpu/adapter.py``) and every dotted ``tpuops.x.y``
  the README and docs/ name against the tree: each exists (a module, or a name its module defines);
- docs/benchmarks.md against the result files it is generated from (``bench/report.py``);
- every YAML and TOML example of the README and docs/ (a fenced block, or an inline ``notify: {...}``) against
  the loaders a user's file goes through: it loads as written, and means what it says.

Each failure says exactly what is missing where, so whoever adds a command or a module knows
which line to write.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fuzzing import leaves
from helpers import REPO

pytestmark = pytest.mark.unit

README = REPO / "README.md"
LIBRARY = REPO / "docs" / "library.md"
DESIGN = REPO / "docs" / "design.md"


def _leaf_commands() -> set[str]:
    """Every command a user can run, as typed after ``tpuops`` (``sweep start``, ``runs``): the fuzzer's walk."""
    return {" ".join(leaf.words) for leaf in leaves()}


def _groups() -> dict[str, set[str]]:
    """Each command group's sub-command names (``""``: the top level), from the same leaves."""
    found: dict[str, set[str]] = {}
    for leaf in leaves():
        for depth, word in enumerate(leaf.words):
            found.setdefault(" ".join(leaf.words[:depth]), set()).add(word)
    return found


def _table_rows(text: str, header: str) -> list[str]:
    """The rows of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"no table starting {header!r}"
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _first_cell(row: str) -> str:
    return re.split(r"(?<!\\)\|", row)[1]


def readme_commands(text: str, groups: dict[str, set[str]]) -> set[str]:
    """The commands the README's table names: `tpuops sweep start ...` · `status S` · `list` -> sweep start, ...

    A code span starting with ``tpuops`` names a command by the words that are command names; the
    spans after it in the same cell (``status S``) name sub-commands of the same group.
    """
    named: set[str] = set()
    for row in _table_rows(text, "| command | what it does |"):
        group = ""
        for span in re.findall(r"`([^`]+)`", _first_cell(row)):
            words = span.replace("\\|", "|").split()
            if words[0] == "tpuops":
                group, path = "", ""
                for word in words[1:]:
                    if word not in groups.get(path, set()):
                        break
                    path = f"{path} {word}".strip()
                    if path in groups:
                        group = path
                if path and path not in groups:
                    named.add(path)
            elif group and words[0] in groups[group]:
                named.add(f"{group} {words[0]}")
    return named


def test_the_readme_command_table_names_every_command_and_only_those() -> None:
    commands, groups = _leaf_commands(), _groups()
    named = readme_commands(README.read_text(encoding="utf-8"), groups)
    missing, gone = sorted(commands - named), sorted(named - commands)
    assert not missing, ("README.md's command table lacks these commands (add a row, or a `sub` span to its "
                         f"group's row): {', '.join(f'tpuops {c}' for c in missing)}")
    assert not gone, f"README.md's command table names commands the CLI does not have: {gone}"


def test_the_readme_parser_sees_rows_of_groups_and_continuations() -> None:
    """The check would pass vacuously if it missed the ` · `-joined sub-commands of a group's row."""
    groups = {"": {"sweep", "runs", "logs"}, "sweep": {"start", "status", "list"}}
    text = ("| command | what it does |\n|---|---|\n"
            "| `tpuops sweep start SPEC [--dry-run]` · `status S` · `list` | sweeps |\n"
            "| `tpuops logs RUN [--follow]` · `tpuops runs` | runs |\n")
    assert readme_commands(text, groups) == {"sweep start", "sweep status", "sweep list", "logs", "runs"}


def test_the_readme_stays_a_five_minute_read() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: at most 250 (what else there is belongs in docs/)"


def test_library_md_names_every_api_call_and_only_those() -> None:
    from tpuops import api

    calls = {name for name in api.__all__ if inspect.isfunction(getattr(api, name))}
    named = set(re.findall(r"`api\.([a-z_]+)\b", LIBRARY.read_text(encoding="utf-8")))
    missing, gone = sorted(calls - named), sorted(named - calls)
    assert not missing, f"docs/library.md's table does not name these tpuops.api calls (`api.NAME...`): {missing}"
    assert not gone, f"docs/library.md names calls tpuops.api does not export: {gone}"


def test_design_md_lists_every_registered_provider_and_only_those() -> None:
    from tpuops.providers.registry import PROVIDERS

    rows = _table_rows(DESIGN.read_text(encoding="utf-8"), "| provider | module | what it is |")
    named = {_first_cell(row).strip().strip("`") for row in rows}
    missing, gone = sorted(set(PROVIDERS) - named), sorted(named - set(PROVIDERS))
    assert not missing, f"docs/design.md's provider table lacks these registered providers: {missing}"
    assert not gone, f"docs/design.md's provider table lists providers the registry does not have: {gone}"


def _rooms() -> set[str]:
    """The packages (``cli/``) and top-level modules (``jobs.py``) of tpuops/."""
    package = REPO / "tpuops"
    modules = {p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    packages = {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file() and not p.is_symlink()}
    return modules | packages


def layout_rooms(text: str) -> set[str]:
    """The rooms design.md's layout block names: the first word of an indented line under ``tpuops/``, a
    ``tpuops/NAME/`` line, and a room named after ``;  `` in a description (``risk.py: ...``)."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    named: set[str] = set()
    for line in block.splitlines():
        top = re.match(r"tpuops/([a-z0-9_]+/)", line)
        if top:
            named.add(top.group(1))
        first = re.match(r"  ([a-z0-9_]+(?:\.py|/))\s", line)
        if first:
            named.add(first.group(1))
        named.update(re.findall(r"(?:;|^)\s+([a-z0-9_]+\.py):", line))
    return named


def test_design_md_layout_names_every_room_of_tpuops_and_only_those() -> None:
    rooms, named = _rooms(), layout_rooms(DESIGN.read_text(encoding="utf-8"))
    missing, gone = sorted(rooms - named), sorted(named - rooms)
    assert not missing, f"docs/design.md's layout block does not name these rooms of tpuops/: {missing}"
    assert not gone, f"docs/design.md's layout block names rooms tpuops/ does not have: {gone}"


# Pages a newcomer reads. docs/benchmarks.md is left out: it is generated from bench/results/ (checked above), and
# its captions name the trees a figure was measured on, an older tree's files among them.
PAGES = [README, *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "benchmarks.md")]
_ROOTED = re.compile(r"(?<![\w/.~-])((?:tpuops|tests|bench|templates|experiments|infra)/[\w./*-]*[\w*])")
_NESTED = re.compile(r"(?<![\w/.~-])((?:[a-z0-9_]+/)+[a-z0-9_]+\.py)\b")
_DOTTED = re.compile(r"(?<![\w/.])(tpuops(?:\.\w+)+)(?![\w/])")
NOT_MODULES = {"tpuops.toml"}  # the config file
PLACEHOLDER = "NAME"  # the docs' word for any name (`tpuops.api.NAME`, `tpuops up NAME`)


def named_paths(text: str) -> set[str]:
    """The repository paths a page names: rooted ones (``tpuops/...``, ``tests/...``, a glob allowed) as they
    are, and a module named from inside its wing (``cloud_tpu/adapter.py``) as a path under ``tpuops/``."""
    rooted = set(_ROOTED.findall(text))
    nested = {path for path in _NESTED.findall(text) if not _ROOTED.fullmatch(path)}
    return rooted | {f"tpuops/**/{path}" for path in nested}


def _exists(path: str) -> bool:
    return any(REPO.glob(path)) if "*" in path else (REPO / path).exists()


def test_every_path_the_docs_name_exists() -> None:
    gone = [f"{page.relative_to(REPO)}: {path}" for page in PAGES
            for path in sorted(named_paths(page.read_text(encoding="utf-8"))) if not _exists(path)]
    assert not gone, "these pages name paths the repository does not have:\n" + "\n".join(gone)


def _top_level_names(source: Path) -> set[str]:
    """What a module defines or imports at its top level (read, not imported: the agent's modules need TF)."""
    names: set[str] = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name))
    return names


def dotted_gone(name: str) -> str | None:
    """Why ``tpuops.a.b.c`` names nothing (``None``: its longest module prefix exists and, when more follows,
    defines the next part), read from the source tree."""
    parts = name.split(".")
    for depth in range(len(parts), 1, -1):
        base = REPO.joinpath(*parts[:depth])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            rest = parts[depth:]
            if rest and rest[0] != PLACEHOLDER and rest[0] not in _top_level_names(source):
                return f"{'.'.join(parts[:depth])} has no {rest[0]}"
            return None
    return "no such module"


def test_every_dotted_tpuops_name_in_the_docs_exists() -> None:
    gone = [f"{page.relative_to(REPO)}: {name} ({why})" for page in PAGES
            for name in sorted(set(_DOTTED.findall(page.read_text(encoding="utf-8"))) - NOT_MODULES)
            if (why := dotted_gone(name))]
    assert not gone, "these pages name modules or names tpuops does not have:\n" + "\n".join(gone)


def test_the_name_checks_find_what_is_gone() -> None:
    assert named_paths("see `tpuops/accounting.py`, tests/house/*.py and cloud_tpu/adapter.py (gs://b/x.py)") == {
        "tpuops/accounting.py", "tests/house/*.py", "tpuops/**/cloud_tpu/adapter.py"}
    assert not _exists("tpuops/accounting.py") and _exists("tests/house/*.py")
    assert _exists("tpuops/**/cloud_tpu/adapter.py") and not _exists("tpuops/**/notify/models.py")
    assert dotted_gone("tpuops.contract.exits.preemption_caused") == "tpuops.contract.exits has no preemption_caused"
    assert dotted_gone("tpuops.notify.models") == "tpuops.notify has no models"
    assert dotted_gone("tpuops.wings.x") == "no such module" and dotted_gone("tpuops.api.NAME") is None
    assert dotted_gone("tpuops.agent.blame.preemption_caused") is None and dotted_gone("tpuops.api") is None


def _report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_benchmarks_md_is_what_the_result_files_give() -> None:
    report = _report()
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page == report.render(report.load_results()), (
        "docs/benchmarks.md differs from what bench/results/*.json give: run .venv/bin/python bench/report.py "
        "(and edit the result files or bench/report.py, never the page)")


def test_a_result_file_without_its_date_or_load_is_refused(tmp_path: Path) -> None:
    report = _report()
    good = {"bench": "bench_x", "part": "", "command": "python bench/bench_x.py --result", "carried_over": False,
            "date": {"started": "2026-12-05T19:48:29Z", "ended": "2026-12-05T19:48:38Z"},
            "load": {"before": [1.0, 1.0, 1.0], "after": [1.0, 1.0, 1.0]}, "notes": [],
            "tables": [{"caption": "", "columns": ["a", "b"], "rows": [["1", "2"]]}]}
    assert report.check(good) is None
    assert "load" in report.check({**good, "load": None})
    assert "date" in report.check({**good, "date": ""})
    assert "rows must match" in report.check({**good, "tables": [{"columns": ["a"], "rows": [["1", "2"]]}]})


_FENCED = re.compile(r"^```(yaml|toml)\n(.*?)^```", re.M | re.S)
_INLINE_NOTIFY = re.compile(r"`(notify: \{[^`]*\})`")


def documented_examples() -> list[tuple[str, str, str]]:
    """(page, language, text) of every YAML or TOML example a user may copy from the README and docs/."""
    found = []
    for page in (README, *sorted((REPO / "docs").glob("*.md"))):
        text = page.read_text(encoding="utf-8")
        found.extend((page.name, language, body) for language, body in _FENCED.findall(text))
        found.extend((page.name, "yaml", " ".join(span.split())) for span in _INLINE_NOTIFY.findall(text))
    return found


def test_the_docs_hold_yaml_and_toml_examples_and_the_inline_notify_one() -> None:
    examples = documented_examples()
    assert {language for _, language, _ in examples} == {"yaml", "toml"}
    assert ("experiments.md", "yaml", "notify: {to: [team], on: [failed]}") in examples


@pytest.mark.parametrize(("page", "language", "text"), documented_examples(),
                         ids=lambda value: value if len(value) < 20 else value.split()[0])
def test_every_documented_example_loads_as_written(tmp_path: Path, page: str, language: str, text: str) -> None:
    """A TOML example is a ``tpuops.toml`` that loads (its secrets' variables set); a YAML one loads, and an
    experiment's or a sweep's ``notify:`` holds what it says in both specs (``on:`` is the key, not True)."""
    import yaml

    from tpuops.config import load_settings
    from tpuops.core.documents import load_yaml, read_toml
    from tpuops.core.notices import NotifyChoice
    from tpuops.launch.experiment import load_experiment
    from tpuops.sweeps.spec import load_sweep

    if language == "toml":
        config = tmp_path / "tpuops.toml"
        config.write_text(f'zones = ["us-central1-b"]\nstore = "{tmp_path / "store"}"\n\n{text}')
        targets = read_toml(config, "config").get("notify", {}).get("targets", {})
        environ = {"TPUOPS_HOME": str(tmp_path / "home")}
        for target in targets.values():
            environ.update(dict.fromkeys([target[k] for k in ("url_env",) if k in target], "https://hooks.example/x"))
            environ.update(dict.fromkeys([target[k] for k in ("password_env",) if k in target], "pw"))
        settings = load_settings(config_path=config, environ=environ)
        assert set(settings.notify.targets) == set(targets), page
        return
    value = load_yaml(text, page)
    if not (isinstance(value, dict) and "notify" in value):
        return
    said = NotifyChoice.model_validate(value["notify"])
    experiment = yaml.safe_load((REPO / "experiments" / "digits_cnn.yaml").read_text())
    spec = tmp_path / "experiment.yaml"
    spec.write_text(yaml.safe_dump(experiment) + text + "\n")
    assert load_experiment(spec).notify == said, page
    sweep = yaml.safe_load((REPO / "sweeps" / "digits_lr.yaml").read_text())
    sweep["experiment"] = str(REPO / "experiments" / "digits_cnn.yaml")
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump(sweep) + text + "\n")
    assert load_sweep(spec).notify == said, page
