"""The CLI's argument space, fuzzed: every leaf command of the Typer app, every flag, drawn by type.

A failing case is printed with its argv; ``fuzzing.verdict`` says which promise it broke. The
unit lane runs the fixed-seed ``quick`` profile; ``make fuzz`` runs the ``long`` one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzzing import PROFILE, UNFUZZED, Sandbox, cli_cases, leaves, peak_mb, reset_peak, run_case, verdict
from hypothesis import given, settings

pytestmark = pytest.mark.unit


def test_the_walk_finds_every_command() -> None:
    words = {leaf.words for leaf in leaves()}
    assert {("init",), ("up",), ("sweep", "start"), ("emulator", "fault"), ("data", "sample")} <= words
    assert set(UNFUZZED) <= words, "an unfuzzed command was renamed: update fuzzing.UNFUZZED"


@settings(settings.get_profile(PROFILE))
@given(argv=cli_cases())
def test_any_arguments_keep_the_promise(tmp_path_factory: pytest.TempPathFactory, argv: list[str]) -> None:
    sandbox = Sandbox.make(Path(tmp_path_factory.mktemp("case")))
    outcome = run_case(sandbox, argv)
    problem = verdict(outcome)
    assert problem is None, f"tpuops {' '.join(argv)}: {problem}\nstderr: {outcome.stderr[-2000:]}"


def test_a_cases_memory_is_counted_from_its_own_start() -> None:
    """What a case grows by is measured from its start, not the process's lifetime peak (order-proof)."""
    resident = reset_peak()
    block = b"x" * (80 << 20)
    assert peak_mb() - resident >= 75
    del block
    resident = reset_peak()
    assert peak_mb() - resident < 75  # the earlier peak no longer counts
