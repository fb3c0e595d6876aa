"""What a command costs before it does anything: the parsing of one command and the program's collector pace.

``tpuops.cli.main.run`` hands Typer only the command the arguments begin with (``_narrowed``), so
that a command does not pay for turning every other command's signature into click parameters;
these tests hold every command's help and usage errors to the whole program's, and show that
anything else (root options, a mistyped name, no command) gets the whole program. The program
(``tpuops/__main__.py``) runs with the collector's thresholds of ``GC_THRESHOLDS``. And ``tpuops status`` reads:
it imports nothing of what launches, drives, plans or serves runs (the test names them), so that it costs
what listing costs.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.core
import typer.main
from typer import _click

from tpuops import runs
from tpuops.__main__ import GC_THRESHOLDS, app, entry
from tpuops.cli.main import _narrowed
from tpuops.core.kinds import Capacity
from tpuops.store import LocalStore

pytestmark = pytest.mark.unit


def _names(program: typer.Typer) -> list[str]:
    """The names of the program's top-level commands and groups, as click knows them."""
    return sorted(typer.main.get_command(program).commands)  # type: ignore[attr-defined]


def _outcome(command: _click.Command, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """What click prints for ``args`` (help) or the usage error it raises, as text."""
    try:
        command(args=args, prog_name="tpuops", standalone_mode=False)
    except _click.exceptions.ClickException as err:
        return "error", err.format_message()
    except typer.Exit:
        pass
    return "printed", capsys.readouterr().out


def test_a_command_is_parsed_with_only_itself_and_its_group_with_all_of_its_own() -> None:
    assert _names(_narrowed(app, ["status", "--json"])) == ["status"]
    assert _names(_narrowed(app, ["runs", "list"])) == ["runs"]
    assert _names(_narrowed(app, ["data", "sample", "digits", "out"])) == ["data"]
    assert "sample" in typer.main.get_command(_narrowed(app, ["data"])).commands["data"].commands  # type: ignore[attr-defined]
    assert {"status", "runs", "data", "up", "train"} < set(_names(app))  # the whole program is left as it was


@pytest.mark.parametrize("args", [[], ["--config", "x.toml", "status"], ["--help"], ["stauts"], ["--version"]])
def test_no_command_first_gets_the_whole_program(args: list[str]) -> None:
    assert _narrowed(app, args) is app


def test_every_commands_help_and_usage_errors_read_as_the_whole_programs(capsys: pytest.CaptureFixture[str]) -> None:
    """Only arguments that click refuses or answers with help before any command runs."""
    whole = typer.main.get_command(app)
    groups = {name for name, command in whole.commands.items()  # type: ignore[attr-defined]
              if isinstance(command, typer.core.TyperGroup)}
    assert {"runs", "data", "emulator"} <= groups
    for name in _names(app):
        wrong_word = [[name, "no-such-command"]] if name in groups else []
        for args in ([name, "--help"], [name, "--no-such-flag"], *wrong_word):
            narrowed = _outcome(typer.main.get_command(_narrowed(app, args)), args, capsys)
            assert narrowed == _outcome(whole, args, capsys), args
            assert narrowed[1], args


def test_the_program_collects_cycles_at_its_own_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    before = gc.get_threshold()
    monkeypatch.setattr(sys, "argv", ["tpuops", "--version"])
    try:
        with pytest.raises(SystemExit) as done:
            entry()
        assert done.value.code == 0
        assert gc.get_threshold() == GC_THRESHOLDS != before
    finally:
        gc.set_threshold(*before)


NOT_FOR_STATUS = ("tpuops.controller", "tpuops.launch", "tpuops.sweeps", "tpuops.sim", "tpuops.dashboard",
                  "tpuops.notify", "tpuops.data", "tpuops.tfenv", "optuna", "numpy", "jinja2", "yaml", "starlette",
                  "google.cloud.storage", "tensorflow")
"""What ``tpuops status`` has no use for: the wings that launch, drive, plan and serve runs, and their libraries."""


def test_status_imports_nothing_that_launches_drives_or_serves_runs(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for run_id in ("run-a", "run-b"):
        node = runs.NodeSpec(name=run_id, accelerator="v3-8", runtime="tpu-vm-tf-2.9.3", capacity=Capacity.SPOT,
                             zones=["us-central1-b"])
        runs.declare(store, runs.RunRecord(run_id=run_id, kind=runs.RunKind.TRAIN, node=node, experiment="e"), {})
    config = tmp_path / "tpuops.toml"
    config.write_text(f'node_provider = "memory"\nzones = ["us-central1-b"]\nstore = "{tmp_path / "store"}"\n')
    probe = ("import json, sys, tpuops.__main__ as program\ncode = program.run(['status'])\n"
             "print(json.dumps([code, sorted(sys.modules)]))")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")},
           "TPUOPS_HOME": str(tmp_path / "home"), "TPUOPS_CONFIG": str(config)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=True, timeout=120)
    *table, last = done.stdout.splitlines()
    code, modules = json.loads(last)
    assert code == 0 and "run-a" in "\n".join(table) and "run-b" in "\n".join(table), done.stdout + done.stderr
    assert "tpuops.runs" in modules and "pydantic" in modules  # the probe saw what status did import
    unused = [m for m in modules if m in NOT_FOR_STATUS or m.startswith(tuple(f"{n}." for n in NOT_FOR_STATUS))]
    assert unused == []
