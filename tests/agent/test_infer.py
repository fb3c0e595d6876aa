"""``infer`` writes sharded JSON Lines and a manifest that agree with Keras' own predictions, and resumes.

The resume tests run ``infer.run`` in this process with a notice that arrives before a chosen
prediction call, so that the interruption falls at the same place every time.
"""

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import tensorflow as tf
from tpuops.agent import infer
from tpuops.agent.infer import format_lines, shard_name
from tpuops.agent.paths import RunPaths
from tpuops.agent.preemption import PreemptionNotice
from tpuops.agent.runtime import Runtime
from tpuops.agent.status import Status
from tpuops.contract.exits import PreemptedExit, UserError
from tpuops.contract.runspec import parse_spec

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


class _NoticeAtCall(PreemptionNotice):
    """A preemption notice that arrives just before the ``at``-th prediction call (counted from 1)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.checks = 0
        self._at = at

    def requested(self) -> bool:
        self.checks += 1
        if self.checks == self._at:
            self.trigger("test notice")
        return super().requested()


def _infer_in_process(spec_path: Path, notice: PreemptionNotice) -> None:
    spec = parse_spec(spec_path.read_text())
    runtime = Runtime(tf.distribute.get_strategy(), "CPU", True)
    paths = RunPaths(spec.store_root, spec.run_id)
    tf.io.gfile.makedirs(paths.run_dir)
    infer.run(spec, runtime, Status(paths.status, spec.run_id, "infer", 1), notice, paths)


def _files(prefix: Path) -> Dict[str, bytes]:
    return {path.name: path.read_bytes() for path in prefix.iterdir() if path.name != "manifest.json"}


def _infer_spec(make_spec: Callable[..., Path], run_id: str, model: Path, data_dir: Path, prefix: Path, **infer: Any):
    settings = {"input": [str(data_dir / "eval-*.tfrecord")], "model": str(model), "output_prefix": str(prefix)}
    return make_spec(run_id, infer=dict(settings, **infer))


def test_resume_after_a_notice_redoes_no_written_shard(
    make_spec: Callable[..., Path], reference_run: AgentRun, data_dir: Path, tmp_path: Path
) -> None:
    model = reference_run.run_dir / "model"
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    settings = {"num_shards": 3, "batch_size": 32}  # 150 examples: 5 batches, shards of 1, 2 and 2 batches
    _infer_in_process(_infer_spec(make_spec, "infer-whole", model, data_dir, whole, **settings), PreemptionNotice())

    spec = _infer_spec(make_spec, "infer-resumed", model, data_dir, resumed, **settings)
    with pytest.raises(PreemptedExit):
        _infer_in_process(spec, _NoticeAtCall(3))  # calls: shard 0, shard 1, then the notice
    assert sorted(_files(resumed)) == ["plan.json", shard_name(0, 3), shard_name(1, 3)], "no temporary file is left"
    assert not (resumed / "manifest.json").exists()
    kept = {name: (resumed / name).stat() for name in (shard_name(0, 3), shard_name(1, 3))}

    notice = _NoticeAtCall(0)
    _infer_in_process(spec, notice)
    assert notice.checks == 1, "only the missing shard is predicted: one call"
    for name, before in kept.items():
        after = (resumed / name).stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), f"{name} was rewritten"
    assert _files(resumed) == _files(whole)
    manifest = json.loads((resumed / "manifest.json").read_text())
    assert [shard["count"] for shard in manifest["shards"]] == [32, 64, 54]
    assert _read_shards(resumed, manifest) == _read_shards(whole, json.loads((whole / "manifest.json").read_text()))


def test_latency_mode_reads_ahead_and_resumes_to_the_same_shards(
    make_spec: Callable[..., Path], reference_run: AgentRun, data_dir: Path, tmp_path: Path
) -> None:
    """Latency mode, its input read ahead from the first missing shard on, writes what the batched mode writes."""
    model = reference_run.run_dir / "model"
    batched, latency = tmp_path / "batched", tmp_path / "latency"
    settings = {"num_shards": 3, "batch_size": 32}  # 5 batches: shards of 1, 2 and 2 batches
    _infer_in_process(_infer_spec(make_spec, "infer-batched", model, data_dir, batched, **settings), PreemptionNotice())
    spec = _infer_spec(make_spec, "infer-latency", model, data_dir, latency, latency=True, **settings)
    with pytest.raises(PreemptedExit):
        _infer_in_process(spec, _NoticeAtCall(2))  # one batch per call: shard 0, then the notice
    assert sorted(_files(latency)) == ["plan.json", shard_name(0, 3)]
    notice = _NoticeAtCall(0)
    _infer_in_process(spec, notice)
    assert notice.checks == 4, "the 4 batches left, one call each"
    assert _files(latency) == _files(batched)


def test_a_different_job_in_the_same_prefix_reuses_nothing(
    make_spec: Callable[..., Path], reference_run: AgentRun, data_dir: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "out"
    model = reference_run.run_dir / "model"
    spec = _infer_spec(make_spec, "infer-first", model, data_dir, prefix, num_shards=2, batch_size=32)
    with pytest.raises(PreemptedExit):
        _infer_in_process(spec, _NoticeAtCall(2))
    assert (prefix / shard_name(0, 2)).exists()

    spec = _infer_spec(make_spec, "infer-second", model, data_dir, prefix, num_shards=2, batch_size=50)
    notice = _NoticeAtCall(0)
    _infer_in_process(spec, notice)
    assert notice.checks == 2, "the other job's shard is predicted again"
    manifest = json.loads((prefix / "manifest.json").read_text())
    assert [shard["count"] for shard in manifest["shards"]] == [50, 100]
    assert sorted(p.name for p in prefix.glob("predictions-*")) == [shard_name(0, 2), shard_name(1, 2)]
    assert json.loads((prefix / "plan.json").read_text())["batch_size"] == 50


def test_shards_of_an_agent_that_wrote_other_text_are_not_kept(
    make_spec: Callable[..., Path], reference_run: AgentRun, data_dir: Path, tmp_path: Path
) -> None:
    """A finished shard whose plan.json has no ``text`` (an older agent: float64 reprs, NaN) is predicted again."""
    prefix = tmp_path / "out"
    spec = _infer_spec(make_spec, "infer-old", reference_run.run_dir / "model", data_dir, prefix, num_shards=2,
                       batch_size=32)
    with pytest.raises(PreemptedExit):
        _infer_in_process(spec, _NoticeAtCall(2))
    plan = json.loads((prefix / "plan.json").read_text())
    assert plan.pop("text") == infer.TEXT
    (prefix / "plan.json").write_text(json.dumps(plan))

    notice = _NoticeAtCall(0)
    _infer_in_process(spec, notice)
    assert notice.checks == 2, "the older agent's shard is predicted again"
    assert json.loads((prefix / "plan.json").read_text())["text"] == infer.TEXT


@pytest.mark.parametrize(
    "rows",
    [
        np.array([[0.1, 1.0, 0.0], [1e-7, 3.4e38, -2.5]], dtype=np.float32),
        np.array([[np.nan, np.inf, -np.inf]], dtype=np.float32),
        np.array([0.25, 1.0], dtype=np.float32),
        np.arange(8, dtype=np.float32).reshape(2, 2, 2),
        np.zeros((2, 0), dtype=np.float32),
        np.zeros((0, 4), dtype=np.float32),
        np.random.default_rng(0).standard_normal((64, 10)).astype(np.float32)[:, ::2],
    ],
)
def test_format_lines_reads_back_as_the_same_float32s(rows: np.ndarray) -> None:
    """A line per row, numbered; every float reads back as the same float32, NaN and infinities as null."""
    lines = format_lines(7, rows).splitlines()
    assert [json.loads(line)["index"] for line in lines] == list(range(7, 7 + len(rows)))
    for line, row in zip(lines, rows):
        output = json.loads(line)["output"]
        finite = np.isfinite(row)
        as_read = np.array(output, dtype=object).reshape(row.shape)
        assert all(value is None for value in as_read[~finite])
        np.testing.assert_array_equal(as_read[finite].astype(np.float32), row[finite])


def test_format_lines_writes_the_shortest_float32_text() -> None:
    rows = np.array([[0.1, 1.0, -2.5e-8]], dtype=np.float32)
    assert format_lines(0, rows) == b'{"index": 0, "output": [0.1,1.0,-2.5e-8]}\n'


def test_the_latency_writer_runs_at_idle_priority(tmp_path: Path) -> None:
    """Latency mode's writer thread takes only the CPU the model leaves idle; the batched one keeps its priority."""
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("this platform has no SCHED_IDLE: the writer keeps its priority")
    seen: List[int] = []

    def probe() -> None:
        infer.yield_cpu()
        seen.append(os.sched_getscheduler(0))

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    if seen != [os.SCHED_IDLE]:
        pytest.skip("this system refuses SCHED_IDLE (a seccomp profile?): the writer keeps its priority")
    policies = {}
    for idle in (True, False):
        prefix = tmp_path / str(idle)
        prefix.mkdir()
        writer = infer.ShardWriter(str(prefix), idle=idle)
        writer.open("shard.jsonl")  # once its file exists, the thread is past choosing its priority
        deadline = time.monotonic() + 30
        while not list(prefix.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.01)
        policies[idle] = os.sched_getscheduler(writer._thread.native_id)
        writer.close()
    assert policies == {True: os.SCHED_IDLE, False: os.SCHED_OTHER}


