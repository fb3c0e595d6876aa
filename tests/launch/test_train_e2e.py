"""``tpuops train`` end to end: the CLI, the emulator, the startup script, the bundle, real TF 2.9.

One uninterrupted run is the reference; runs preempted mid-training (SIGTERM: checkpoint on
notice; SIGKILL: the last periodic checkpoint) and resumed with ``--resume`` must end with
bit-identical weights and prove by their status that they resumed rather than restarted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import (
    COMPARE_CHECKPOINTS,
    REPO,
    TF_PYTHON,
    TfWorld,
    poll,
    run_dir,
    run_status,
    start_cli,
    tf_world,
)

from tpuops.data.samples import digits
from tpuops.emulator.control import AdminClient, EmulatorInfo

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

SPEC = REPO / "experiments" / "digits_cnn.yaml"
ZONE = "us-central1-a"



def _digits_data(work: Path) -> str:
    """The digits data only: the runs use the repository's own experiment (``SPEC``)."""
    digits(work / "data" / "digits")
    return ""


world = tf_world("train", layout=_digits_data)



def _tpuops(work: Path, info: EmulatorInfo, *args: str) -> subprocess.Popen[str]:
    return start_cli(work, info, *args)


def _finish(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _nodes(info: EmulatorInfo) -> list[dict]:
    return AdminClient(info.endpoint).nodes()


def _same_weights(work: Path, left: str, right: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TF_PYTHON), "-c", COMPARE_CHECKPOINTS, str(run_dir(work, left) / "ckpt" / "ckpt-600"),
                           str(run_dir(work, right) / "ckpt" / "ckpt-600")], capture_output=True, text=True,
                          check=False)


@pytest.fixture(scope="module")
def reference(world: TfWorld) -> str:
    work, info = world.work, world.info
    code, out, err = _finish(_tpuops(work, info, "train", str(SPEC), "--name", "ref", "--json"))
    assert code == 0, err
    result = json.loads(out)
    assert result["exit_class"] == "succeeded" and result["step"] == 600
    return "ref"


def test_train_completes_with_target_accuracy_and_no_node_left(world: TfWorld,
                                                               reference: str) -> None:
    work, info = world.work, world.info
    status = run_status(work, reference)
    assert status["exit_class"] == "succeeded"
    assert status["metrics"]["eval"]["accuracy"] >= 0.95
    ckpt = run_dir(work, reference) / "ckpt"
    assert (ckpt / "ckpt-600.index").exists() and (ckpt / "checkpoint").exists()
    assert (run_dir(work, reference) / "model" / "saved_model.pb").exists()
    assert [n for n in _nodes(info) if n.get("name", "").endswith("/ref")] == []
    spec = json.loads((run_dir(work, reference) / "spec.json").read_text())
    record = json.loads((run_dir(work, reference) / "run.json").read_text())
    bundle = work / "home" / "store" / "bundles" / f"{record['bundle_sha256']}.tar.gz"
    assert bundle.exists() and spec["run_id"] == "ref"
    code, out, err = _finish(_tpuops(work, info, "runs", "--json"))
    assert code == 0, err
    [listed] = [run for run in json.loads(out)["runs"] if run["run_id"] == reference]
    split = _assert_split(listed["goodput"], attempts=1)
    assert split["lost_s"] == 0 and split["recomputed_s"] == 0


