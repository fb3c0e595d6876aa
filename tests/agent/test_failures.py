"""Runs that cannot succeed end as user-error, with the reason and the traceback in status.json."""

from pathlib import Path
from typing import Any, Callable, Dict

import pytest

from agentrun import FEATURES, run_agent

pytestmark = pytest.mark.tf

USER_ERROR_EXIT = 3


@pytest.mark.parametrize(
    ("run_id", "overrides", "expected"),
    [
        ("bad-entry", {"entry_point": "no_such_module:build"}, "No module named 'no_such_module'"),
        ("raising-model", {"entry_point": "testmodels:explodes"}, "boom from the user's model code"),
        (
            "wrong-features",
            {
                "dataset": {
                    "features": {"pixels": {"dtype": "float32", "shape": [FEATURES]}, "label": {"dtype": "int64"}},
                }
            },
            "Feature: pixels (data type: float) is required but could not be found",
        ),
    ],
)
def test_user_errors_are_reported_with_the_traceback(
    make_spec: Callable[..., Path], run_id: str, overrides: Dict[str, Any], expected: str
) -> None:
    run = run_agent(make_spec(run_id, **overrides))
    assert run.process.returncode == USER_ERROR_EXIT, run.output
    status = run.status()
    assert status["exit_class"] == "user-error" and status["exit_code"] == USER_ERROR_EXIT
    assert status["phase"] == "done"
    assert expected in status["traceback"]
    assert "Traceback (most recent call last)" in status["traceback"]
    assert status["message"]
    assert expected in run.logs()


def test_refuses_to_run_without_a_tpu_unless_allowed(make_spec: Callable[..., Path]) -> None:
    run = run_agent(make_spec("no-tpu", allow_cpu_fallback=False))
    assert run.process.returncode == USER_ERROR_EXIT, run.output
    status = run.status()
    assert status["exit_class"] == "user-error"
    assert "no TPU found" in status["message"] and "allow_cpu_fallback" in status["message"]
    assert status["step"] == 0 and not (run.run_dir / "ckpt").exists()


def test_invalid_spec_fails_before_touching_the_store(make_spec: Callable[..., Path]) -> None:
    spec = make_spec("typo", train={"stpes": 10})
    run = run_agent(spec)
    assert run.process.returncode == USER_ERROR_EXIT
    assert "unknown key(s) ['stpes']" in run.output
    assert not run.run_dir.exists()
