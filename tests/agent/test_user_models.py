"""Compiled Keras models and user input functions: trained by the agent's loop, resumed bit-identically.

Each mode has one uninterrupted reference run and one run stopped by SIGTERM and resumed;
every tensor of the final checkpoints (weights, optimizer slots, step, data position) must match.
"""

import signal
from pathlib import Path
from typing import Callable, Dict

import pytest
import tensorflow as tf

from agentrun import CHECKPOINT_EVERY, TOTAL_STEPS, AgentRun, assert_identical, final_tensors, run_agent

PREEMPTED_EXIT = 143
MODES: Dict[str, Dict] = {
    "compiled": {"entry_point": "testmodels:compiled_mlp", "train": {"eval_every_steps": 60}},
    "input-fn": {"input_fn": "testinputs:blobs", "train": {"eval_every_steps": 60}},
}


@pytest.fixture(scope="module")
def references(make_spec: Callable[..., Path]) -> Dict[str, AgentRun]:
    runs = {}
    for mode, overrides in MODES.items():
        run = run_agent(make_spec(f"{mode}-ref", **overrides))
        assert run.process.returncode == 0, run.output
        runs[mode] = run
    return runs


def test_compiled_model_trains_with_its_own_loss_metrics_and_train_step(references: Dict[str, AgentRun]) -> None:
    status = references["compiled"].status()
    assert status["exit_class"] == "succeeded" and status["step"] == TOTAL_STEPS
    # the model's own metric names: compile()'s loss and "acc", and the train_step's "grad_norm"
    assert set(status["metrics"]["train"]) == {"loss", "acc", "grad_norm"}
    assert status["metrics"]["eval"]["acc"] >= 0.95
    assert [e["step"] for e in status["evals"]] == [60, TOTAL_STEPS]
    assert set(status["evals"][-1]["metrics"]) >= {"loss", "acc"}
    assert status["input_wait_ms"] is not None and status["input_wait_ms"] >= 0
    logs = references["compiled"].logs()
    assert "compiled model: training with its own train_step" in logs and "Adam optimizer" in logs


def test_input_fn_feeds_the_built_in_loop(references: Dict[str, AgentRun]) -> None:
    status = references["input-fn"].status()
    assert status["exit_class"] == "succeeded" and status["step"] == TOTAL_STEPS
    assert status["metrics"]["eval"]["accuracy"] >= 0.95
    assert [e["step"] for e in status["evals"]] == [60, TOTAL_STEPS]
    tensors = final_tensors(references["input-fn"].run_dir)
    assert len(tensors["data/input_fingerprint/.ATTRIBUTES/VARIABLE_VALUE"]) == 64


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sigterm_resume_is_bit_identical(
    make_spec: Callable[..., Path], references: Dict[str, AgentRun], mode: str
) -> None:
    spec = make_spec(f"{mode}-cut", **MODES[mode])
    run = AgentRun(spec)
    run.wait_for_checkpoint(CHECKPOINT_EVERY)
    run.signal(signal.SIGTERM)
    assert run.wait() == PREEMPTED_EXIT, run.output
    stopped_at = run.status()["step"]
    assert CHECKPOINT_EVERY <= stopped_at < TOTAL_STEPS
    resumed = run_agent(spec)
    assert resumed.process.returncode == 0, resumed.output
    status = resumed.status()
    assert status["resumed_from_step"] == stopped_at and status["attempt"] == 2
    assert [e["step"] for e in status["evals"]] == [60, TOTAL_STEPS], "evals carry over across attempts"
    assert "not deterministic" not in resumed.logs()
    assert_identical(final_tensors(run.run_dir), final_tensors(references[mode].run_dir))


def test_a_non_deterministic_input_fn_resumes_by_step_with_a_warning(make_spec: Callable[..., Path]) -> None:
    first = run_agent(make_spec("unseeded", input_fn="testinputs:unseeded", train={"steps": 20}))
    assert first.process.returncode == 0, first.output
    resumed = run_agent(make_spec("unseeded", input_fn="testinputs:unseeded", train={"steps": 40}))
    assert resumed.process.returncode == 0, resumed.output
    assert resumed.status()["resumed_from_step"] == 20 and resumed.status()["step"] == 40
    assert "the data position cannot be restored; resuming by step 20" in resumed.logs()


@pytest.mark.parametrize(
    ("input_fn", "expected"),
    [
        ("testinputs:two_arguments", "has the wrong signature"),
        ("testinputs:ragged_batches", "must have the static batch dimension 32"),
        ("testinputs:missing", "'testinputs' has no function 'missing'"),
    ],
)
def test_input_fn_contract_violations_are_user_errors(
    make_spec: Callable[..., Path], input_fn: str, expected: str
) -> None:
    run = run_agent(make_spec("bad-" + input_fn.split(":")[1].replace("_", "-"), input_fn=input_fn))
    assert run.process.returncode == 3, run.output
    assert run.status()["exit_class"] == "user-error"
    assert expected in run.status()["message"]
    assert not tf.io.gfile.exists(str(run.run_dir / "ckpt"))
