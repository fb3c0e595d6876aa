"""A throwaway PostgreSQL server in a temporary directory, for the database study storage's tests and benchmark.

``LocalPostgres().start()`` runs ``initdb`` and ``postgres`` from the Debian ``postgresql`` package
(``/usr/lib/postgresql/<major>/bin``) on a free loopback port with password (SCRAM) authentication;
``close()`` stops it and removes the directory. ``initdb`` refuses to run as root, so as root both
run as the unprivileged ``postgres`` user (like ``runuser -u postgres``) in a directory it owns.

The password is random, handed to ``initdb`` through a 0600 file, and only ever returned by
``password``: callers pass it to the driver, never in a URL.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from tpuops.core.errors import TpuopsError

USER = "tpuops"


def find_bindir() -> Path | None:
    """The newest installed server's bin directory, None without one."""
    root = Path("/usr/lib/postgresql")
    found = sorted((d for d in root.glob("*/bin") if (d / "initdb").is_file()),
                   key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0) if root.is_dir() else []
    return found[-1] if found else None


_PORT_TRIES = 5


def _ready(pid_file: Path) -> bool:
    try:
        lines = pid_file.read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[7].strip() == "ready"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalPostgres:
    def __init__(self, bindir: Path | None = None) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise TpuopsError("no PostgreSQL server installed (apt-get install postgresql)")
        self.bindir = found
        self.password = secrets.token_urlsafe(24)
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tpuops-pg-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            self._as = {"user": "postgres", "group": "postgres", "extra_groups": []}
            shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o700)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, cwd=self.root,
                              **self._as)
        if done.returncode:
            raise TpuopsError(f"{Path(argv[0]).name} failed: {(done.stderr or done.stdout).strip()[-400:]}")

    def _log(self) -> IO[bytes]:
        log = open(self.root / "server.log", "wb")  # noqa: SIM115 - the server writes to it until it stops
        if self._as:
            shutil.chown(self.root / "server.log", "postgres", "postgres")
        return log

    def start(self, timeout_s: float = 60.0) -> LocalPostgres:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if self._as:
            shutil.chown(pwfile, "postgres", "postgres")
        data = self.root / "data"
        self._run(str(self.bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=scram-sha-256",
                  f"--pwfile={pwfile}", "--no-sync", "-E", "UTF8")
        pwfile.unlink()
        for _ in range(_PORT_TRIES):
            if self._serve(data, timeout_s):
                return self
            self.port = _free_port()  # another server took the port between our look and postgres's bind
        raise TpuopsError(f"postgres found its port taken {_PORT_TRIES} times in a row")

    def _serve(self, data: Path, timeout_s: float) -> bool:
        """Run postgres on ``self.port``: True once it is ready, False when the port was taken meanwhile.

        Ready is what postgres itself writes in its ``postmaster.pid`` once it listens ("ready" on
        the 8th line), not a connection to the port, which another engineer's server on this machine
        could have answered.
        """
        self._proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(data), "-p", str(self.port), "-h", "127.0.0.1",
             "-k", str(self.root), "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=subprocess.DEVNULL, stderr=self._log(), cwd=self.root, **self._as,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = (self.root / "server.log").read_text()
                if "Address already in use" in log:
                    return False
                raise TpuopsError(f"postgres exited: {log[-400:]}")
            if _ready(data / "postmaster.pid"):
                return True
            time.sleep(0.1)
        self.close()
        raise TpuopsError(f"postgres did not listen on port {self.port} within {timeout_s:.0f} s")

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # fast shutdown: disconnect clients, stop
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()
