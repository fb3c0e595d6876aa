"""The JSON Lines formatter process gives ``format_lines``' text at a lower priority; its death is reported.

A formatter that dies must fail the job the way a failing store does: the error is raised in the
predicting thread, and no shard is left under its final name or half-written.
"""

import os
import signal
from pathlib import Path
from typing import Iterator, Set

import numpy as np
import pytest
from tpuops.agent import infer
from tpuops.agent.jsonlines import NICE, Formatter, FormatterError, format_lines
from tpuops.agent.preemption import PreemptionNotice

pytestmark = pytest.mark.tf

ROWS = [
    np.array([[0.1, 1.0, 0.0], [1e-7, 3.4e38, -2.5]], dtype=np.float32),
    np.array([[np.nan, np.inf, -np.inf]], dtype=np.float32),
    np.array([0.25, 1.0], dtype=np.float32),
    np.arange(8, dtype=np.float32).reshape(2, 2, 2),
    np.zeros((2, 0), dtype=np.float32),
    np.zeros((0, 4), dtype=np.float32),
    np.random.default_rng(3).random((64, 10)).astype(np.float32)[::2],  # not contiguous
]


@pytest.fixture(scope="module")
def formatter() -> Iterator[Formatter]:
    made = Formatter()
    yield made
    made.close()


def test_the_process_formats_exactly_as_format_lines(formatter: Formatter) -> None:
    for rows in ROWS:
        assert formatter.format(12345678901, rows) == format_lines(12345678901, rows)


def test_the_process_runs_at_a_lower_priority(formatter: Formatter) -> None:
    expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
    formatter.format(0, ROWS[0])  # answered: the child has set its priority before serving
    assert os.getpriority(os.PRIO_PROCESS, formatter.pid) == expected


def test_the_process_outlives_a_sigterm_to_finish_the_queued_shards(formatter: Formatter) -> None:
    formatter.format(0, ROWS[0])  # answered: the child has set its signal handling before serving
    os.kill(formatter.pid, signal.SIGTERM)
    assert formatter.format(5, ROWS[2]) == format_lines(5, ROWS[2])


def _formatter_children() -> Set[int]:
    """The pids of this process's formatter children."""
    pids = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as children:
            pids.update(int(pid) for pid in children.read().split())
    return {pid for pid in pids if b"tpuops.agent.jsonlines" in _command_line(pid)}


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # the child ended since the listing
        return b""


def test_a_dead_formatter_fails_the_job_and_leaves_no_shard(tmp_path: Path) -> None:
    """The formatter is killed at the first call: predict_shards raises its death, the open shard is removed."""
    plan = {"inputs": [], "total": 6, "model": {"source": "test"}, "batch_size": 2, "num_shards": 1}
    outputs = infer.Outputs(str(tmp_path), plan)
    outputs.adopt()
    before = _formatter_children()

    def predict(steps: int) -> np.ndarray:
        for pid in _formatter_children() - before:
            os.kill(pid, signal.SIGKILL)
        return np.ones((2, 3), dtype=np.float32)

    with pytest.raises(FormatterError, match=r"formatter process \(pid \d+\) exited with code -9"):
        infer.predict_shards(predict, outputs, 0, PreemptionNotice(), latency=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["plan.json"]
