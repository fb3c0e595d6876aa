"""The agent trains to completion, and resumes bit-exactly after SIGTERM, SIGKILL and corruption.

Every resumed run is compared with the shared uninterrupted reference run: all tensors of the
final checkpoint (weights, optimizer slots, step, data position) must be equal bit for bit.
"""

import json
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, Set

import pytest
from tpuops.agent.checkpoints import newest_valid, problem

from agentrun import (
    CHECKPOINT_EVERY,
    EVAL_EXAMPLES,
    RUN_TIMEOUT_S,
    TOTAL_STEPS,
    AgentRun,
    assert_identical,
    final_tensors,
    run_agent,
)

pytestmark = pytest.mark.tf

PREEMPTED_EXIT = 143


def test_train_to_completion(reference_run: AgentRun) -> None:
    status = reference_run.status()
    assert status["exit_class"] == "succeeded" and status["exit_code"] == 0
    assert status["phase"] == "done" and status["step"] == TOTAL_STEPS
    assert (status["last_checkpoint_step"], status["checkpoint_in_flight"]) == (TOTAL_STEPS, None)
    assert status["checkpoint_every_s"] == 0  # the interval in use: by steps only in this spec
    assert status["last_save_s"] > 0  # the last checkpoint's measured cost: what a forecast learns
    assert status["resumed_from_step"] is None and status["attempt"] == 1
    assert status["recomputed_steps"] == 0
    assert status["device"] == "CPU" and status["global_batch"] == 32
    assert status["deterministic"] is True  # the spec says null: the auto rule turns it on without a TPU
    assert status["metrics"]["eval"]["accuracy"] >= 0.95
    last_eval = status["evals"][-1]
    assert last_eval["step"] == TOTAL_STEPS
    assert last_eval["metrics"]["accuracy"] == status["metrics"]["eval"]["accuracy"]
    # keep_checkpoints=3 of the periodic ones, the last being the final step
    assert reference_run.checkpoint_steps() == [
        TOTAL_STEPS - 2 * CHECKPOINT_EVERY,
        TOTAL_STEPS - CHECKPOINT_EVERY,
        TOTAL_STEPS,
    ]
    assert (reference_run.run_dir / "model" / "saved_model.pb").is_file()
    [attempt] = status["attempts"]
    _assert_accounted(attempt)
    assert attempt["recomputed_s"] == 0 and attempt["productive_s"] > 0 and attempt["eval_s"] > 0
    assert list((reference_run.run_dir / "tb").glob("events.out.tfevents.*"))
    logs = reference_run.logs()
    assert "fresh start at step 0" in logs and "counted 600 training records" in logs
    assert f"eval at step {TOTAL_STEPS}" in logs
    assert final_tensors(reference_run.run_dir)["step/.ATTRIBUTES/VARIABLE_VALUE"] == TOTAL_STEPS
    assert EVAL_EXAMPLES % 32, "the eval set must end in a padded batch"


def _assert_accounted(attempt: Dict[str, Any]) -> None:
    """An ended attempt's segments are disjoint parts of its wall time, in the order they happen."""
    assert attempt["started_at"] <= attempt["agent_at"] <= attempt["loaded_at"] <= attempt["first_step_at"] \
        <= attempt["ended_at"]
    assert attempt["started_at"] <= attempt["process_at"] < attempt["agent_at"], "the TensorFlow import is setup"
    segments = sum(attempt[f"{name}_s"] for name in ("setup", "productive", "recomputed", "checkpoint", "eval", "save"))
    assert 0 < segments <= attempt["ended_at"] - attempt["started_at"] + 0.01
    # setup ends at the first completed step: equal up to the millisecond both times are rounded to
    assert attempt["setup_s"] >= attempt["first_step_at"] - attempt["started_at"] - 0.001
    assert attempt["checkpoint_s"] > 0 and attempt["save_s"] > 0
    assert 0 <= attempt["input_wait_s"] <= attempt["productive_s"] + attempt["recomputed_s"]


