"""Choosing the checkpoint to resume from: the newest one that reads back whole."""

from pathlib import Path

import pytest
import tensorflow as tf
from tpuops.agent.checkpoints import Checkpointer, candidates, newest_valid

pytestmark = pytest.mark.tf


def _save_steps(directory: Path, steps: list) -> tf.Variable:
    weights = tf.Variable(tf.zeros([64]))
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(w=weights), str(directory), max_to_keep=5, checkpoint_name="ckpt"
    )
    for step in steps:
        weights.assign(tf.fill([64], float(step)))
        manager.save(checkpoint_number=step)
    return weights


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _drop_files(prefix: Path) -> None:
    for path in prefix.parent.glob(prefix.name + ".*"):
        path.unlink()


DAMAGE = {
    "truncated data": lambda prefix: _truncate(prefix.parent / (prefix.name + ".data-00000-of-00001")),
    "truncated index": lambda prefix: _truncate(prefix.parent / (prefix.name + ".index")),
    "missing data": lambda prefix: (prefix.parent / (prefix.name + ".data-00000-of-00001")).unlink(),
    # the state file still names ckpt-30 as the latest, but its files never landed
    "state points at missing files": _drop_files,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, damage: str) -> None:
    _save_steps(tmp_path, [10, 20, 30])
    DAMAGE[damage](tmp_path / "ckpt-30")
    assert "ckpt-30" in tf.train.get_checkpoint_state(str(tmp_path)).model_checkpoint_path

    assert newest_valid(str(tmp_path)) == (20, str(tmp_path / "ckpt-20"))
    assert [step for step, _ in candidates(str(tmp_path))] == [20, 10]
    assert not list(tmp_path.glob("ckpt-30.*")), "the damaged checkpoint is removed"


def test_complete_checkpoint_missing_from_the_state_file_is_used(tmp_path: Path) -> None:
    _save_steps(tmp_path, [10, 20])
    state = (tmp_path / "checkpoint").read_text()
    _save_steps(tmp_path / "later", [30])
    for path in (tmp_path / "later").glob("ckpt-30.*"):
        path.rename(tmp_path / path.name)
    (tmp_path / "checkpoint").write_text(state)  # as if the agent died before updating it
    assert newest_valid(str(tmp_path)) == (30, str(tmp_path / "ckpt-30"))


def test_empty_or_missing_directory_means_fresh_start(tmp_path: Path) -> None:
    assert newest_valid(str(tmp_path / "absent")) is None
    assert newest_valid(str(tmp_path)) is None


def test_checkpointer_restores_values_and_keeps_the_schedule(tmp_path: Path) -> None:
    _save_steps(tmp_path, [10, 20])
    DAMAGE["truncated data"](tmp_path / "ckpt-20")
    weights = tf.Variable(tf.zeros([64]))
    checkpointer = Checkpointer(tf.train.Checkpoint(w=weights), str(tmp_path), keep=2, every_steps=10, every_seconds=0)
    assert checkpointer.restore_newest() == 10
    assert float(weights[0]) == 10.0
    assert checkpointer.steps_to_boundary(13) == 7 and checkpointer.steps_to_boundary(20) == 10
    assert not checkpointer.due(10) and not checkpointer.due(15) and checkpointer.due(20)
    checkpointer.save(20)
    assert not checkpointer.due(20)
    assert [step for step, _ in candidates(str(tmp_path))] == [20, 10]
