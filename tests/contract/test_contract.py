"""The agent's contract with the control plane, one definition read by both sides (``tpuops.contract``).

The agent writes ``status.json`` from ``tpuops.contract.status.new_document`` and refuses any field not in
it (tests/agent/test_status_logs.py holds the writer to ``FIELDS``); here the control plane's reader,
``tpuops.runs.models.AgentStatus``, is held to the same ``FIELDS`` field by field: it knows every field and
no other (it ignores unknown ones, so a field only the writer knew would be lost without a word), and it
reads back every value the contract allows. The package itself must import on the agent's Python 3.8 with
the standard library alone, since the bundle ships it beside the agent.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import tpuops.contract
from tpuops.contract import status, wake
from tpuops.contract.exits import ExitClass, Phase
from tpuops.contract.timing import AttemptClock
from tpuops.runs.models import AgentStatus, AttemptTime, EvalPoint, RunKind

pytestmark = pytest.mark.unit

CONTRACT = Path(tpuops.contract.__file__).parent

ENUMERATED = {"command": status.COMMANDS, "phase": status.PHASES, "exit_class": status.EXIT_CLASSES}
"""The text fields whose values the contract lists: each is tried with every value."""
SAMPLES: dict[type, Any] = {
    str: "2026-12-07T04:00:00+00:00", int: 7, float: 1.5, bool: True, type(None): None,
    dict: {"train": {"loss": 0.5}, "eval": {"accuracy": 0.75}, "predicted": 3},
    list: [],
}
"""A value of each JSON type (a time where a field holds text, as the text fields not enumerated do)."""
ENTRIES: dict[str, list[Any]] = {
    "evals": [[{"step": 3, "metrics": {"loss": 0.25}}, {"step": 6, "metrics": {}}]],
    "attempts": [[AttemptClock(1, started_at=1_000.0).entry()]],
}
"""Lists with entries, as a run writes them after an evaluation and an attempt."""


def _samples(name: str) -> list[Any]:
    kinds = status.FIELDS[name]
    values = [SAMPLES[kind] for kind in kinds if not (kind is str and name in ENUMERATED)]
    return values + list(ENUMERATED.get(name, ())) + ENTRIES.get(name, [])


def test_the_reader_knows_every_field_the_writer_writes_and_no_other() -> None:
    assert list(AgentStatus.model_fields) == list(status.FIELDS)


def test_a_fresh_document_is_read_as_a_starting_attempt() -> None:
    document = status.new_document("r1", "infer", 2, recomputed_steps=4)
    assert {name: type(value) in status.FIELDS[name] for name, value in document.items()} == dict.fromkeys(
        status.FIELDS, True)
    read = AgentStatus.model_validate(document)
    assert (read.run_id, read.command, read.attempt, read.phase, read.recomputed_steps) == (
        "r1", RunKind.INFER, 2, Phase.STARTING, 4)
    assert read.exit_class is None and not read.final


@pytest.mark.parametrize("name", list(status.FIELDS))
def test_each_field_reads_back_every_value_the_contract_allows(name: str) -> None:
    for value in _samples(name):
        document = dict(status.new_document("r1", "train", 1), **{name: value})
        read = AgentStatus.model_validate(document).model_dump(mode="json")
        assert read[name] == value, f"{name}: the agent writes {value!r}, the control plane reads {read[name]!r}"


def test_the_enumerated_values_are_the_readers_enums() -> None:
    assert tuple(kind.value for kind in RunKind) == status.COMMANDS
    assert tuple(exit_class.value for exit_class in ExitClass) == status.EXIT_CLASSES
    assert tuple(phase.value for phase in Phase) == status.PHASES


def test_an_attempt_entry_and_an_eval_entry_are_read_field_by_field() -> None:
    entry = AttemptClock(3, started_at=1_000.0).entry()
    assert sorted(entry) == sorted(AttemptTime.model_fields)
    assert AttemptTime.model_validate(entry).model_dump() == entry
    assert tuple(EvalPoint.model_fields) == status.EVAL_FIELDS


def test_the_wake_marker_is_read_as_written() -> None:
    text = wake.marker_text("r1", 2, 1_234.5)
    assert wake.marker_at(text.encode()) == 1_234.5
    assert list(json.loads(text)) == list(wake.MARKER_FIELDS)
    assert wake.marker_key("r1") == "wake/r1"


@pytest.mark.parametrize("path", sorted(CONTRACT.glob("*.py")), ids=lambda p: p.name)
def test_the_contract_is_python_3_8_and_the_standard_library(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), feature_version=(3, 8))
    modules = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    modules += [node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0]
    foreign = [m for m in modules if m.split(".")[0] not in sys.stdlib_module_names
               and m != "tpuops.contract" and not m.startswith("tpuops.contract.")]
    assert not foreign, f"{path.name} imports beyond the standard library and the contract: {foreign}"
