"""Start, find and stop a background emulator, and talk to its admin API.

One state directory holds one emulator: ``emulator.json`` ({pid, endpoint, auth}) says
which process serves it, ``emulator.log`` gets its output, ``token`` (mode 0600) holds the
bearer token every request must carry unless it was started with ``auth=False``, and the
sandboxes, ``billing.json`` and ``process_groups.json`` live beside them; with buckets to serve
(a ``gs://`` store) so do fake-gcs-server's ``gcs.json``, its objects and the CA (``gcs.storage``). The emulator runs
in its own session so it outlives the command that started it; ``stop`` ends it and every
process group it started, even when the emulator itself has to be killed.

Clients that know only an endpoint (``tpuops.session.connect`` for the Cloud TPU provider,
``AdminClient``) find its token through a
per-user index (``index_dir()``, mode 0700: one file per port naming the state directory,
never the token itself), so the token stays in the one file under ``$TPUOPS_HOME``.

The CLI (``tpuops emulator ...``) and the test fixtures are thin layers over this module.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import tpuops
from tpuops.core import errors
from tpuops.emulator.fsutil import read_json, write_json_atomic
from tpuops.emulator.vm.sandbox import kill_registered_groups

if TYPE_CHECKING:
    from tpuops.emulator.gcs.storage import StorageFront

INFO_FILE = "emulator.json"
LOG_FILE = "emulator.log"
TOKEN_FILE = "token"
_LISTENING = re.compile(rb"tpuops emulator listening on (http://127\.0\.0\.1:\d+)")
_POLL_S = 0.05
# Emulators started by this process, so that their exit can be reaped (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass
class EmulatorInfo:
    """A running emulator: where it listens, its pid and its state directory."""

    endpoint: str
    pid: int
    state_dir: Path
    token: str | None = None
    """The bearer token requests need; None when the emulator runs with --no-auth."""

    @property
    def storage_endpoint(self) -> str | None:
        """Where the fake-gcs-server it runs for a ``gs://`` store listens (None: it serves no storage)."""
        return storage_endpoint(self.state_dir)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) emulator process."""
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z" and b"tpuops.emulator" in cmdline


def status(state_dir: Path) -> EmulatorInfo | None:
    """The emulator serving ``state_dir``, or None; a record left by a dead one is removed."""
    state_dir = Path(state_dir).absolute()
    record = read_json(state_dir / INFO_FILE, None)
    if not isinstance(record, dict) or "pid" not in record or "endpoint" not in record:
        return None
    if not _alive(int(record["pid"])):
        (state_dir / INFO_FILE).unlink(missing_ok=True)
        return None
    token = read_token(state_dir) if record.get("auth", True) else None
    return EmulatorInfo(endpoint=record["endpoint"], pid=int(record["pid"]), state_dir=state_dir, token=token)


def read_token(state_dir: Path) -> str | None:
    """The token in ``state_dir``, if the file exists, is ours and nobody else may read it."""
    path = Path(state_dir) / TOKEN_FILE
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _write_token(state_dir: Path) -> Path:
    path = state_dir / TOKEN_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_urlsafe(32))
    return path


def index_dir() -> Path:
    """The per-user directory mapping emulator ports to state directories (mode 0700)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"tpuops-emulators-{os.getuid()}"


def _index(endpoint: str, state_dir: Path) -> None:
    directory = index_dir()
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid() or directory.stat().st_mode & 0o077:
        return
    write_json_atomic(directory / f"{urlsplit(endpoint).port}.json", {"state_dir": str(state_dir)})


