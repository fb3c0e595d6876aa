"""Script mode: the user's own program under the agent, with and without the tpuops helper.

The helper's callbacks run in a real ``model.fit`` script (``usercode/fit_script.py``): they
report step, metrics and evaluations into status.json, checkpoint every N steps and on the
preemption notice, and a rerun resumes to exactly epochs x steps_per_epoch steps. Exit codes
become exit classes.
"""

import json
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import tensorflow as tf
from tpuops.agent import script
from tpuops.agent.paths import RunPaths
from tpuops.contract.exits import UserError
from tpuops.contract.runspec import parse_spec

from agentrun import AgentRun, run_agent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tpuops" / "agent" / "userlib"))
import tpuops_helper

pytestmark = pytest.mark.tf

PREEMPTED_EXIT = 143
EPOCHS, STEPS_PER_EPOCH = 3, 20
FIT = {
    "train": None,
    "hparams": {"epochs": EPOCHS, "steps_per_epoch": STEPS_PER_EPOCH, "features": 12, "classes": 4},
    "script": {"command": ["python", "fit_script.py"], "hparams_as_flags": True, "checkpoint_every_steps": 10},
}


def _script(make_spec: Callable[..., Path], run_id: str, *command: str) -> Path:
    return make_spec(run_id, train=None, script={"command": ["python", "outcomes.py", *command]})


def test_sigterm_reaches_the_script_which_checkpoints_and_resumes_to_the_exact_step(
    make_spec: Callable[..., Path],
) -> None:
    spec = make_spec("fit-cut", **FIT)
    run = AgentRun(spec)
    run.wait_for_checkpoint(10)
    run.signal(signal.SIGTERM)
    assert run.wait() == PREEMPTED_EXIT, run.output
    status = run.status()
    assert status["exit_class"] == "preempted"
    cut = run.checkpoint_steps()[-1]
    assert 10 <= cut < EPOCHS * STEPS_PER_EPOCH and status["last_checkpoint_step"] == cut
    assert "preemption notice: checkpointed at step" in run.logs()
    resumed = run_agent(spec)
    assert resumed.process.returncode == 0, resumed.output
    done = resumed.status()
    total = EPOCHS * STEPS_PER_EPOCH
    assert done["exit_class"] == "succeeded" and done["resumed_from_step"] == cut
    assert (done["step"], done["total_steps"], done["last_checkpoint_step"]) == (total, total, total)
    # one evaluation per epoch; the resumed epochs end cut % STEPS_PER_EPOCH steps later
    shift = cut % STEPS_PER_EPOCH
    expected = [s for s in range(STEPS_PER_EPOCH, total + 1, STEPS_PER_EPOCH) if s <= cut]
    expected += [s + shift for s in range(STEPS_PER_EPOCH, total + 1, STEPS_PER_EPOCH) if cut < s + shift < total]
    assert [e["step"] for e in done["evals"]] == [*expected, total]
    assert done["metrics"]["eval"]["accuracy"] >= 0.9 and "loss" in done["metrics"]["train"]
    assert done["attempts"] == [], "the agent cannot time a script's steps: its goodput is unknown, not zero"
    logs = resumed.logs()
    assert f"resumed from {run.run_dir / 'ckpt' / f'ckpt-{cut}'} at step {cut}" in logs
    assert "fit_script.py --classes=4 --epochs=3" in logs and "| finished at step 60" in logs
    reader = tf.train.load_checkpoint(str(run.run_dir / "ckpt" / f"ckpt-{EPOCHS * STEPS_PER_EPOCH}"))
    assert reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE") == EPOCHS * STEPS_PER_EPOCH


def test_a_crash_is_reported_with_the_scripts_output_and_printed_lines_count_as_progress(
    make_spec: Callable[..., Path],
) -> None:
    crashed = run_agent(_script(make_spec, "outcome-crash", "crash"))
    assert crashed.process.returncode == 1, crashed.output
    assert crashed.status()["exit_class"] == "crashed"
    assert "the script exited with code 1" in crashed.status()["message"]
    assert "| RuntimeError: the script crashed on purpose" in crashed.logs()
    talked = run_agent(_script(make_spec, "outcome-talk", "talk"))
    assert talked.status()["exit_class"] == "succeeded"
    assert talked.status()["step"] == 5, "without the reporter every printed line is progress"


def test_the_command_and_environment_the_script_gets(make_spec: Callable[..., Path], data_dir: Path) -> None:
    spec = parse_spec(make_spec("env", **FIT).read_text())
    assert spec.script is not None
    argv = script.command(spec, spec.script)
    assert argv[:2] == [sys.executable, "fit_script.py"] and "--epochs=3" in argv and "--optimizer=adam" in argv
    env = script.environment(spec, spec.script, RunPaths(spec.store_root, "env"), 2, "/tmp/report.json")
    assert env["TPUOPS_DATA_TRAIN"].split(",") == sorted(str(p) for p in data_dir.glob("train-*.tfrecord"))
    assert json.loads(env["TPUOPS_DATA_TRAIN_FEATURES"])["x"] == {"dtype": "float32", "shape": [12], "encoding": None}
    assert (env["TPUOPS_ATTEMPT"], env["TPUOPS_ALLOW_CPU"], env["TPUOPS_CHECKPOINT_EVERY_STEPS"]) == ("2", "1", "10")
    assert env["TPUOPS_CHECKPOINT_DIR"].endswith("/runs/env/ckpt") and env["TPU_NAME"]
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("tpuops/agent/userlib")
    with pytest.raises(UserError, match=r"absent\.py is not in the bundle's experiments directory"):
        script.run(
            parse_spec(_script(make_spec, "absent", "x").read_text().replace("outcomes.py", "absent.py")),
            None,
            None,
            None,
            1,
        )  # type: ignore[arg-type]


@pytest.fixture
def helper_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TPUOPS_REPORT_FILE", str(tmp_path / "report.json"))
    previous = signal.getsignal(signal.SIGTERM)
    yield tmp_path
    signal.signal(signal.SIGTERM, previous)


def _model() -> tf.keras.Model:
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _data() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((tf.ones([8, 3]), tf.ones([8, 1]))).repeat().batch(4)


def test_helper_callback_saves_on_sigterm_and_restores_in_process(helper_env: Path) -> None:
    directory = str(helper_env / "ckpt")
    model = _model()
    ckpt = tpuops_helper.StepCheckpoint(model, steps_per_epoch=10, directory=directory, every_steps=4)

    class Preempt(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
            if batch == 6:
                os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as exited:
        model.fit(_data(), epochs=2, steps_per_epoch=10, callbacks=[Preempt(), ckpt], verbose=0)
    assert exited.value.code == PREEMPTED_EXIT
    assert tf.train.latest_checkpoint(directory).endswith("ckpt-7")
    again = _model()
    resumed = tpuops_helper.StepCheckpoint(again, steps_per_epoch=10, directory=directory, every_steps=4)
    assert (resumed.restored_step, resumed.initial_epoch) == (7, 0)
    again.fit(
        resumed.resume(_data()),
        epochs=2,
        steps_per_epoch=10,
        initial_epoch=0,
        callbacks=[resumed, tpuops_helper.StatusReporter()],
        verbose=0,
    )
    assert int(again.optimizer.iterations.numpy()) == 20, "training stops at epochs x steps_per_epoch"
    assert tf.train.latest_checkpoint(directory).endswith("ckpt-20")
    report = (helper_env / "report.json").read_text()
    assert '"step": 20' in report and '"last_checkpoint_step": 20' in report
