"""Bring-your-own-code end to end: ``tpuops train`` on the emulator with real TF 2.9, one preemption each.

- ``article_cnn``: the article's model.fit script in script mode with the helper callbacks,
  preempted twice, finishes all its epochs at exactly epochs x steps_per_epoch steps;
- ``diabetes_regression`` (a compiled model, custom loss and metrics) and ``text_classifier``
  (its own input_fn over variable-length tokens), preempted once, finish and meet their targets;
  the regression run ends with weights bit-identical to an uninterrupted one;
- script outcomes through the controller: a crash is retried per max_restarts, exit 2 is a user
  error (one attempt), a silent hang is restarted;
- bad user code fails before any node exists, in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    COMPARE_CHECKPOINTS,
    REPO,
    TF_PYTHON,
    TfWorld,
    example_datasets,
    poll,
    spec_variant,
    tf_world,
)

from tpuops.emulator.control import AdminClient, EmulatorInfo

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

ZONE = "us-central1-a"
ARTICLE_EPOCHS, ARTICLE_STEPS_PER_EPOCH = 3, 300


OUTCOMES = """
import os, sys, time
mode = sys.argv[1]
print("attempt", os.environ["TPUOPS_ATTEMPT"], mode, flush=True)
if mode == "usage":
    sys.exit(2)
if mode == "crash":
    raise RuntimeError("crashing on purpose")
if mode == "hang" and os.environ["TPUOPS_ATTEMPT"] == "1":
    time.sleep(3600)