def _resume(spec: Path, killed: AgentRun, reference: AgentRun, expected_step: int) -> None:
    """Resume the run ``killed`` stopped; it must start at ``expected_step``.

    Recomputed steps count as far as the stopped attempt's last status says it got. A SIGKILL can
    land after a background save is whole in the store and before any status write names it or
    a later step: the resume then starts past that status, and nothing is recomputed.
    """
    reached = killed.status()["step"]
    resumed = run_agent(spec)
    assert resumed.process.returncode == 0, resumed.output
    status = resumed.status()
    assert status["exit_class"] == "succeeded" and status["attempt"] == 2
    assert status["resumed_from_step"] == expected_step
    assert status["recomputed_steps"] == max(0, reached - expected_step)
    assert f"resumed from step {expected_step}" in resumed.logs()
    first, second = status["attempts"]
    assert (first["attempt"], second["attempt"]) == (1, 2) and second["started_at"] >= first["agent_at"]
    _assert_accounted(second)
    if status["recomputed_steps"] == 0:  # redone steps in the first call count as its setup (it compiles)
        assert second["recomputed_s"] == 0
    assert_identical(final_tensors(killed.run_dir), final_tensors(reference.run_dir))
    # The last window of steps_per_call 7 is the last step alone (119 = 17 x 7), whatever step the run resumed at.
    assert status["metrics"]["train"] == reference.status()["metrics"]["train"]
    assert (status["metrics"]["train"]["first_step"], status["metrics"]["train"]["step"]) == (TOTAL_STEPS, TOTAL_STEPS)


def test_sigterm_checkpoints_at_the_call_boundary_and_resumes_exactly(
    make_spec: Callable[..., Path], reference_run: AgentRun
) -> None:
    spec = make_spec("sigterm")
    run = AgentRun(spec)
    run.wait_for_checkpoint(CHECKPOINT_EVERY)
    run.signal(signal.SIGTERM)
    assert run.wait() == PREEMPTED_EXIT, run.output
    status = run.status()
    assert status["exit_class"] == "preempted" and status["exit_code"] == PREEMPTED_EXIT
    stopped_at = status["step"]
    assert CHECKPOINT_EVERY <= stopped_at < TOTAL_STEPS
    assert status["last_checkpoint_step"] == stopped_at
    assert run.checkpoint_steps()[-1] == stopped_at, "the notice must be answered with a checkpoint"
    assert "preemption notice (signal SIGTERM)" in run.logs()
    _resume(spec, run, reference_run, stopped_at)


def test_saves_in_flight_are_named_once_stored_and_sigterm_waits_for_them(make_spec: Callable[..., Path]) -> None:
    """Scheduled saves run in the background; status names one only once its files are in the store.

    96 MB of variables saved after every call keep a save in flight most of the time; the
    SIGTERM lands while one is (or just was) written, and the preemption save must wait for it.
    """
    every = 7  # steps_per_call: a save after every call
    spec = make_spec("in-flight", hparams={"hidden": 1 << 19},
                     train={"checkpoint_every_steps": every, "keep_checkpoints": 5})
    run = AgentRun(spec)
    named: Set[int] = set()
    writing: Set[int] = set()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while len(writing) < 2:
        assert time.monotonic() < deadline, f"no two saves seen in flight (seen: {sorted(writing)})"
        assert run.process.poll() is None, run.process.communicate()[0].decode()
        try:
            status = run.status()
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet
            status = {}
        saved, in_flight = status.get("last_checkpoint_step"), status.get("checkpoint_in_flight")
        if saved is not None and saved not in named:
            assert saved in run.checkpoint_steps(), f"status names ckpt-{saved} before it is in the store"
            named.add(saved)
        if in_flight is not None:
            assert in_flight % every == 0 and in_flight not in named
            writing.add(in_flight)
        time.sleep(0.01)
    run.signal(signal.SIGTERM)
    assert run.wait() == PREEMPTED_EXIT, run.output
    status = run.status()
    stopped_at = status["step"]
    assert status["exit_class"] == "preempted" and stopped_at >= max(writing)
    assert (status["last_checkpoint_step"], status["checkpoint_in_flight"]) == (stopped_at, None)
    assert named and max(named) < max(writing), "the save before the one in flight was named"
    prefix = run.run_dir / "ckpt" / f"ckpt-{stopped_at}"
    assert problem(str(prefix)) is None
    assert newest_valid(str(run.run_dir / "ckpt")) == (stopped_at, str(prefix))
    assert status["phase"] == "done" and status["attempts"][0]["checkpoint_s"] > 0


