"""What fails the same way on every attempt ends the run at once, saying why in one line.

Each case was once classed "crashed" and restarted on a new node up to max_restarts times (an
unknown loss or metric, a corrupt or truncated record, a seed TensorFlow refuses, an infer input
the model does not take), or it ended "succeeded" with NaN weights (a run that diverges). Now:
user-error (exit 3) or diverged (exit 4), both final, with the real cause as the message, never
TF's "in user code:" preamble.
"""

import shutil
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pytest

from agentrun import CHECKPOINT_EVERY, FEATURES, AgentRun, blobs, run_agent, write_records

pytestmark = pytest.mark.tf

USER_ERROR_EXIT = 3
DIVERGED_EXIT = 4
NAN_AFTER = 40  # the NaN layer's outputs turn NaN at step 41; checkpoints every 30 steps


def _user_error(run: AgentRun, expected: str) -> str:
    assert run.process.returncode == USER_ERROR_EXIT, run.output
    status = run.status()
    assert status["exit_class"] == "user-error" and status["exit_code"] == USER_ERROR_EXIT
    message = status["message"]
    assert expected in message and "\n" not in message and "in user code" not in message, message
    assert "Traceback (most recent call last)" in status["traceback"]
    return message


@pytest.mark.parametrize(
    ("run_id", "overrides", "expected"),
    [
        ("unknown-loss", {"entry_point": "testmodels:unknown_loss"}, "ValueError: Unknown loss function: no_such_loss"),
        ("unknown-metric", {"entry_point": "testmodels:unknown_metric"}, "Unknown metric function: no_such_metric"),
        ("seed-negative", {"seed": -5}, "seed -5 is out of range: TensorFlow takes seeds from 0 to 2**32 - 1"),
        ("seed-huge", {"seed": 9223372036854775807}, "seed 9223372036854775807 is out of range"),
    ],
)
def test_a_model_keras_cannot_compile_or_a_bad_seed_is_a_user_error_in_one_line(
    make_spec: Callable[..., Path], run_id: str, overrides: Dict[str, Any], expected: str
) -> None:
    run = run_agent(make_spec(run_id, **overrides))
    _user_error(run, expected)
    assert run.status()["step"] == 0 and not list(run.run_dir.glob("ckpt/ckpt-*.index"))


def test_a_bad_seed_in_script_mode_is_a_user_error_before_the_script_runs(make_spec: Callable[..., Path]) -> None:
    script = {"command": ["python", "outcomes.py", "talk"]}
    run = run_agent(make_spec("seed-script", seed=-5, train=None, script=script))
    _user_error(run, "seed -5 is out of range")
    assert "line 0" not in run.logs()


@pytest.mark.parametrize(
    ("damage", "overrides"), [("crc", {}), ("truncated", {}), ("crc", {"input_fn": "testinputs:blobs"})]
)
def test_a_corrupt_or_truncated_record_is_a_user_error_naming_the_file(
    make_spec: Callable[..., Path], data_dir: Path, tmp_path: Path, damage: str, overrides: Dict[str, Any]
) -> None:
    """Found while counting the records (the file is named), or, with an input_fn, mid-training."""
    for shard in data_dir.glob("train-*.tfrecord"):
        shutil.copy(shard, tmp_path / shard.name)
    victim = tmp_path / "train-00001.tfrecord"
    data = bytearray(victim.read_bytes())
    if damage == "crc":
        data[len(data) // 2] ^= 0xFF  # a byte inside a record's payload: its CRC no longer matches
    else:
        data = data[:-10]  # the last record cut short
    victim.write_bytes(bytes(data))
    run_id = f"records-{damage}" + ("-input-fn" if overrides else "")
    run = run_agent(make_spec(run_id, dataset={"train": [str(tmp_path / "train-*.tfrecord")]}, **overrides))
    where = "" if overrides else f" in {victim}"
    message = _user_error(run, f"dataset.train: a record{where} is corrupt or cut short")
    assert ("corrupted record at" if damage == "crc" else "truncated record at") in message
    if overrides:
        assert run.status()["step"] > 0, "found mid-training: the input_fn's records are not counted first"


def test_infer_with_inputs_of_the_wrong_shape_is_a_user_error(
    make_spec: Callable[..., Path], reference_run: AgentRun, tmp_path: Path
) -> None:
    rng = np.random.default_rng(1)
    x, y = blobs(rng, 40, rng.normal(size=(4, FEATURES)))
    write_records(tmp_path / "narrow-00000.tfrecord", x[:, :10], y)
    spec = make_spec(
        "infer-narrow",
        dataset={"features": {"x": {"dtype": "float32", "shape": [10]}, "label": {"dtype": "int64"}}},
        infer={"input": [str(tmp_path / "narrow-*.tfrecord")], "model": str(reference_run.run_dir / "model"),
               "batch_size": 16},
    )
    run = run_agent(spec, command="infer")
    message = _user_error(run, f"infer.model {reference_run.run_dir / 'model'} does not accept the features")
    assert "expected shape=(None, 12), found shape=(16, 10)" in message


@pytest.mark.parametrize("entry_point", ["testmodels:diverges", "testmodels:diverges_compiled"])
def test_a_run_whose_loss_turns_nan_ends_diverged_naming_the_step_and_the_last_good_checkpoint(
    make_spec: Callable[..., Path], entry_point: str
) -> None:
    run_id = entry_point.split(":")[1].replace("_", "-")
    spec = make_spec(run_id, entry_point=entry_point, hparams={"nan_after": NAN_AFTER})
    run = run_agent(spec)
    assert run.process.returncode == DIVERGED_EXIT, run.output
    status = run.status()
    assert status["exit_class"] == "diverged" and status["exit_code"] == DIVERGED_EXIT
    assert status["message"] == (
        f"training diverged: the training loss was NaN or infinite at step {NAN_AFTER + 1}; "
        f"last good checkpoint: step {CHECKPOINT_EVERY} (ckpt-{CHECKPOINT_EVERY})"
    )
    assert run.checkpoint_steps() == [CHECKPOINT_EVERY], "no checkpoint of the diverged weights"
    assert not (run.run_dir / "model").exists()
    assert status["last_checkpoint_step"] == CHECKPOINT_EVERY and status["step"] < 2 * CHECKPOINT_EVERY


def test_a_script_that_reports_a_nan_loss_ends_diverged(make_spec: Callable[..., Path]) -> None:
    spec = make_spec(
        "script-diverges",
        train=None,
        hparams={"epochs": 3, "steps_per_epoch": 20, "features": FEATURES, "classes": 4, "model": "diverges",
                 "nan_after": 25},
        script={"command": ["python", "fit_script.py"], "hparams_as_flags": True, "checkpoint_every_steps": 10},
    )
    run = run_agent(spec)
    assert run.process.returncode == DIVERGED_EXIT, run.output
    status = run.status()
    assert status["exit_class"] == "diverged"
    assert status["message"].startswith("training diverged: the script reported ") and "train.loss" in status["message"]
    # the helper saw the NaN before its save at step 30 and saved nothing after step 20
    assert "last checkpoint it reported: step 20" in status["message"]
    assert run.checkpoint_steps()[-1] == 20
