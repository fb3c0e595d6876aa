"""Helpers of the agent tests: the test dataset and models, and driving the agent as a subprocess.

The agent runs as a real subprocess (``python -m tpuops.agent``) exactly as on a VM, with the
store root a temporary directory.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
# The in-process tests import tpuops.agent from the checkout, as the VM does from the bundle
# (the TF venv does not install tpuops: its package metadata needs Python >= 3.10).
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
FEATURES = 12
CLASSES = 4
TRAIN_EXAMPLES = 600  # 3 shards of 200; an epoch is 18.75 batches of 32, so batches straddle epochs
EVAL_EXAMPLES = 150  # not a multiple of the batch: the padded last batch must count right
TOTAL_STEPS = 120
CHECKPOINT_EVERY = 30
RUN_TIMEOUT_S = 180

USER_CODE = Path(__file__).resolve().parent / "usercode"


def write_records(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    with tf.io.TFRecordWriter(str(path)) as out:
        for features, label in zip(x, y):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=features.tolist())),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                    }
                )
            )
            out.write(example.SerializeToString())


def blobs(rng: np.random.Generator, count: int, centers: np.ndarray) -> Any:
    """An easy task: Gaussian blobs around one centre per class."""
    labels = rng.integers(0, CLASSES, size=count)
    points = centers[labels] + rng.normal(scale=0.6, size=(count, FEATURES))
    return points.astype(np.float32), labels


class AgentRun:
    """One agent subprocess and the files of its run."""

    def __init__(self, spec_path: Path, command: str = "train", env: Optional[Dict[str, str]] = None) -> None:
        spec = json.loads(spec_path.read_text())
        self.run_dir = Path(spec["store_root"]) / "runs" / spec["run_id"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(EXPERIMENTS)]), TF_CPP_MIN_LOG_LEVEL="2",
                   **(env or {}))
        env.pop("GCE_METADATA_HOST", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tpuops.agent", command, str(spec_path)],
            env=env,
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output = ""

    def wait(self) -> int:
        out, _ = self.process.communicate(timeout=RUN_TIMEOUT_S)
        self.output = out.decode("utf-8", "replace")
        return self.process.returncode

    def status(self) -> Dict[str, Any]:
        return json.loads((self.run_dir / "status.json").read_text())

    def logs(self) -> str:
        return "".join(path.read_text() for path in sorted((self.run_dir / "logs").glob("*.log")))

    def checkpoint_steps(self) -> List[int]:
        return sorted(int(p.name[len("ckpt-") : -len(".index")]) for p in (self.run_dir / "ckpt").glob("ckpt-*.index"))

    def wait_for_checkpoint(self, at_least: int) -> int:
        """Poll until a checkpoint at step >= ``at_least`` exists; returns its step."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            steps = [s for s in self.checkpoint_steps() if s >= at_least] if (self.run_dir / "ckpt").is_dir() else []
            if steps:
                return steps[-1]
            assert self.process.poll() is None, "agent exited early:\n" + self.process.communicate()[0].decode()
            time.sleep(0.02)
        raise AssertionError(f"no checkpoint at step >= {at_least} in time")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)


def run_agent(spec_path: Path, command: str = "train", env: Optional[Dict[str, str]] = None) -> AgentRun:
    """Run the agent to its end; returns the finished run (exit code in ``.process.returncode``).

    ``env``: variables added to the agent's environment (``TPUOPS_CPU_REPLICAS``: the host's replicas).
    """
    run = AgentRun(spec_path, command, env)
    run.wait()
    return run


def final_tensors(run_dir: Path, step: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Every tensor of the run's checkpoint at ``step`` (default: the newest), by name.

    Left out: the object graph, and ``save_counter``, the count of saves tf.train.Checkpoint
    keeps for itself, which a preempted run legitimately has more of.
    """
    steps = sorted(int(p.name[len("ckpt-") : -len(".index")]) for p in (run_dir / "ckpt").glob("ckpt-*.index"))
    reader = tf.train.load_checkpoint(str(run_dir / "ckpt" / f"ckpt-{step or steps[-1]}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name not in ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    }


def assert_identical(left: Dict[str, np.ndarray], right: Dict[str, np.ndarray]) -> None:
    assert sorted(left) == sorted(right)
    different = [name for name in left if not np.array_equal(left[name], right[name])]
    assert not different, f"tensors differ: {different}"
    assert any("optimizer" in name for name in left), "optimizer slots must be compared too"