def test_sigkill_resumes_from_the_last_periodic_checkpoint(
    make_spec: Callable[..., Path], reference_run: AgentRun
) -> None:
    spec = make_spec("sigkill")
    run = AgentRun(spec)
    run.wait_for_checkpoint(2 * CHECKPOINT_EVERY)
    run.signal(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL
    last = run.checkpoint_steps()[-1]
    assert last % CHECKPOINT_EVERY == 0 and 2 * CHECKPOINT_EVERY <= last < TOTAL_STEPS
    assert run.status()["exit_class"] is None, "a killed agent cannot report an exit"
    assert last >= (run.status()["last_checkpoint_step"] or 0), "status named a checkpoint the store lacks"
    _resume(spec, run, reference_run, last)


def test_corrupt_newest_checkpoint_is_skipped(make_spec: Callable[..., Path], reference_run: AgentRun) -> None:
    spec = make_spec("corrupt")
    ckpt = reference_run.run_dir.parent / "corrupt" / "ckpt"
    shutil.copytree(str(reference_run.run_dir / "ckpt"), str(ckpt))
    data = ckpt / f"ckpt-{TOTAL_STEPS}.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    run = run_agent(spec)
    assert run.process.returncode == 0, run.output
    previous = TOTAL_STEPS - CHECKPOINT_EVERY
    assert run.status()["resumed_from_step"] == previous
    assert f"skipping corrupt checkpoint {ckpt / f'ckpt-{TOTAL_STEPS}'}" in run.logs()
    assert_identical(final_tensors(run.run_dir), final_tensors(reference_run.run_dir))


def test_the_training_metrics_average_the_same_steps_whatever_the_heartbeat(make_spec: Callable[..., Path]) -> None:
    """Status ``metrics.train`` is the mean over a window of steps fixed by ``steps_per_call`` (here 31-40), not over
    the steps since the last report: an agent that reports at every window's end (a heartbeat shorter than a call, as
    a slow slice's is) and one that reports only at the end (a fast host's) report the same values, bit for bit.
    The last CI rehearsal saw a slice's 0.604 against one host's 1.319: the means of steps 31-40 and of 1-40."""
    train = {"steps": 40, "steps_per_call": 10, "checkpoint_every_steps": 40}
    often, never = (run_agent(make_spec(f"window-{name}", heartbeat_seconds=seconds, train=train))
                    for name, seconds in (("often", 0.05), ("never", 1000)))
    assert often.process.returncode == 0, often.output
    assert never.process.returncode == 0, never.output
    reports = [re.findall(r"step (\d+)/40 train \(steps (\d+)-(\d+)\)", run.logs()) for run in (often, never)]
    assert reports == [[("10", "1", "10"), ("20", "11", "20"), ("30", "21", "30"), ("40", "31", "40")],
                       [("40", "31", "40")]], "each call of 10 steps (0.3 s of pauses) outlasts the short heartbeat"
    metrics = [run.status()["metrics"]["train"] for run in (often, never)]
    assert metrics[0] == metrics[1]
    assert (metrics[0]["first_step"], metrics[0]["step"]) == (31, 40) and set(metrics[0]) == {
        "first_step", "step", "loss", "accuracy"}
