"""Compiled Keras models and user input functions: trained by the agent's loop, resumed bit-identically.

Each mode has one uninterrupted reference run and one run stopped by SIGTERM and resumed;
every tensor of the final checkpoints (weights, optimizer slots, step, data position) must match.
"""

import json
import logging
import signal
from pathlib import Path
from typing import Callable, Dict

import pytest
from tpuops.agent import userinput
from tpuops.contract.exits import UserError
from tpuops.contract.runspec import RunSpec, parse_spec

from agentrun import CHECKPOINT_EVERY, TOTAL_STEPS, AgentRun, assert_identical, final_tensors, run_agent

pytestmark = pytest.mark.tf

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
    # the model's own metric names: compile()'s loss and "acc", and the train_step's "grad_norm", over the last
    # window of steps_per_call 7: the last step alone (119 = 17 x 7)
    assert set(status["metrics"]["train"]) == {"loss", "acc", "grad_norm", "first_step", "step"}
    assert (status["metrics"]["train"]["first_step"], status["metrics"]["train"]["step"]) == (TOTAL_STEPS,) * 2
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


def test_a_resumed_attempt_evaluates_the_step_whose_evaluation_died_with_the_last_one(
    make_spec: Callable[..., Path], references: Dict[str, AgentRun]
) -> None:
    """An attempt killed between the checkpoint at an evaluation step and the status write of its evaluation (or
    one whose notice put the evaluation off) leaves the checkpoint and no record: the next attempt evaluates that
    step first, on the same weights, so the recovered run has every evaluation the uninterrupted one has."""
    spec = make_spec("input-fn-lost-eval", **MODES["input-fn"])
    whole = run_agent(spec)
    assert whole.process.returncode == 0, whole.output
    for path in (whole.run_dir / "ckpt").glob("ckpt-*"):  # what the killed attempt left: ckpt-60 whole, no later
        if int(path.name.split(".")[0][len("ckpt-"):]) > 60:
            path.unlink()
    status = whole.status()
    (whole.run_dir / "status.json").write_text(json.dumps(dict(status, evals=[], step=60, exit_class=None)))
    resumed = run_agent(spec)
    assert resumed.process.returncode == 0, resumed.output
    status = resumed.status()
    assert status["resumed_from_step"] == 60 and status["attempt"] == 2, status
    reference = references["input-fn"].status()["evals"]
    assert status["evals"] == reference, (status["evals"], reference)  # the same weights evaluated, bit for bit


@pytest.fixture(scope="module")
def input_spec(make_spec: Callable[..., Path]) -> Callable[[str], RunSpec]:
    def spec(input_fn: str) -> RunSpec:
        return parse_spec(make_spec("in-process", input_fn=input_fn).read_text())

    return spec


def test_a_non_deterministic_input_fn_resumes_by_step_with_a_warning(
    input_spec: Callable[[str], RunSpec], data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = input_spec("testinputs:unseeded")
    user_input = userinput.UserInput(spec, userinput.load(spec), 32, 1)
    files = sorted(str(path) for path in data_dir.glob("train-*.tfrecord"))
    stored = user_input.fingerprint(files)
    with caplog.at_level(logging.WARNING):
        stream = user_input.train_dataset(files, 20, stored)
    assert "the data position cannot be restored; resuming by step 20 on a fresh stream seeded 23" in caplog.text
    assert next(iter(stream))[0].shape == (32, 12)
    deterministic = input_spec("testinputs:blobs")
    user_input = userinput.UserInput(deterministic, userinput.load(deterministic), 32, 1)
    whole = [labels.numpy().tolist() for _, labels in user_input.train_dataset(files, 0, None).take(8)]
    resumed = user_input.train_dataset(files, 5, user_input.fingerprint(files))
    assert [labels.numpy().tolist() for _, labels in resumed.take(3)] == whole[5:], "resume lands on batch 5"


@pytest.mark.parametrize(
    ("input_fn", "expected"),
    [
        ("testinputs:two_arguments", "has the wrong signature"),
        ("testinputs:ragged_batches", "must have the static batch dimension 32"),
        ("testinputs:missing", "'testinputs' has no function 'missing'"),
    ],
)
def test_input_fn_contract_violations_are_user_errors(
    input_spec: Callable[[str], RunSpec], data_dir: Path, input_fn: str, expected: str
) -> None:
    spec = input_spec(input_fn)
    files = sorted(str(path) for path in data_dir.glob("train-*.tfrecord"))
    with pytest.raises(UserError, match=expected):
        userinput.UserInput(spec, userinput.load(spec), 32, 1).input_signature(files, 32)
