"""Choosing the checkpoint to resume from: the newest one that reads back whole; staged saves."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tensorflow as tf
from tpuops.agent.checkpoints import Checkpointer, candidates, newest_valid, problem

from agentrun import REPO, RUN_TIMEOUT_S

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


def test_background_save_is_copied_into_the_store_and_pruned(tmp_path: Path) -> None:
    store, staging = tmp_path / "store", tmp_path / "staging"
    weights = tf.Variable(tf.zeros([64]))
    checkpointer = Checkpointer(tf.train.Checkpoint(w=weights), str(store), keep=2, every_steps=10, every_seconds=0,
                                staging=str(staging))
    for step in (10, 20, 30):
        weights.assign(tf.fill([64], float(step)))
        assert checkpointer.save(step, background=True) == str(store / f"ckpt-{step}")
        weights.assign(tf.fill([64], -1.0))  # the step loop goes on while the copy runs
    checkpointer.wait()

    assert checkpointer.stored_step == 30
    assert [step for step, _ in candidates(str(store))] == [30, 20]
    assert [step for step, _ in candidates(str(staging))] == [30], "staging keeps only what is being copied"
    assert tf.train.latest_checkpoint(str(store)) == str(store / "ckpt-30")
    restored = tf.Variable(tf.zeros([64]))
    again = Checkpointer(tf.train.Checkpoint(w=restored), str(store), keep=2, every_steps=10, every_seconds=0,
                         staging=str(tmp_path / "staging-2"))
    assert again.restore_newest() == 30 and float(restored[0]) == 30.0


def test_a_failed_copy_is_raised_by_the_next_save(tmp_path: Path) -> None:
    store = tmp_path / "store"
    checkpointer = Checkpointer(tf.train.Checkpoint(w=tf.Variable(1.0)), str(store), keep=2, every_steps=10,
                                every_seconds=0, staging=str(tmp_path / "staging"))
    store.rmdir()
    store.write_text("not a directory")
    checkpointer.save(10, background=True)
    with pytest.raises(tf.errors.OpError):
        checkpointer.save(20)
    assert checkpointer.stored_step is None


def test_on_stored_names_a_step_only_once_it_is_whole_in_the_store(tmp_path: Path) -> None:
    """The callbacks status relies on: ``on_writing`` while the copy is pending, ``on_stored`` once it is whole."""
    store = tmp_path / "store"
    weights = tf.Variable(tf.fill([1 << 16], 10.0))
    held, events = threading.Event(), []

    def writing(step: int) -> None:
        events.append(("writing", step))
        assert held.wait(RUN_TIMEOUT_S), "the test never released the write"

    def stored(step: int) -> None:
        prefix = str(store / f"ckpt-{step}")
        events.append(("stored", step, problem(prefix), tf.train.latest_checkpoint(str(store))))

    checkpointer = Checkpointer(tf.train.Checkpoint(w=weights), str(store), keep=2, every_steps=10, every_seconds=0,
                                staging=str(tmp_path / "staging"), on_writing=writing, on_stored=stored)
    checkpointer.save(10, background=True)
    weights.assign(tf.fill([1 << 16], 20.0))  # the loop goes on while the save is held in flight
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not events:
        assert time.monotonic() < deadline, "on_writing was never called"
        time.sleep(0.01)
    assert events == [("writing", 10)] and checkpointer.stored_step is None
    assert candidates(str(store)) == [], "held before its copy: nothing is in the store yet"
    held.set()
    checkpointer.wait()
    assert events == [("writing", 10), ("stored", 10, None, str(store / "ckpt-10"))]
    assert checkpointer.stored_step == 10
    checkpointer.save(20)  # blocking: both callbacks have run when it returns
    assert events[2:] == [("writing", 20), ("stored", 20, None, str(store / "ckpt-20"))]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # TensorFlow's writer dies
def test_a_failed_background_write_is_raised_by_wait_and_never_reported_stored(tmp_path: Path) -> None:
    store = tmp_path / "store"
    reported = []
    checkpointer = Checkpointer(tf.train.Checkpoint(w=tf.Variable(1.0)), str(store), keep=2, every_steps=10,
                                every_seconds=0, on_stored=reported.append)
    blocker = store / "ckpt-10.data-00000-of-00001"
    (blocker / "in-the-way").mkdir(parents=True)  # TensorFlow's writer cannot move its data file into place
    checkpointer.save(10, background=True)
    with pytest.raises(RuntimeError, match="ckpt-10 was not written"):
        checkpointer.wait()
    assert reported == [] and checkpointer.stored_step is None
    checkpointer.wait()  # raised once: the caller decides what follows
    (blocker / "in-the-way").rmdir()
    blocker.rmdir()
    checkpointer.save(10)  # the failed step again (a preemption at that step): written, not skipped
    assert reported == [10] and checkpointer.stored_step == 10 and problem(str(store / "ckpt-10")) is None
    checkpointer.save(20)
    assert reported == [10, 20] and checkpointer.stored_step == 20


_KILLED_COPY = """
import sys, time
from pathlib import Path
import tensorflow as tf
from tpuops.agent.checkpoints import Checkpointer

