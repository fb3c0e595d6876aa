"""A slice worker's log shipper (``templates/ship_log.py``), run as the startup script runs it: ``python3 -c``.

It ships what the log gained, whole lines only, as chunks the control plane's reader (``runs.LogTail``) reads in
order; its last ship happens on SIGTERM (a preemption, a stop, a delete), so no line written before the signal
is lost; a later boot's shipper never writes over an earlier one's chunks. Against a local store and a
fake-gcs-server bucket (the JSON API's media upload, as on a TPU VM).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest_gcs import fake_gcs, gcs_bucket  # noqa: F401  (fixtures: fake-gcs-server for the gs:// case)
from helpers import poll

from tpuops.core.resources import template_text
from tpuops.runs.layout import logs_prefix
from tpuops.runs.ops import LogTail
from tpuops.store import LocalStore, Store, open_store

RUN = "r1"


class Worker:
    """One worker's log file and its shipper processes (one per boot)."""

    def __init__(self, log: Path, logs_uri: str, env: dict[str, str] | None = None) -> None:
        self.log, self.logs_uri, self.env = log, logs_uri, env
        self.shippers: list[subprocess.Popen[str]] = []

    def boot(self) -> subprocess.Popen[str]:
        """A boot's shipper, from where the log ends as the boot begins (the startup script's LOG_START_BYTES)."""
        start = self.log.stat().st_size if self.log.exists() else 0
        shipper = subprocess.Popen([sys.executable, "-c", template_text("ship_log.py"), str(self.log), self.logs_uri,
                                    "0.1", str(start)], env=self.env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
        self.shippers.append(shipper)
        return shipper

    def write(self, text: str) -> None:
        with open(self.log, "a") as out:
            out.write(text)

    def stop(self, shipper: subprocess.Popen[str]) -> None:
        poll(lambda: _catches_sigterm(shipper.pid), "the shipper's SIGTERM handler")
        shipper.send_signal(signal.SIGTERM)
        _, err = shipper.communicate(timeout=30)
        assert shipper.returncode == 0, err

    def close(self) -> None:
        for shipper in self.shippers:
            if shipper.poll() is None:
                shipper.kill()
                shipper.communicate()


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (``SigCgt`` in /proc: Python installs it as it starts)."""
    caught = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def _all_lines(store: Store, worker: int) -> list[str]:
    return LogTail(store, RUN, worker).new_lines()


def _drive(worker: Worker, store: Store) -> None:
    first = worker.boot()
    worker.write("boot 1 line 1\nboot 1 line 2\nhalf a li")
    poll(lambda: _all_lines(store, 2) == ["boot 1 line 1", "boot 1 line 2"], "the whole lines, shipped on the timer")
    worker.write("ne\nthe last line before the signal\n")
    worker.stop(first)  # at once: the last line goes with the ship that SIGTERM asks for, not with a tick
    after_first = sorted(o.key for o in store.list(logs_prefix(RUN, 2)))
    second = worker.boot()  # the same log file, as a rebooted VM (or an emulator's recreated node) keeps it
    worker.write("boot 2 line 1\n")
    worker.stop(second)
    assert _all_lines(store, 2) == ["boot 1 line 1", "boot 1 line 2", "half a line", "the last line before the signal",
                                    "boot 2 line 1"]
    keys = sorted(o.key for o in store.list(logs_prefix(RUN, 2)))
    assert keys[:len(after_first)] == after_first, "the second boot's chunks come after the first's, none replaced"
    assert all(key.endswith(".log") for key in keys) and _all_lines(store, 0) == []


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[Worker, Store]]:
    store = LocalStore(tmp_path / "store")
    worker = Worker(tmp_path / "startup.log", f"{tmp_path / 'store'}/runs/{RUN}/logs/w2")
    yield worker, store
    worker.close()


@pytest.mark.unit
def test_a_worker_ships_whole_lines_on_a_timer_and_its_last_lines_on_sigterm(local: tuple[Worker, Store]) -> None:
    worker, store = local
    _drive(worker, store)


@pytest.mark.unit
def test_a_shipper_with_nothing_logged_ships_nothing_and_stops_cleanly(local: tuple[Worker, Store]) -> None:
    worker, store = local
    worker.stop(worker.boot())
    assert list(store.list(logs_prefix(RUN, 2))) == []


@pytest.mark.emulator
def test_a_worker_ships_to_a_bucket_through_the_json_api(tmp_path: Path, fake_gcs, gcs_bucket: str) -> None:  # noqa: F811
    import os

    env = {**os.environ, "STORAGE_EMULATOR_HOST": fake_gcs.endpoint}
    worker = Worker(tmp_path / "startup.log", f"gs://{gcs_bucket}/root/runs/{RUN}/logs/w2", env)
    try:
        _drive(worker, open_store(f"gs://{gcs_bucket}/root", gcs_endpoint=fake_gcs.endpoint))
    finally:
        worker.close()
