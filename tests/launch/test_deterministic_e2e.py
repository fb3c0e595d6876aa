"""A user's deterministic mistake costs one node, and a run that diverges is no success: end to end on the emulator.

``tpuops train`` with real TF 2.9 on the emulated VM, the default ``max_restarts``:

- a compiled model with ``loss="no_such_loss"`` (Keras resolves it only when the step is traced)
  ends user-error after one node: the emulator's billing record holds exactly one node of the run,
  and the controller's memory holds no restart; the reason is Keras' own line, not "in user code:";
- a model whose loss turns NaN ends "diverged" (exit 1, not 0), naming the step and the last good
  checkpoint, after one node; ``runs --json`` stays strict JSON with the NaN metrics as null.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import TfWorld, small_digits, start_cli, tf_world

from tpuops.emulator.control import AdminClient, EmulatorInfo

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

BROKEN = '''
import tensorflow as tf
from models import digits_cnn


def unknown_loss(hparams):
    model = digits_cnn(hparams)
    model.compile(optimizer="adam", loss="no_such_loss")
    return model


class NanAfter(tf.keras.layers.Layer):
    def __init__(self, after):
        super().__init__()
        self.after = after
        self.passes = tf.Variable(0, dtype=tf.int64, trainable=False)

    def call(self, inputs, training=None):
        if not training:
            return inputs
        return inputs * tf.where(self.passes.assign_add(1) > self.after, float("nan"), 1.0)


def diverging(hparams):
    return tf.keras.Sequential([digits_cnn(hparams), NanAfter(int(hparams["nan_after"]))])
'''
NAN_AFTER = 30  # the loss is NaN from step 31; checkpoints every 20 steps (small_digits)


def _broken(source: str) -> dict[str, str]:
    text = small_digits(source, steps=60)
    files = {"broken.py": BROKEN}
    for name, model in (("unknown_loss", "broken:unknown_loss"), ("diverging", "broken:diverging")):
        files[f"{name}.yaml"] = text.replace("model: models:digits_cnn", f"model: {model}").replace(
            "  dense: 64\n", f"  dense: 64\n  nan_after: {NAN_AFTER}\n")
    return files


world = tf_world("deterministic", _broken, grace_s=2.0)


def _tpuops(work: Path, info: EmulatorInfo, *args: str) -> subprocess.Popen[str]:
    return start_cli(work, info, *args)


def _memory(work: Path, run: str) -> dict:
    return json.loads((work / "home" / "store" / "runs" / run / "memory.json").read_text())


def _strict(text: str) -> object:
    def refuse(constant: str) -> object:
        raise AssertionError(f"{constant} in --json output")

    return json.loads(text, parse_constant=refuse)


def test_an_unknown_loss_costs_one_node_and_a_nan_run_ends_diverged(world: TfWorld) -> None:
    work, info = world.work, world.info
    procs = {run: _tpuops(work, info, "train", str(work / "experiments" / f"{run.replace('-', '_')}.yaml"),
                          "--name", run, "--json")
             for run in ("unknown-loss", "diverging")}
    results = {}
    for run, proc in procs.items():
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 1, (run, out, err)
        results[run] = _strict(out)
        assert f"run {run} ended" in err.strip().splitlines()[-1]

    lost = results["unknown-loss"]
    assert (lost["exit_class"], lost["attempts"], lost["restarts"]) == ("user-error", 1, 0), lost
    assert "ValueError: Unknown loss function: no_such_loss" in lost["message"]
    assert "in user code" not in lost["message"]

    diverged = results["diverging"]
    assert (diverged["exit_class"], diverged["attempts"], diverged["restarts"]) == ("diverged", 1, 0), diverged
    assert diverged["message"] == (f"training diverged: the training loss was NaN or infinite at step {NAN_AFTER + 1}"
                                   "; last good checkpoint: step 20 (ckpt-20)")
    assert diverged["target_met"] is None
    assert diverged["metrics"]["train"]["loss"] is None and "loss" in diverged["metrics"]["train"]["non_finite"]

    billed = AdminClient(info.endpoint).billing()
    for run in procs:
        assert len({i["node_uid"] for i in billed if i["node"].endswith(f"/nodes/{run}")}) == 1, run
        assert not {"crash", "hang"} & {e["kind"] for e in _memory(work, run)["events"]}

    for _ in range(2):  # every call after a NaN run, not only the first
        listing = _tpuops(work, info, "runs", "--json")
        out, err = listing.communicate(timeout=120)
        assert listing.returncode == 0, err
        shown = {r["run_id"]: r for r in _strict(out)["runs"]}  # type: ignore[index]
        assert (shown["diverging"]["outcome"], shown["unknown-loss"]["outcome"]) == ("diverged", "user-error")
