"""A job on a pod slice, end to end: ``tpuops train`` on an emulated v2-32 (4 workers), real TF 2.9.

Worker 0's agent finds the slice with ``TPUClusterResolver(tpu=TPU_NAME)`` and trains as TensorFlow's single
client of the 4 workers' runtimes (``tpuops/agent/runtime.py``); the other workers run no job.

- Every worker computes: each runtime stand-in logs the CPU seconds it spent serving when the node goes
  (an idle one spends hundredths of a second).
- The slice (4 replicas x 8 records) follows a one-host run (1 replica x 32 records, same seed) within a
  relative 1e-4 on every weight and slot after 20 and 40 steps: the same examples, the same float32 maths,
  only the gradient's summation order differs (4 partial sums of 8 added, against one sum of 32), an error
  of a few float32 ulps per step (~1e-7 relative) which 40 Adam steps do not bring near 1e-4. So does the
  status's training loss, the mean over the same window of steps on both (31-40: the last ``steps_per_call``),
  however often each agent reported (the slower slice reports more windows).
- Preempted mid-training, the slice is recreated by the train command's own watch loop with nobody acting,
  resumes from its checkpoint and ends bit-identical to the uninterrupted slice run; no node is left.
- A user's unmodified script calling ``TPUClusterResolver(tpu=os.environ["TPU_NAME"])`` runs in script mode,
  and a compiled Keras model trains with its own ``train_step``, fed by the agent or by an ``input_fn``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import (
    COMPARE_CHECKPOINTS,
    TF_PYTHON,
    TfWorld,
    poll,
    run_dir,
    run_status,
    small_digits,
    start_cli,
    tf_world,
)

from tpuops.emulator.control import AdminClient, EmulatorInfo

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

ZONE = "us-central1-a"
STEPS = 40

CLOSE = ("1e-4", "1e-6")
"""The slice against one host: every tensor within a relative 1e-4 (and 1e-6 absolute), the order of float sums."""

COMPILED = '''
import tensorflow as tf
from models import digits_cnn


def compiled_cnn(hparams):
    model = digits_cnn(hparams)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


FEATURES = {"image": tf.io.FixedLenFeature([8, 8, 1], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}


def input_fn(file_patterns, batch_size, *, training, seed, input_context):
    records = tf.data.TFRecordDataset(sorted(file_patterns))
    if training:
        records = records.shuffle(2048, seed=seed).repeat()
    parsed = records.map(lambda record: tf.io.parse_single_example(record, FEATURES))
    return parsed.map(lambda example: (example["image"], example["label"])).batch(batch_size, drop_remainder=training)
'''

RESOLVING_SCRIPT = '''
import json, os
import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ["TPU_NAME"])
tf.config.experimental_connect_to_cluster(resolver)
try:
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
except (ValueError, tf.errors.NotFoundError, tf.errors.InvalidArgumentError):
    strategy = tf.distribute.get_strategy()
with tf.io.gfile.GFile(os.path.join(os.environ["TPUOPS_RUN_DIR"], "cluster.json"), "w") as out:
    out.write(json.dumps(resolver.cluster_spec().as_dict()))
print("resolved", resolver.cluster_spec().as_dict(), flush=True)
bare = tf.distribute.cluster_resolver.TPUClusterResolver()  # no argument: TensorFlow reads TPU_NAME itself
with tf.io.gfile.GFile(os.path.join(os.environ["TPUOPS_RUN_DIR"], "bare-cluster.json"), "w") as out:
    out.write(json.dumps(bare.cluster_spec().as_dict()))
'''


def _slice_experiments(source: str) -> dict[str, str]:
    """The digits project with a slice and a one-host experiment of the same global batch, evaluated every 20
    steps (the run's second distributed dataset)."""
    text = small_digits(source, steps=STEPS).replace("target:\n  metric: accuracy\n  at_least: 0.95\n", "")
    sliced = text.replace("per_replica: 32", "per_replica: 8").replace("accelerator: v3-8", "accelerator: v2-32")
    return {
        "slice.yaml": sliced,
        "host.yaml": text,  # a v3-8: one host (us-central1-a offers no v2-8)
        "compiled.py": COMPILED,
        "compiled.yaml": sliced.replace("model: models:digits_cnn", "model: compiled:compiled_cnn")
        .replace(f"steps: {STEPS}", "steps: 20"),
        "fed.yaml": sliced.replace("model: models:digits_cnn", "model: compiled:compiled_cnn\ninput: compiled:input_fn")
        .replace(f"steps: {STEPS}", "steps: 20"),
        "resolve.py": RESOLVING_SCRIPT,
        "script.yaml": "name: resolve\nscript: resolve.py\nsteps: 1\ndataset:\n  train: data/digits/train\n"
                       "  label: label\naccelerator: v2-32\ncapacity: spot\nexpected_hours: 0.01\n",
    }


world = tf_world("slice", _slice_experiments)


def _tpuops(work: Path, info: EmulatorInfo, *args: str) -> subprocess.Popen[str]:
    return start_cli(work, info, *args)


def _train(work: Path, info: EmulatorInfo, spec: str, run: str) -> subprocess.Popen[str]:
    return _tpuops(work, info, "train", f"experiments/{spec}.yaml", "--name", run, "--json")


def _succeeded(proc: subprocess.Popen[str], timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def _worker_dirs(work: Path, run: str) -> list[Path]:
    home = work / "home" / "emulator" / "nodes" / "tpuops-local" / ZONE
    return [home / run, *(home / f"{run}.w{n}" for n in range(1, 4))]


def _compare(work: Path, left: str, right: str, step: int, *tolerance: str) -> subprocess.CompletedProcess[str]:
    """``COMPARE_CHECKPOINTS`` of the two runs' checkpoints at ``step``: bit-identical, or within ``tolerance``."""
    return subprocess.run([str(TF_PYTHON), "-c", COMPARE_CHECKPOINTS,
                           str(run_dir(work, left) / "ckpt" / f"ckpt-{step}"),
                           str(run_dir(work, right) / "ckpt" / f"ckpt-{step}"), *tolerance],
                          capture_output=True, text=True, timeout=300, check=False)


def _nodes_of(info: EmulatorInfo, run: str) -> list[dict]:
    return [n for n in AdminClient(info.endpoint).nodes() if n.get("name", "").endswith(f"/nodes/{run}")]


@pytest.fixture(scope="module")
def reference(world: TfWorld) -> str:
    """An uninterrupted slice run and a one-host run of the same global batch, side by side."""
    work, info = world.work, world.info
    slice_run, host_run = _train(work, info, "slice", "slice"), _train(work, info, "host", "host")
    for proc in (slice_run, host_run):
        assert _succeeded(proc)["step"] == STEPS
    return "slice"


def test_a_slice_trains_on_every_worker_and_follows_one_host(world: TfWorld, reference: str
                                                              ) -> None:
    work, info = world.work, world.info
    workers = _worker_dirs(work, reference)
    agent_log = (workers[0] / "tpuops" / "startup.log").read_text()
    assert "training on the CPUs of its 4 workers" in agent_log and "CPU x4 on 4 host(s)" in agent_log
    for number, home in enumerate(workers):
        runtime_log = (home / "tpu-runtime.log").read_text()
        served = [float(s) for s in re.findall(rf"task {number} stopped; ([0-9.]+) CPU seconds", runtime_log)]
        assert served and served[-1] >= 0.2, f"worker {number}'s runtime did no work: {runtime_log[-500:]}"
        if number:
            startup = (home / "tpuops" / "startup.log").read_text()
            assert f"worker {number}: the job runs on worker 0 only" in startup
            assert "the TPU runtime answers on" in startup and "starting the job" not in startup
    for step in (20, STEPS):
        compared = _compare(work, reference, "host", step, *CLOSE)
        assert compared.returncode == 0, compared.stdout + compared.stderr
    statuses = [run_status(work, run) for run in (reference, "host")]
    trained = [status["metrics"]["train"] for status in statuses]
    assert [(t["first_step"], t["step"]) for t in trained] == [(31, STEPS)] * 2, "the last window of steps_per_call"
    assert trained[0]["loss"] == pytest.approx(trained[1]["loss"], rel=1e-4), "the mean training loss of steps 31-40"
    evals = [[(e["step"], e["metrics"]["loss"]) for e in status["evals"]] for status in statuses]
    assert [step for step, _ in evals[0]] == [20, STEPS], "evaluated on the slice at 20 and 40"
    assert [loss for _, loss in evals[0]] == pytest.approx([loss for _, loss in evals[1]], rel=1e-4)
    billed = AdminClient(info.endpoint).billing()
    assert len({i["node_uid"] for i in billed if i["node"].endswith(f"/nodes/{reference}")}) == 1
    assert _nodes_of(info, reference) == [], "the finished slice is gone"
    deletes = [line for home in workers for line in (home / "tpuops" / "startup.log").read_text().splitlines()
               if "deleted itself" in line or "deleting node" in line]
    assert [line.split("tpuops-startup: ")[1].split(" in ")[0] for line in deletes if "deleting node" in line] == [
        f"deleting node {reference}"], "only worker 0 deletes the slice, once"


def test_a_preempted_slice_recovers_by_itself_bit_identical(world: TfWorld, reference: str
                                                             ) -> None:
    work, info = world.work, world.info
    run = "slice-cut"
    proc = _train(work, info, "slice", run)
    poll(lambda: (run_status(work, run).get("last_checkpoint_step") or 0) >= 20, "a checkpoint at step 20",
         timeout_s=400)
    AdminClient(info.endpoint).preempt("tpuops-local", ZONE, run, grace_s=20.0)
    result = _succeeded(proc, timeout=900)
    assert (result["exit_class"], result["step"], result["preemptions"], result["attempts"]) == \
        ("succeeded", STEPS, 1, 2)
    compared = _compare(work, reference, run, STEPS)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert _nodes_of(info, run) == []


def test_an_unmodified_script_finds_the_slice_with_tpu_name(world: TfWorld) -> None:
    """``TPUClusterResolver(tpu=os.environ["TPU_NAME"])`` and ``TPUClusterResolver()`` both find the 4 workers."""
    work, info = world.work, world.info
    result = _succeeded(_tpuops(work, info, "train", "experiments/script.yaml", "--name", "resolve", "--json"))
    assert result["exit_class"] == "succeeded"
    cluster = json.loads((run_dir(work, "resolve") / "cluster.json").read_text())
    addresses = [home for home in _worker_dirs(work, "resolve")]
    assert len(cluster["worker"]) == len(addresses) == 4
    assert all(endpoint.endswith(":8470") for endpoint in cluster["worker"])
    assert len(set(cluster["worker"])) == 4
    assert json.loads((run_dir(work, "resolve") / "bare-cluster.json").read_text()) == cluster


@pytest.mark.parametrize("spec", ["compiled", "fed"])
def test_a_compiled_keras_model_trains_on_a_slice_fed_by_the_agent_or_an_input_fn(
    world: TfWorld, spec: str,
) -> None:
    """Its own train_step, loss and optimizer, replicated by the slice's strategy over the 4 workers; its
    batches from the agent's pipeline or from the user's ``input_fn``."""
    work, info = world.work, world.info
    result = _succeeded(_train(work, info, spec, spec))
    assert (result["exit_class"], result["step"]) == ("succeeded", 20)
    agent_log = (_worker_dirs(work, spec)[0] / "tpuops" / "startup.log").read_text()
    assert "compiled model: training with its own train_step" in agent_log and "CPU x4 on 4 host(s)" in agent_log