"""


def _examples(work: Path) -> str:
    """A copy of experiments/ and the three datasets."""
    shutil.copytree(REPO / "experiments", work / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    example_datasets(work / "data")
    return ""


world = tf_world("usercode", lambda _: {"outcomes.py": OUTCOMES}, layout=_examples)


def _tpuops(work: Path, info: EmulatorInfo, *args: str, **settings: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    config = work / "tpuops.toml"
    config.write_text('zones = ["us-central1-a", "us-central1-b"]\n')
    env.update({"TPUOPS_HOME": str(work / "home"), "TPUOPS_CONFIG": str(config), "TPUOPS_TPU_ENDPOINT": info.endpoint,
                "TPUOPS_POLL_INTERVAL_S": "0.2", **{f"TPUOPS_{k.upper()}": v for k, v in settings.items()}})
    return subprocess.Popen([sys.executable, "-m", "tpuops", *args], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, json.loads(out) if out.strip() else {}, err


def _run_dir(work: Path, run: str) -> Path:
    return work / "home" / "store" / "runs" / run


def _status(work: Path, run: str) -> dict:
    path = _run_dir(work, run) / "status.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _checkpointed(work: Path, run: str, attempt: int, past: int) -> bool:
    status = _status(work, run)
    return status.get("attempt") == attempt and (status.get("last_checkpoint_step") or 0) >= past


def test_article_cnn_script_preempted_twice_finishes_all_its_epochs(world: TfWorld) -> None:
    work, info = world.work, world.info
    spec = spec_variant(work, "article_cnn", "article_test", {
        "epochs: 6": f"epochs: {ARTICLE_EPOCHS}", "batch_size: 64": "batch_size: 16",
        "  pixel_max: 16": f"  pixel_max: 16\n  steps_per_epoch: {ARTICLE_STEPS_PER_EPOCH}",
        "every_steps: 50": "every_steps: 100"})
    admin = AdminClient(info.endpoint)
    proc = _tpuops(work, info, "train", str(spec), "--name", "article", "--json")
    cuts = []
    for attempt in (1, 2):
        floor = (cuts[-1] if cuts else 0) + 100
        poll(lambda attempt=attempt, floor=floor: _checkpointed(work, "article", attempt, floor),
             f"attempt {attempt} checkpointing past step {floor}", timeout_s=180)
        admin.preempt("tpuops-local", ZONE, "article", grace_s=20.0)
        poll(lambda attempt=attempt: _status(work, "article").get("exit_class") == "preempted"
             and _status(work, "article").get("attempt") == attempt, f"attempt {attempt} preempted", timeout_s=60)
        cuts.append(_status(work, "article")["last_checkpoint_step"])
    code, result, err = _finish(proc)
    total = ARTICLE_EPOCHS * ARTICLE_STEPS_PER_EPOCH
    assert code == 0, err
    assert (result["exit_class"], result["step"], result["preemptions"], result["attempts"]) == \
        ("succeeded", total, 2, 3)
    status = _status(work, "article")
    assert status["resumed_from_step"] == cuts[1] and cuts[0] < cuts[1] < total
    steps = [e["step"] for e in status["evals"]]  # epoch ends, shifted by each mid-epoch resume
    assert steps == sorted(set(steps)) and steps[-1] == total and len(steps) >= 2
    assert result["target_met"] is True  # sparse_categorical_accuracy >= 0.8 on the digits
    logs = "".join(p.read_text() for p in sorted((_run_dir(work, "article") / "logs").glob("*.log")))
    assert f"| Epoch {ARTICLE_EPOCHS}/{ARTICLE_EPOCHS}" in logs
    assert f"| finished {ARTICLE_EPOCHS} epochs at step {total}" in logs
    assert "| no TPU: training on the CPU, as this run allows" in logs


def test_preempted_examples_finish_and_the_compiled_model_resumes_bit_identically(
        world: TfWorld) -> None:
    """The regression (compiled) and text (input_fn) runs preempted once, next to an uninterrupted regression run.

    The three runs go at once (their boot, import and polling overlap); the text example's
    bit-identity across a resume is the agent suite's input_fn test.
    """
    work, info = world.work, world.info
    runs = {"regression-ref": "diabetes_regression", "regression-cut": "diabetes_regression",
            "text-cut": "text_classifier"}
    procs = {run: _tpuops(work, info, "train", str(work / "experiments" / f"{example}.yaml"), "--name", run, "--json")
             for run, example in runs.items()}
    every = {"regression-cut": 50, "text-cut": 100}
    for run, step in every.items():
        poll(lambda run=run, step=step: _checkpointed(work, run, 1, step), f"{run}: a checkpoint at step >= {step}",
             timeout_s=180)
        AdminClient(info.endpoint).preempt("tpuops-local", ZONE, run, grace_s=20.0)
    results = {}
    for run, proc in procs.items():
        code, results[run], err = _finish(proc)
        assert code == 0, err
        assert (results[run]["exit_class"], results[run]["step"], results[run]["target_met"]) == \
            ("succeeded", 300, True), results[run]
    for run, step in every.items():
        status = _status(work, run)
        assert results[run]["preemptions"] == 1 and status["attempt"] == 2
        assert step <= status["resumed_from_step"] < 300
        assert [e["step"] for e in status["evals"]] == [100, 200, 300], "evals carry over across attempts"
    assert set(_status(work, "regression-cut")["metrics"]["eval"]) >= {"mae", "root_mean_squared_error",
                                                                       "within_10pct"}
    prefixes = [str(_run_dir(work, run) / "ckpt" / "ckpt-300") for run in ("regression-ref", "regression-cut")]
    compared = subprocess.run([str(TF_PYTHON), "-c", COMPARE_CHECKPOINTS, *prefixes], capture_output=True, text=True,
                              check=False)
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_script_outcomes_through_the_controller(world: TfWorld) -> None:
    """A crash is retried per max_restarts, exit 2 is a user error (one attempt), a silent hang is restarted."""
    work, info = world.work, world.info
    expected = {"crash": ("crashed", 2, "crash"), "usage": ("user-error", 1, None), "hang": ("succeeded", 2, "hang")}
    procs = {}
    for mode in expected:
        spec = work / "experiments" / f"outcome_{mode}.yaml"
        spec.write_text(f"name: outcome-{mode}\ncommand: [python, outcomes.py, {mode}]\n"
                        "dataset: {train: data/digits/train}\naccelerator: v3-8\ncapacity: spot\n")
        procs[mode] = _tpuops(work, info, "train", str(spec), "--name", f"outcome-{mode}", "--json",
                              max_restarts="1", hang_after_s="8")
    for mode, (outcome, attempts, event) in expected.items():
        code, result, err = _finish(procs[mode], timeout=240)
        assert result["exit_class"] == outcome and result["attempts"] == attempts, (result, err)
        control = json.loads((_run_dir(work, f"outcome-{mode}") / "memory.json").read_text())
        kinds = [e["kind"] for e in control["events"]]
        assert (event in kinds) if event else not {"crash", "hang"} & set(kinds)
        assert (code == 0) == (outcome == "succeeded")
    assert "the script exited with code 2 (a usage error): not retried" in _status(work, "outcome-usage")["message"]


@pytest.mark.parametrize(("yaml_line", "replacement", "message"), [
    ("model: regression:diabetes_mlp", "model: regression:missing_mlp",
     "model regression:missing_mlp: regression.py defines no function 'missing_mlp'"),
    ("input: text_classifier:input_fn", "input: text_classifier:transformer",
     "input text_classifier:transformer: has the signature (hparams); expected input_fn("),
    ("script: article_cnn.py", "script: not_there.py --epochs 1", "command: not_there.py is not in"),
])
def test_bad_user_code_fails_before_any_node_in_one_line(world: TfWorld, yaml_line: str,
                                                         replacement: str, message: str) -> None:
    work, info = world.work, world.info
    key = yaml_line.split(":")[0]
    example = {"model": "diabetes_regression", "input": "text_classifier", "script": "article_cnn"}[key]
    spec = spec_variant(work, example, f"bad_{example}", {yaml_line: replacement})
    code, _, err = _finish(_tpuops(work, info, "train", str(spec), "--name", f"bad-{key}", "--json"))
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last and "Traceback" not in err
    assert not _run_dir(work, f"bad-{key}").exists()
    assert not [n for n in AdminClient(info.endpoint).nodes() if n.get("name", "").endswith(f"/bad-{key}")]


def test_dry_run_says_what_runs_for_each_mode(world: TfWorld, tmp_path: Path) -> None:
    """On a home of its own: the module's ledger holds the other tests' preemptions seconds apart, whose learned
    hazard makes each dry run's forecast spend its whole work budget (tens of seconds) on what this test does not
    read; planning on a learned hazard is ``test_simulate``'s."""
    work, info = world.work, world.info
    shown = {}
    for example in ("article_cnn", "diabetes_regression", "text_classifier"):
        code, plan, err = _finish(_tpuops(work, info, "train", str(work / "experiments" / f"{example}.yaml"),
                                          "--dry-run", "--json", home=str(tmp_path / "home")))
        assert code == 0, err
        shown[example] = plan
    assert shown["article_cnn"]["runs"].startswith("script: python article_cnn.py plus --name=value")
    assert shown["article_cnn"]["spec"]["script"]["command"] == ["python", "article_cnn.py"]
    assert shown["article_cnn"]["spec"]["train"] is None
    assert shown["text_classifier"]["spec"]["input_fn"] == "text_classifier:input_fn"
    assert shown["text_classifier"]["spec"]["dataset"]["features"]["tokens"]["shape"] == [-1]
    assert "its own train_step" in shown["diabetes_regression"]["runs"]
    assert "tpuops/agent/userlib/tpuops_helper.py" in shown["article_cnn"]["bundle"]["files"]
