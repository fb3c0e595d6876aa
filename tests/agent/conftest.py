"""Fixtures of the agent tests: dataset, user code, spec factory and the shared reference run.

One uninterrupted reference run is shared by every test that compares weights.
"""

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from lanes import pytest_collection_modifyitems  # noqa: F401  (every test has a lane)

from agentrun import (
    CHECKPOINT_EVERY,
    CLASSES,
    EVAL_EXAMPLES,
    FEATURES,
    TOTAL_STEPS,
    TRAIN_EXAMPLES,
    USER_CODE,
    AgentRun,
    blobs,
    run_agent,
    write_records,
)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(7)
    centers = rng.normal(scale=2.0, size=(CLASSES, FEATURES))
    x, y = blobs(rng, TRAIN_EXAMPLES, centers)
    for shard in range(3):
        part = slice(shard * 200, (shard + 1) * 200)
        write_records(directory / f"train-{shard:05d}.tfrecord", x[part], y[part])
    x, y = blobs(rng, EVAL_EXAMPLES, centers)
    write_records(directory / "eval-00000.tfrecord", x, y)
    np.savez(directory / "eval.npz", x=x, y=y)
    return directory


@pytest.fixture(scope="session")
def make_spec(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Write a run spec for a fresh run under a session store; keyword overrides are merged in."""
    store = tmp_path_factory.mktemp("store")

    def make(run_id: str, **overrides: Any) -> Path:
        spec = {
            "version": 1,
            "run_id": run_id,
            "store_root": str(store),
            "entry_point": "testmodels:slow_mlp",
            "experiments_dir": str(USER_CODE),
            "hparams": {
                "optimizer": "adam",
                "learning_rate": 0.01,
                "hidden": 16,
                "features": FEATURES,
                "classes": CLASSES,
            },
            "seed": 3,
            "allow_cpu_fallback": True,
            "heartbeat_seconds": 1,
            "dataset": {
                "features": {"x": {"dtype": "float32", "shape": [FEATURES]}, "label": {"dtype": "int64"}},
                "label": "label",
                "train": [str(data_dir / "train-*.tfrecord")],
                "eval": [str(data_dir / "eval-*.tfrecord")],
                "shuffle_buffer": 64,
            },
            "train": {
                "per_replica_batch_size": 32,
                "steps": TOTAL_STEPS,
                "steps_per_call": 7,
                "checkpoint_every_steps": CHECKPOINT_EVERY,
                "checkpoint_every_seconds": 0,
                "keep_checkpoints": 3,
            },
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = dict(spec[key], **value)
            else:
                spec[key] = value
        path = store / "specs" / (run_id + ".json")
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(spec))
        return path

    return make


@pytest.fixture(scope="session")
def reference_run(make_spec: Callable[..., Path]) -> AgentRun:
    """An uninterrupted run of the standard spec, shared by the tests that compare weights."""
    run = run_agent(make_spec("reference"))
    assert run.process.returncode == 0, run.output
    return run