def token_for(endpoint: str) -> str | None:
    """The token of the emulator serving ``endpoint`` on this machine, if this user started it."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        return None
    directory = index_dir()
    try:
        if directory.stat().st_uid != os.getuid() or directory.stat().st_mode & 0o077:
            return None
    except OSError:
        return None
    record = read_json(directory / f"{parts.port}.json", None)
    if not isinstance(record, dict) or "state_dir" not in record:
        return None
    running = read_json(Path(record["state_dir"]) / INFO_FILE, None)
    if not isinstance(running, dict) or running.get("endpoint") != endpoint.rstrip("/"):
        return None
    return read_token(Path(record["state_dir"]))


def start_background(
    state_dir: Path,
    port: int = 0,
    *,
    boot_delay_s: float = 1.0,
    grace_s: float = 30.0,
    image_python: str | None = None,
    timeout_s: float = 30.0,
    auth: bool = True,
    gcs_buckets: list[str] | None = None,
) -> EmulatorInfo:
    """Start an emulator for ``state_dir`` in its own session and wait until it answers.

    With ``auth`` (the default) a fresh token is written to ``state_dir/token`` (0600) and
    every request must carry it; ``auth=False`` serves anyone (for third-party clients).
    ``gcs_buckets``: also serve these buckets through fake-gcs-server, to the nodes as
    storage.googleapis.com (``storage_endpoint`` then gives the control plane's endpoint).

    Raises:
        UsageError: the port is in use, or an emulator already serves ``state_dir``.
        Timeout: it did not answer within ``timeout_s`` (it is then stopped).
        TpuopsError: it exited at start for another reason (see ``emulator.log``).
    """
    state_dir = Path(state_dir).absolute()
    state_dir.mkdir(parents=True, exist_ok=True)
    running = status(state_dir)
    if running is not None:
        raise errors.UsageError(f"an emulator already serves {state_dir} at {running.endpoint} (pid {running.pid})")
    command = [sys.executable, "-m", "tpuops.emulator", "serve", "--port", str(port), "--state-dir", str(state_dir)]
    command += ["--boot-delay", str(boot_delay_s), "--grace", str(grace_s)]
    if image_python:
        command += ["--image-python", str(image_python)]
    for bucket in gcs_buckets or []:
        command += ["--gcs-bucket", bucket]
    token_path = state_dir / TOKEN_FILE
    if auth:
        command += ["--token-file", str(_write_token(state_dir))]
    else:
        token_path.unlink(missing_ok=True)
    # The package must import in the child even when tpuops is not installed (a checkout).
    package_root = str(Path(tpuops.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    log_path = state_dir / LOG_FILE
    with open(log_path, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    _CHILDREN[proc.pid] = proc
    try:
        endpoint = _wait_listening(proc, log_path, offset, port, time.monotonic() + timeout_s)
        token = read_token(state_dir) if auth else None
        AdminClient(endpoint, token=token).wait_healthy(time.monotonic() + timeout_s)
    except BaseException:
        _terminate(proc.pid, timeout_s=5.0)
        kill_registered_groups(state_dir)
        raise
    write_json_atomic(state_dir / INFO_FILE, {"pid": proc.pid, "endpoint": endpoint, "auth": auth})
    _index(endpoint, state_dir)
    return EmulatorInfo(endpoint=endpoint, pid=proc.pid, state_dir=state_dir, token=token)


def _wait_listening(proc: subprocess.Popen[bytes], log_path: Path, offset: int, port: int, deadline: float) -> str:
    while True:
        with open(log_path, "rb") as log:
            log.seek(offset)
            output = log.read()
        found = _LISTENING.search(output)
        if found:
            return found.group(1).decode()
        code = proc.poll()
        if code is not None:
            last = (output.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            if code == 2:
                raise errors.UsageError(f"the emulator cannot listen on 127.0.0.1:{port}: {last}")
            raise errors.TpuopsError(f"the emulator exited at start with code {code}: {last} (see {log_path})")
        if time.monotonic() > deadline:
            raise errors.Timeout(f"the emulator did not start listening in time (see {log_path})")
        time.sleep(_POLL_S)


def ensure_running(state_dir: Path, **start_kwargs: Any) -> EmulatorInfo:
    """The emulator serving ``state_dir``, started with ``start_kwargs`` if none runs."""
    return status(state_dir) or start_background(state_dir, **start_kwargs)


def stop(state_dir: Path, timeout_s: float = 15.0) -> bool:
    """Stop the emulator of ``state_dir`` and every process it started.

    SIGTERM lets it end its process groups itself; if it has not exited within
    ``timeout_s`` it is killed and the groups it listed are killed from here.
    Returns True if anything was running.
    """
    state_dir = Path(state_dir).absolute()
    info = status(state_dir)
    stopped = False
    if info is not None:
        _terminate(info.pid, timeout_s)
        stopped = True
    stopped = kill_registered_groups(state_dir) or stopped
    from tpuops.emulator.gcs import storage  # lazily: its certificates need cryptography, only a gs:// store does

    stopped = storage.stop(state_dir) or stopped
    (state_dir / INFO_FILE).unlink(missing_ok=True)
    return stopped


def storage_front(state_dir: Path) -> StorageFront | None:
    """What the emulator of ``state_dir`` recorded of the Cloud Storage it serves (None: it serves none).

    The front's process may have died since; ``storage_problem`` follows the path a node takes.
    """
    from tpuops.emulator.gcs.storage import read_front  # lazily: its certificates need cryptography

    return read_front(state_dir)


def storage_endpoint(state_dir: Path) -> str | None:
    """The control plane's endpoint of the fake-gcs-server that the emulator of ``state_dir`` runs, if any."""
    front = storage_front(state_dir)
    return front.http_endpoint if front is not None else None


def served_buckets(state_dir: Path) -> list[str]:
    """The buckets the fake-gcs-server of the emulator of ``state_dir`` was started with (none: no storage)."""
    front = storage_front(state_dir)
    return list(front.buckets) if front is not None else []


def storage_problem(state_dir: Path, bucket: str, token: str | None) -> str | None:
    """What breaks an emulated node's path to ``bucket`` (one line), or None when a node would reach it.

    ``token``: the emulator's own (None when it runs without auth); see ``gcs.storage.chain_problem``.
    """
    from tpuops.emulator.gcs.storage import chain_problem

    return chain_problem(state_dir, bucket, token)


def _terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM ``pid``, wait up to ``timeout_s``, then SIGKILL; reap it if it is our child."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if not _alive(pid):
            break
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        child.wait(timeout=5.0)


def check_faults(changes: dict[str, Any]) -> None:
    """Refuse (``InvalidRequest``) what the emulator's admin API would refuse, without a server.

    The rules are the emulator's own (``faults.check_changes``, which the server runs on every
    request): checked here too so that a bad value gets the server's one line before anything is reached.
    """
    from tpuops.emulator.apierror import ApiError
    from tpuops.emulator.faults import check_changes

    try:
        check_changes(changes)
    except ApiError as err:
        raise errors.InvalidRequest(err.message) from None


class AdminClient:
    """The emulator's admin API (``/_admin``), with the standard library only.

    Errors: InvalidRequest (400), NotFound (404), PermissionDenied (401: no or a wrong token),
    TransientError (unreachable), TpuopsError (anything else). Without ``token`` it uses the
    one ``token_for(endpoint)`` finds.
    """

    def __init__(self, endpoint: str, timeout_s: float = 10.0, token: str | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._timeout_s = timeout_s
        self._token = token or token_for(self.endpoint)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(f"{self.endpoint}/_admin/{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            message = _error_message(err)
            if err.code == 400:
                raise errors.InvalidRequest(message) from err
            if err.code == 404:
                raise errors.NotFound(message) from err
            if err.code == 401:
                raise errors.PermissionDenied(message) from err
            raise errors.TpuopsError(f"emulator admin {method} {path} failed ({err.code}): {message}") from err
        except (urllib.error.URLError, OSError) as err:
            raise errors.TransientError(f"the emulator at {self.endpoint} is not reachable: {err}") from err

    def health(self) -> dict[str, Any]:
        return self._call("GET", "health")

    def wait_healthy(self, deadline: float) -> None:
        """Poll ``health`` until it answers. Raises Timeout at ``deadline``."""
        while True:
            try:
                self.health()
                return
            except errors.TransientError as err:
                if time.monotonic() > deadline:
                    raise errors.Timeout(f"the emulator at {self.endpoint} did not become healthy: {err}") from err
            time.sleep(_POLL_S)

    def nodes(self) -> list[dict[str, Any]]:
        """What the emulator knows about each node: state, sandbox, metadata host, pgid, scripts."""
        return self._call("GET", "nodes")["nodes"]

    def preempt(self, project: str, zone: str, node: str, grace_s: float | None = None) -> dict[str, Any]:
        """Preempt a READY spot/preemptible node; returns the node (v2 JSON)."""
        body: dict[str, Any] = {"project": project, "zone": zone, "node": node}
        if grace_s is not None:
            body["grace_s"] = grace_s
        return self._call("POST", "preempt", body)

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Set the given fault keys (others unchanged); returns the faults in force.

        Raises:
            InvalidRequest: a value the emulator refuses (``check_faults``).
        """
        check_faults(faults)
        return self._call("POST", "faults", faults)["faults"]

    def clear_faults(self) -> dict[str, Any]:
        """Remove every fault; returns the faults in force (none)."""
        return self._call("DELETE", "faults")["faults"]

    def billing(self) -> list[dict[str, Any]]:
        """Every READY interval of every node (the billing truth)."""
        return self._call("GET", "billing")["intervals"]

    def stats(self) -> dict[str, int]:
        """API request counts by RPC name."""
        return self._call("GET", "stats")["counts"]

    def reset_stats(self) -> None:
        self._call("POST", "stats/reset", {})

    def shutdown(self) -> None:
        """Ask the emulator to stop (it ends every process it started on the way out)."""
        self._call("POST", "shutdown", {})


def _error_message(err: urllib.error.HTTPError) -> str:
    try:
        return json.loads(err.read())["error"]["message"]
    except (ValueError, KeyError, TypeError, OSError):
        return str(err)