@pytest.mark.parametrize(
    ("batch", "latency", "per_call"), [(64, True, [1] * 5), (256, True, [1, 1]), (64, False, [5]), (8, False, [38])]
)
def test_latency_mode_hands_each_batch_to_the_writer_alone(
    tmp_path: Path, batch: int, latency: bool, per_call: List[int]
) -> None:
    """Latency mode: every call predicts one batch, whose rows are queued before the next call; else many per call."""
    total = 300
    plan = {"inputs": [], "total": total, "model": {"source": "test"}, "batch_size": batch, "num_shards": 1}
    outputs = infer.Outputs(str(tmp_path), plan)
    outputs.adopt()
    asked: List[int] = []

    def predict(steps: int) -> np.ndarray:
        asked.append(steps)
        first = sum(asked[:-1]) * batch
        return np.arange(first, first + steps * batch, dtype=np.float32).reshape(-1, 1)

    infer.predict_shards(predict, outputs, 0, PreemptionNotice(), latency=latency)
    assert asked == per_call
    lines = (tmp_path / shard_name(0, 1)).read_text().splitlines()
    assert [json.loads(line)["output"] for line in lines] == [[float(i)] for i in range(total)]


def test_latency_predictor_gives_the_batched_outputs_one_batch_per_call() -> None:
    """The latency call predicts the batches in order, from the iterator or preloaded, as the multi-batch call does."""
    model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,))])
    images = np.arange(7 * 5 * 4, dtype=np.float32).reshape(7 * 5, 4)

    def batches() -> Any:
        return iter(tf.data.Dataset.from_tensor_slices((images,)).batch(5, drop_remainder=True))

    strategy = tf.distribute.get_strategy()
    batched = infer.batched_predictor(infer.predict_call(model, strategy, jit_compile=False), batches())(7)
    latency = infer.latency_predictor(model, strategy, False, batches())
    one_by_one = np.concatenate([latency(1).numpy() for _ in range(7)])
    np.testing.assert_array_equal(one_by_one, batched.numpy())
    np.testing.assert_allclose(one_by_one, model(images).numpy(), rtol=1e-6)
    preloaded = infer.latency_predictor(model, strategy, False, infer.preload(batches(), 7), preloaded=True)
    np.testing.assert_array_equal(np.concatenate([preloaded(1).numpy() for _ in range(7)]), one_by_one)
    compiled = infer.latency_predictor(model, strategy, True, infer.preload(batches(), 7), preloaded=True)
    np.testing.assert_allclose(np.concatenate([compiled(1).numpy() for _ in range(7)]), one_by_one, rtol=1e-5)


def test_preload_reads_ahead_only_what_fits() -> None:
    """The batches left, one per batch, from where the iterator stands; None (nothing read) when over the limit."""
    images = np.arange(6 * 2 * 3, dtype=np.float32).reshape(6 * 2, 3)
    iterator = iter(tf.data.Dataset.from_tensor_slices((images, np.ones(12, np.float32))).batch(2, drop_remainder=True))
    next(iterator)
    batch_bytes = 2 * 3 * 4
    assert infer.preload(iterator, 5, limit=5 * batch_bytes - 1) is None
    preloaded = infer.preload(iterator, 5, limit=5 * batch_bytes)
    np.testing.assert_array_equal(np.stack(preloaded), images[2:].reshape(5, 2, 3))
    unknown_size = iter(tf.data.Dataset.from_tensor_slices((images,)).batch(2))
    assert infer.preload(unknown_size, 6, limit=1 << 30) is None


def test_infer_without_orjson_is_a_user_error_saying_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "orjson", None)  # what "import orjson" meets where it is not installed
    with pytest.raises(UserError, match=r"orjson.*PyPI"):
        infer.require_orjson()
