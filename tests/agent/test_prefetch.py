"""Prefetching a resumed attempt's spec, status and newest checkpoint while TensorFlow imports.

The gs:// store is fake-gcs-server, started by the control-plane venv (its wrapper package is
not in the TF venv); the downloads go through ``prefetch``'s own JSON API client, and the copy
is restored (or rejected) by the same ``Checkpointer`` the agent uses.
"""

import json
import logging
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator, List

import pytest
import tensorflow as tf
from tpuops.agent import prefetch
from tpuops.agent.checkpoints import Checkpointer
from tpuops.agent.prefetch import Prefetch

from agentrun import REPO

pytestmark = [pytest.mark.tf, pytest.mark.emulator]

CONTROL_PLANE_PYTHON = REPO / ".venv" / "bin" / "python"
BUCKET = "prefetch"
_SERVE = """
import sys
from fake_gcs import FakeGcsServer
with FakeGcsServer() as server:
    server.create_bucket(sys.argv[1])
    print(server.endpoint, flush=True)
    sys.stdin.read()
"""


@pytest.fixture(scope="module")
def gcs_endpoint() -> Iterator[str]:
    assert CONTROL_PLANE_PYTHON.exists(), f"{CONTROL_PLANE_PYTHON} is missing: run 'make setup'"
    server = subprocess.Popen([str(CONTROL_PLANE_PYTHON), "-c", _SERVE, BUCKET], cwd=str(REPO / "tests"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdin is not None
    endpoint = server.stdout.readline().strip()
    assert endpoint.startswith("http://"), "fake-gcs-server did not start"
    yield endpoint
    server.stdin.close()
    server.wait(timeout=30)


def _upload(endpoint: str, name: str, data: bytes) -> None:
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    request = urllib.request.Request(f"{endpoint}/upload/storage/v1/b/{BUCKET}/o?{query}", data=data, method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass


def _save_steps(directory: Path, steps: List[int]) -> None:
    weights = tf.Variable(tf.zeros([64]))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(w=weights), str(directory), max_to_keep=5,
                                         checkpoint_name="ckpt")
    for step in steps:
        weights.assign(tf.fill([64], float(step)))
        manager.save(checkpoint_number=step)


def _checkpointer(directory: Path) -> "tuple[Checkpointer, tf.Variable]":
    weights = tf.Variable(tf.zeros([64]))
    return Checkpointer(tf.train.Checkpoint(w=weights), str(directory), keep=5, every_steps=0, every_seconds=0), weights


@pytest.fixture
def gs_run(gcs_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A run in the fake bucket with a spec, a status and checkpoints at steps 10 and 20; its spec URI."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    monkeypatch.setattr(prefetch, "PREFETCH_ROOT", str(tmp_path / "prefetch"))
    root = f"root-{request.node.name[:40]}"
    spec = {"version": 1, "run_id": "r1", "store_root": f"gs://{BUCKET}/{root}", "entry_point": "m:build",
            "dataset": {"features": {"x": {"dtype": "float32", "shape": [2]}}, "train": ["/data/*"]},
            "train": {"per_replica_batch_size": 8, "steps": 40}}
    _upload(gcs_endpoint, f"{root}/spec.json", json.dumps(spec).encode())
    _upload(gcs_endpoint, f"{root}/runs/r1/status.json", b'{"attempt": 3, "step": 25}')
    _save_steps(tmp_path / "made", [10, 20])
    for path in sorted((tmp_path / "made").iterdir()):
        _upload(gcs_endpoint, f"{root}/runs/r1/ckpt/{path.name}", path.read_bytes())
    return f"gs://{BUCKET}/{root}/spec.json"


def test_gs_checkpoint_is_downloaded_and_restored_from_the_copy(gs_run: str, tmp_path: Path) -> None:
    fetched = Prefetch(gs_run, "train").start()
    spec_text, status_text = fetched.texts()
    assert spec_text is not None and json.loads(spec_text)["run_id"] == "r1"
    assert status_text is not None and json.loads(status_text) == {"attempt": 3, "step": 25}
    found = fetched.newest_checkpoint()
    assert found is not None and found[0] == 20
    copy = Path(found[1]).parent
    assert (copy / "ckpt-20.index").is_file() and not (copy / "ckpt-10.index").exists()
    # The store directory the checkpointer falls back to is empty: step 20 can only come from the copy.
    checkpointer, weights = _checkpointer(tmp_path / "empty-store")
    assert checkpointer.restore_newest(found) == 20
    assert weights.numpy().tolist() == [20.0] * 64
    fetched.discard()
    assert not copy.exists() and fetched.newest_checkpoint() is None


def test_corrupt_copy_is_rejected_and_the_store_is_read_without_deleting_it(
    gs_run: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    found = Prefetch(gs_run, "train").start().newest_checkpoint()
    assert found is not None
    data = next(Path(found[1]).parent.glob("ckpt-20.data-*"))
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    data.write_bytes(bytes(damaged))
    store = tmp_path / "store"
    _save_steps(store, [10, 20])
    checkpointer, weights = _checkpointer(store)
    with caplog.at_level(logging.WARNING, logger="tpuops.agent.checkpoints"):
        assert checkpointer.restore_newest(found) == 20
    assert "prefetched copy" in caplog.text and "unusable" in caplog.text
    assert weights.numpy().tolist() == [20.0] * 64
    assert (store / "ckpt-20.index").is_file(), "a bad copy must not delete the store's checkpoint"


def test_unreachable_store_leaves_every_read_to_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", closed)
    began = time.monotonic()
    fetched = Prefetch("gs://nowhere/root/spec.json", "train").start()
    assert fetched.texts() == (None, None)
    assert fetched.newest_checkpoint() is None
    assert time.monotonic() - began < 10, "a refused connection must not hold the attempt"
    store = tmp_path / "store"
    _save_steps(store, [5])
    checkpointer, weights = _checkpointer(store)
    assert checkpointer.restore_newest(fetched.newest_checkpoint()) == 5
    assert weights.numpy().tolist() == [5.0] * 64


def test_local_store_reads_texts_and_copies_no_checkpoint(tmp_path: Path) -> None:
    spec = {"version": 1, "run_id": "r2", "store_root": str(tmp_path / "store"), "entry_point": "m:build",
            "dataset": {"features": {"x": {"dtype": "float32", "shape": [2]}}, "train": ["/data/*"]},
            "train": {"per_replica_batch_size": 8, "steps": 40}}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    _save_steps(tmp_path / "store" / "runs" / "r2" / "ckpt", [7])
    fetched = Prefetch(str(spec_path), "train").start()
    assert fetched.texts() == (spec_path.read_text(), ""), "a missing status reads as empty: no previous attempt"
    assert fetched.newest_checkpoint() is None, "a local store is read in place"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