store, staging, ready = sys.argv[1:]
weights = tf.Variable(tf.zeros([1 << 20]))
checkpointer = Checkpointer(tf.train.Checkpoint(w=weights), store, keep=3, every_steps=10, every_seconds=0,
                            staging=staging)
weights.assign(tf.fill([1 << 20], 10.0))
checkpointer.save(10)

def copy_half_then_hang(source, target, overwrite=False):
    data = Path(source).read_bytes()
    Path(target).write_bytes(data[: len(data) // 2])
    Path(ready).write_text(target)
    time.sleep(600)

tf.io.gfile.copy = copy_half_then_hang
weights.assign(tf.fill([1 << 20], 20.0))
checkpointer.save(20)
"""


def test_a_copy_killed_midway_leaves_the_previous_checkpoint_newest(tmp_path: Path) -> None:
    store, staging, ready = tmp_path / "store", tmp_path / "staging", tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen([sys.executable, "-c", _KILLED_COPY, str(store), str(staging), str(ready)], env=env)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not ready.exists():
            assert process.poll() is None, "the saving process died before the copy began"
            assert time.monotonic() < deadline, "the copy never began"
            time.sleep(0.02)
    finally:
        process.kill()
        process.wait()

    partial = Path(ready.read_text())
    assert partial.exists() and partial.parent == store, "the kill left a half-copied file in the store"
    assert [step for step, _ in candidates(str(store))] == [10], "a half-copied checkpoint is no candidate at all"
    assert newest_valid(str(store)) == (10, str(store / "ckpt-10"))
    weights = tf.Variable(tf.zeros([1 << 20]))
    checkpointer = Checkpointer(tf.train.Checkpoint(w=weights), str(store), keep=3, every_steps=10, every_seconds=0,
                                staging=str(staging))
    assert checkpointer.restore_newest() == 10 and float(weights[0]) == 10.0
    checkpointer.save(20)
    assert not partial.exists(), "the next copy removes what the dead one left"
    assert [step for step, _ in candidates(str(store))] == [20, 10]


@pytest.mark.parametrize("staged", [False, True])
def test_background_save_keeps_the_values_of_its_step(tmp_path: Path, staged: bool) -> None:
    """The step loop updates the variables in place while the write runs: the checkpoint has the old values."""
    store = tmp_path / "store"
    weights = tf.Variable(tf.fill([1 << 23], 1.0))  # 32 MB: the write is still running after save returns
    staging = str(tmp_path / "staging") if staged else None
    checkpointer = Checkpointer(tf.train.Checkpoint(w=weights), str(store), keep=2, every_steps=10, every_seconds=0,
                                staging=staging)
    checkpointer.save(10, background=True)
    for _ in range(3):
        weights.assign_add(tf.ones([1 << 23]))
    checkpointer.wait()
    assert checkpointer.stored_step == 10
    saved = tf.train.load_checkpoint(str(store / "ckpt-10")).get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE")
    assert (saved == 1.0).all()


def test_every_auto_re_chooses_the_interval_from_each_measured_save(tmp_path: Path) -> None:
    from tpuops.contract.interval import young_daly_s

    checkpointer = Checkpointer(tf.train.Checkpoint(w=tf.Variable(tf.zeros([64]))), str(tmp_path), keep=2,
                                every_steps=0, every_seconds=600.0, loss_rate_per_hour=0.2)
    assert checkpointer.every_seconds == 600.0 and checkpointer.save_s is None  # nothing measured yet
    checkpointer.save(10)
    assert checkpointer.save_s is not None and checkpointer.save_s > 0
    assert checkpointer.every_seconds == young_daly_s(checkpointer.save_s, 0.2)
    fixed = Checkpointer(tf.train.Checkpoint(w=tf.Variable(1.0)), str(tmp_path / "fixed"), keep=2, every_steps=0,
                         every_seconds=600.0)
    fixed.save(10)
    assert fixed.every_seconds == 600.0
