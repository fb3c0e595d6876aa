"""A slice's profile window against real TensorFlow 2.9 profiler services (the emulator's TPU runtime stand-in, two
workers, no training): every worker is asked at once, what each answers is recorded, and the files land in one
session folder. ``tests/runs/test_profile_e2e.py`` profiles real training on the emulator's slice.
"""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest
from tpuops.agent import profiles
from tpuops.contract.profiles import FAILED, PROFILES, RECORD, REQUEST

pytestmark = pytest.mark.tf

STAND_IN = Path(__file__).resolve().parents[2] / "tpuops" / "emulator" / "vm" / "tpu_runtime.py"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serving(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def workers() -> Iterator[Tuple[str, ...]]:
    addresses = tuple(f"127.0.0.1:{_free_port()}" for _ in range(2))
    servers = [subprocess.Popen([sys.executable, str(STAND_IN), ",".join(addresses), str(index)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for index in range(2)]
    try:
        deadline = time.monotonic() + 300
        while not all(map(_serving, addresses)):
            assert time.monotonic() < deadline, "the runtime stand-ins did not serve"
            assert all(server.poll() is None for server in servers), "a runtime stand-in exited"
            time.sleep(0.2)
        yield addresses
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=60)


def test_idle_workers_are_each_asked_and_their_empty_traces_recorded_as_a_failure(
        tmp_path: Path, workers: Tuple[str, ...]) -> None:
    """Nothing computes on the workers, so neither trace has an event: the capture is a failed record naming each
    worker's answer (the run would go on), and both workers' files are in one session folder. An hour asked for
    10 steps before the end of a run at 10 ms a step is traced the shortest time, not an hour the run's end would
    wait for."""
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / REQUEST).write_text(json.dumps({"id": "p1", "seconds": 3600}))
    profiler = profiles.Profiler(str(run_dir), 1, 3600.0, workers=workers, total_steps=20)
    profiler.start()
    profiler.boundary(10, 10, 0.1)
    capture = profiler.capture
    assert capture is not None and capture.thread is not None, "the request was taken at the boundary"
    assert capture.duration_ms == profiles.MIN_TRACE_MS
    capture.thread.join(timeout=300)
    assert not capture.thread.is_alive()
    profiler.boundary(20, 10, 0.1)
    record = json.loads((run_dir / PROFILES / "1-step10" / RECORD).read_text())
    assert (record["request"], record["state"], record["first_step"]) == ("p1", FAILED, 10)
    assert all(f"grpc://{address}:" in record["reason"] for address in workers), record["reason"]
    sessions = list((run_dir / PROFILES / "1-step10" / "plugins" / "profile").iterdir())
    assert len(sessions) == 1 and len(list(sessions[0].glob("*.xplane.pb"))) == 2
    assert profiler.capture is None and "p1" in profiler.answered
    profiler.close()


def test_traces_of_one_window_started_across_a_second_are_gathered_into_one_session(tmp_path: Path) -> None:
    root = tmp_path / "plugins" / "profile"
    for session, host in (("2026_12_07_07_03_44", "w0"), ("2026_12_07_07_03_45", "w1"), ("2026_12_07_07_03_45",
                                                                                          "w2")):
        (root / session).mkdir(parents=True, exist_ok=True)
        (root / session / f"{host}.xplane.pb").write_bytes(host.encode())
    profiles._one_session(str(tmp_path))
    assert [p.name for p in root.iterdir()] == ["2026_12_07_07_03_44"]
    assert sorted((p.name, p.read_bytes()) for p in (root / "2026_12_07_07_03_44").iterdir()) == [
        ("w0.xplane.pb", b"w0"), ("w1.xplane.pb", b"w1"), ("w2.xplane.pb", b"w2")]