def _assert_split(split: dict, attempts: int) -> dict:
    """A finished run's goodput: every billed second named, the emulator's boot delay seen as boot."""
    parts = ("boot_s", "setup_s", "productive_s", "recomputed_s", "checkpoint_s", "eval_s", "save_s",
             "idle_after_end_s", "unaccounted_s")
    assert split["attempts"] == attempts
    assert sum(split[name] for name in parts) == pytest.approx(split["billed_s"], abs=0.01)
    assert 0 < split["productive_s"] < split["billed_s"] and split["goodput"] > 0
    assert split["setup_s"] > 0 and split["checkpoint_s"] > 0 and split["eval_s"] > 0 and split["save_s"] > 0
    assert abs(split["unaccounted_s"]) < 0.25 * split["billed_s"], split
    return split


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_preempted_run_recovers_by_itself_to_identical_weights(world: TfWorld, reference: str,
                                                               how: str) -> None:
    """The train command is the run's controller: it recreates the node and the agent resumes."""
    work, info = world.work, world.info
    run = f"cut-{how}"
    admin = AdminClient(info.endpoint)
    proc = _tpuops(work, info, "train", str(SPEC), "--name", run, "--json")
    poll(lambda: (run_status(work, run).get("last_checkpoint_step") or 0) >= 200, "a checkpoint at step >= 200",
         timeout_s=180)
    seen = run_status(work, run)["step"]
    if how == "sigkill":
        node = next(n for n in _nodes(info) if n["name"].endswith(f"/{run}"))
        os.killpg(node["pgid"], signal.SIGKILL)
        saved = run_status(work, run)["last_checkpoint_step"]
    admin.preempt("tpuops-local", ZONE, run, grace_s=20.0 if how == "sigterm" else 0.0)
    code, out, err = _finish(proc)
    assert code == 0, err
    result = json.loads(out)
    assert (result["exit_class"], result["step"], result["preemptions"], result["attempts"]) == \
           ("succeeded", 600, 1, 2)
    assert _assert_split(result["goodput"], attempts=2)["lost_s"] > 0
    done = run_status(work, run)
    assert done["attempt"] == 2
    if how == "sigterm":
        assert seen <= done["resumed_from_step"] < 600  # checkpointed on the notice, past what we saw
    else:
        assert done["resumed_from_step"] == saved  # the last periodic checkpoint
    compared = _same_weights(work, reference, run)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert [n for n in _nodes(info) if n.get("name", "").endswith(f"/{run}")] == []
    control = json.loads((run_dir(work, run) / "memory.json").read_text())
    assert [e["kind"] for e in control["events"] if e["kind"] in ("create", "preempted", "vanished", "finished")] \
        == ["create", "preempted", "create", "finished"]


def test_bad_experiment_spec_is_one_line_with_a_hint(world: TfWorld, tmp_path: Path) -> None:
    work, info = world.work, world.info
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.read_text().replace("checkpoint:", "check_point:"))
    code, _, err = _finish(_tpuops(work, info, "train", str(bad), "--name", "bad-1"))
    assert code == 2
    assert err.strip().splitlines()[-1] == f"error: {bad}: unknown key 'check_point' (did you mean 'checkpoint'?)"
    assert not run_dir(work, "bad-1").exists()


def test_failing_model_ends_user_error_with_traceback_and_no_node(world: TfWorld,
                                                                   tmp_path: Path) -> None:
    work, info = world.work, world.info
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "models.py").write_text(
        "def broken(hparams):\n    raise RuntimeError('the model code is wrong on purpose')\n")
    spec = experiments / "broken.yaml"
    spec.write_text(SPEC.read_text().replace("models:digits_cnn", "models:broken").replace(
        "name: digits-cnn", "name: broken"))
    code, _, err = _finish(_tpuops(work, info, "train", str(spec), "--name", "broken-1"))
    assert code == 1
    assert "run broken-1 ended user-error" in err.splitlines()[-1]
    control = json.loads((run_dir(work, "broken-1") / "memory.json").read_text())
    assert control["attempts"] == 1 and control["outcome"] == "user-error"
    status = run_status(work, "broken-1")
    assert status["exit_class"] == "user-error"
    assert "the model code is wrong on purpose" in status["traceback"]
    assert [n for n in _nodes(info) if n.get("name", "").endswith("/broken-1")] == []


def test_infer_writes_sharded_predictions_and_a_manifest(world: TfWorld, reference: str) -> None:
    work, info = world.work, world.info
    code, out, err = _finish(_tpuops(work, info, "infer", str(SPEC), "--checkpoint", reference, "--input",
                                     "data/digits/test", "--shards", "2", "--name", "pred-1", "--json"))
    assert code == 0, err
    assert json.loads(out)["metrics"]["predicted"] == 360
    predictions = run_dir(work, "pred-1") / "predictions"
    manifest = json.loads((predictions / "manifest.json").read_text())
    shards = sorted(predictions.glob("predictions-*.jsonl"))
    assert len(shards) == 2
    lines = [json.loads(line) for shard in shards for line in shard.read_text().splitlines()]
    assert len(lines) == 360
    assert sum(shard["count"] for shard in manifest["shards"]) == manifest["total"] == 360
    assert all(len(line["output"]) == 10 for line in lines)
    assert [n for n in _nodes(info) if n.get("name", "").endswith("/pred-1")] == []
