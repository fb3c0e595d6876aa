"""A run whose loss went NaN: 'diverged' wherever a run's ending is told, and strict JSON whatever it reported.

Before: a NaN run ended "succeeded" (exit 0), and once one existed ``tpuops runs --json``
tracebacked on every call ("Out of range float values are not JSON compliant") and the
dashboard's JSON answered 500. (The agent's side is ``tests/agent/test_deterministic_failures.py``;
a sweep's NaN objective, ``tests/sweeps/test_sweep_decide.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fuzzing import Sandbox, run_case

from tests.controller.test_controller_decide import DELETING, READY, missing, seen, status, step, training
from tests.dashboard.test_dashboard_app import client, declare, settings  # noqa: F401  (settings: the fixture)
from tests.runs.test_runs import record
from tpuops import runs
from tpuops.cli.common import print_json
from tpuops.config import Settings
from tpuops.controller.drive import Finished
from tpuops.core.formats import NON_FINITE, strict_json
from tpuops.runs import AgentStatus, Memory, Outcome
from tpuops.session import store
from tpuops.store import LocalStore, Store

pytestmark = pytest.mark.unit

NAN, INF = float("nan"), float("inf")
DIVERGED = ("training diverged: the training loss was NaN or infinite at step 41; "
            "last good checkpoint: step 30 (ckpt-30)")


def strict_loads(text: str) -> Any:
    """json.loads refusing NaN and Infinity, as a strict JSON reader does."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in the output: not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_become_null_and_their_object_names_them() -> None:
    shown = strict_json({"run": "r", "metrics": {"train": {"loss": NAN, "accuracy": 0.25},
                                                 "eval": {"loss": INF, "curve": [1.0, -INF]}},
                         "evals": [{"step": 10, "metrics": {"loss": NAN}}], "values": (NAN, 2.0), "step": 41})
    assert shown == {"run": "r", "step": 41, "values": [None, 2.0], NON_FINITE: ["values"],
                     "metrics": {"train": {"loss": None, "accuracy": 0.25, NON_FINITE: ["loss"]},
                                 "eval": {"loss": None, "curve": [1.0, None], NON_FINITE: ["curve", "loss"]}},
                     "evals": [{"step": 10, "metrics": {"loss": None, NON_FINITE: ["loss"]}}]}
    finite = {"a": [1.0, {"b": 2}], "c": "nan", "d": None, "e": True}
    assert strict_json(finite) == finite


def test_print_json_is_strict_whatever_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    print_json({"metrics": {"train": {"loss": NAN}}, "best": -INF})
    printed = strict_loads(capsys.readouterr().out)
    assert printed == {"best": None, NON_FINITE: ["best"], "metrics": {"train": {"loss": None, NON_FINITE: ["loss"]}}}


def _diverged(root: Store, run_id: str) -> None:
    """A run as a diverged agent and its controller leave it: NaN metrics in status.json, memory finished."""
    runs.declare(root, record(run_id), {"version": 1, "run_id": run_id})
    doc = {"run_id": run_id, "attempt": 1, "step": 41, "phase": "done", "exit_class": "diverged", "exit_code": 4,
           "message": DIVERGED, "metrics": {"train": {"loss": NAN, "accuracy": 0.25}}, "examples_per_sec": INF,
           "evals": [{"step": 30, "metrics": {"loss": INF}}]}
    root.write_bytes(runs.status_key(run_id), json.dumps(doc).encode())  # Python writes NaN as the agent does
    memory, generation = runs.load_memory(root, run_id)
    memory.finish(100.0, Outcome.DIVERGED, DIVERGED)
    runs.save_memory(root, run_id, memory, generation)


def test_runs_json_after_a_diverged_run_is_strict_and_says_diverged(tmp_path: Path) -> None:
    sandbox = Sandbox.make(tmp_path / "case")
    _diverged(LocalStore(sandbox.root / "store"), "nan-run")
    for _ in range(2):  # every call, not only the first
        outcome = run_case(sandbox, ["runs", "--json"])
        assert outcome.code == 0, outcome.stderr
        (shown,) = strict_loads(outcome.stdout)["runs"]
        assert (shown["run_id"], shown["outcome"], shown["exit_class"]) == ("nan-run", "diverged", "diverged")
        assert shown["metrics"]["train"] == {"loss": None, "accuracy": 0.25, NON_FINITE: ["loss"]}


def test_the_dashboard_answers_strict_json_for_a_diverged_run(settings: Settings) -> None:  # noqa: F811
    _diverged(store(settings), "nan-run")
    web = client(settings)
    rows = web.get("/data/runs?ids=nan-run")  # the row carries the status's floats (examples/s)
    assert rows.status_code == 200
    (row,) = strict_loads(rows.text)
    assert (row["outcome"], row["examples_per_sec"], row[NON_FINITE]) == ("diverged", None, ["examples_per_sec"])
    panel = web.get("/data/runs/nan-run/panel")
    assert panel.status_code == 200 and strict_loads(panel.text)["row"]["outcome"] == "diverged"


def test_a_diverged_agent_finishes_the_run_with_its_message_and_is_never_restarted() -> None:
    memory = training()
    diverged = status(1, 41, "diverged", message=DIVERGED, exit_code=4)
    assert step(memory, seen(READY, agent=diverged), 200.0) == [("delete", "us-central1-a")]
    assert (memory.phase, memory.outcome, memory.reason) == ("finished", "diverged", DIVERGED)
    for later in range(4):
        assert step(memory, missing(agent=diverged), 300.0 + later * 1000) == []
    assert step(memory, seen(DELETING, agent=diverged), 5000.0) == []
    assert (memory.attempts, memory.crashes) == (1, 0)


def test_train_follow_of_a_diverged_run_is_no_success() -> None:
    finished = Finished("r", Outcome.DIVERGED, DIVERGED, AgentStatus(), Memory(), 1.0, record("r"))
    assert not finished.succeeded and finished.target_met() is None
