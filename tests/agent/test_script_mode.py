"""Script mode: the user's own program under the agent, with and without the tpuops helper.

The helper's callbacks run in a real ``model.fit`` script (``usercode/fit_script.py``): they
report step, metrics and evaluations into status.json, checkpoint every N steps and on the
preemption notice, and a rerun resumes to exactly epochs x steps_per_epoch steps. Exit codes
become exit classes.
"""

import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import tensorflow as tf

from agentrun import AgentRun, run_agent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tpuops" / "agent" / "userlib"))
import tpuops_helper

PREEMPTED_EXIT = 143
EPOCHS, STEPS_PER_EPOCH = 3, 20
FIT = {
    "train": None,
    "hparams": {"epochs": EPOCHS, "steps_per_epoch": STEPS_PER_EPOCH, "features": 12, "classes": 4},
    "script": {"command": ["python", "fit_script.py"], "hparams_as_flags": True, "checkpoint_every_steps": 10},
}


def _script(make_spec: Callable[..., Path], run_id: str, *command: str) -> Path:
    return make_spec(run_id, train=None, script={"command": ["python", "outcomes.py", *command]})


def test_fit_script_with_the_helper_reports_and_checkpoints(make_spec: Callable[..., Path]) -> None:
    run = run_agent(make_spec("fit-script", **FIT))
    assert run.process.returncode == 0, run.output
    status = run.status()
    total = EPOCHS * STEPS_PER_EPOCH
    assert status["exit_class"] == "succeeded"
    assert (status["step"], status["total_steps"], status["last_checkpoint_step"]) == (total, total, total)
    assert [e["step"] for e in status["evals"]] == [STEPS_PER_EPOCH * (n + 1) for n in range(EPOCHS)]
    assert status["metrics"]["eval"]["accuracy"] >= 0.9 and "loss" in status["metrics"]["train"]
    logs = run.logs()
    assert "| finished at step 60" in logs and "fit_script.py --classes=4 --epochs=3" in logs


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
    assert done["resumed_from_step"] == cut and done["step"] == EPOCHS * STEPS_PER_EPOCH
    assert f"resumed from {run.run_dir / 'ckpt' / f'ckpt-{cut}'} at step {cut}" in resumed.logs()
    reader = tf.train.load_checkpoint(str(run.run_dir / "ckpt" / f"ckpt-{EPOCHS * STEPS_PER_EPOCH}"))
    assert reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE") == EPOCHS * STEPS_PER_EPOCH


@pytest.mark.parametrize(
    ("mode", "code", "exit_class", "message"),
    [
        ("usage", 3, "user-error", "the script exited with code 2 (a usage error): not retried"),
        ("crash", 1, "crashed", "the script exited with code 1"),
        ("talk", 0, "succeeded", None),
    ],
)
def test_exit_codes_become_exit_classes(
    make_spec: Callable[..., Path], mode: str, code: int, exit_class: str, message: str
) -> None:
    run = run_agent(_script(make_spec, f"outcome-{mode}", mode))
    assert run.process.returncode == code, run.output
    status = run.status()
    assert status["exit_class"] == exit_class
    assert message is None or message in status["message"]
    if mode == "crash":
        assert "| RuntimeError: the script crashed on purpose" in run.logs()
    if mode == "talk":
        assert status["step"] == 5, "without the reporter every printed line is progress"


def test_a_script_missing_from_the_bundle_is_a_user_error(make_spec: Callable[..., Path]) -> None:
    run = run_agent(make_spec("no-script", train=None, script={"command": ["python", "absent.py"]}))
    assert run.process.returncode == 3
    assert "absent.py is not in the bundle's experiments directory" in run.status()["message"]


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

