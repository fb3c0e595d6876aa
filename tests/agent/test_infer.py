"""``infer`` writes sharded JSON Lines and a manifest that agree with Keras' own predictions."""

import json
from pathlib import Path
from typing import Callable, List

import numpy as np
import pytest
import tensorflow as tf

from agentrun import EVAL_EXAMPLES, AgentRun, run_agent

pytestmark = pytest.mark.tf


def _read_shards(prefix: Path, manifest: dict) -> List[dict]:
    rows = []
    for shard in manifest["shards"]:
        lines = (prefix / shard["path"]).read_text().splitlines()
        assert len(lines) == shard["count"]
        rows.extend(json.loads(line) for line in lines)
    return sorted(rows, key=lambda row: row["index"])


@pytest.mark.parametrize("source", ["model", "ckpt"])
def test_infer_writes_shards_and_manifest(
    make_spec: Callable[..., Path], reference_run: AgentRun, data_dir: Path, source: str
) -> None:
    shards = 3 if source == "model" else 1
    prefix = reference_run.run_dir.parent / f"infer-{source}" / "out"
    spec = make_spec(
        f"infer-{source}",
        infer={
            "input": [str(data_dir / "eval-*.tfrecord")],
            "model": str(reference_run.run_dir / source),
            "output_prefix": str(prefix),
            "num_shards": shards,
            "batch_size": 64,
        },
    )
    run = run_agent(spec, command="infer")
    assert run.process.returncode == 0, run.output
    assert run.status()["exit_class"] == "succeeded"

    manifest = json.loads((prefix / "manifest.json").read_text())
    assert manifest["format"] == "jsonl" and manifest["total"] == EVAL_EXAMPLES
    assert [s["path"] for s in manifest["shards"]] == [
        f"predictions-{i:05d}-of-{shards:05d}.jsonl" for i in range(shards)
    ]
    assert sum(s["count"] for s in manifest["shards"]) == EVAL_EXAMPLES
    rows = _read_shards(prefix, manifest)
    assert [row["index"] for row in rows] == list(range(EVAL_EXAMPLES))

    expected = tf.keras.models.load_model(str(reference_run.run_dir / "model"), compile=False).predict(
        np.load(data_dir / "eval.npz")["x"], verbose=0
    )
    predicted = np.array([row["output"] for row in rows], dtype=np.float32)
    np.testing.assert_allclose(predicted, expected, rtol=1e-4, atol=1e-5)
    assert (predicted.argmax(axis=1) == expected.argmax(axis=1)).all()
