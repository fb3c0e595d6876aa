"""The workers of a node: one per host of its slice, each its own "VM" on its own loopback address.

A node of H hosts (``AcceleratorType.hosts``: v2-32, v3-32 and v4-32 have 4) is H workers. Worker N
has its own address, metadata server (``agent-worker-number`` N, ``worker-network-endpoints``,
``tpu-env`` ...), guest attributes, directory, log and process groups: the startup script's and,
on a ``-pod`` runtime, the TPU runtime's (``runtime``). Worker 0 of a single-host node keeps
127.0.0.1, its directory and its log, as before slices existed.

Addresses of multi-host workers are 127.0.X.Y with X >= 1 (127.0.0.* is the storage front's), never
shared between the workers of one emulator and, since port 8470 must be free on them, not in use by
another emulator on the machine when allocated: each emulator starts at a random point of the range
so that two rarely even try the same one.

Health (what ``Node.health`` says) is read from the runtimes: a worker's runtime answers when an
HTTP/2 connection to its address:8470 gets the server's SETTINGS frame, what every gRPC server
sends first. Nothing else is asked of it: the runtime is TensorFlow's own server.
"""

from __future__ import annotations

import logging
import random
import shlex
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tpuops.emulator.vm.metadata import MetadataServer
from tpuops.emulator.vm.sandbox import ScriptRun

log = logging.getLogger(__name__)

TPU_RUNTIME_PORT = 8470
SINGLE_HOST_ADDRESS = "127.0.0.1"
# HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x4


@dataclass
class Worker:
    """One host of a node. ``runtime_up`` is the last probe's answer; ``runtime_seen`` whether it ever answered
    since this boot (a runtime that never answered is booting, one that stopped answering has died)."""

    number: int
    address: str
    hostname: str
    metadata_server: MetadataServer | None = None
    runs: list[ScriptRun] = field(default_factory=list)
    runtime: ScriptRun | None = None
    runtime_up: bool = False
    runtime_seen: bool = False
    never_boots: bool = False

    @property
    def live_pgids(self) -> list[int]:
        """Process groups of this worker in which something may still live (startup script, runtime)."""
        runs = [*self.runs[-1:], *([self.runtime] if self.runtime else [])]
        return [pgid for run in runs if (pgid := run.live_pgid) is not None]

    def endpoint(self) -> str:
        return f"{self.address}:{TPU_RUNTIME_PORT}"


def worker_endpoints(workers: list[Worker], uid: str) -> str:
    """``worker-network-endpoints`` as a TPU VM's metadata has it: ``hostname:uid:ip`` per worker, in order."""
    return ",".join(f"{worker.hostname}:{uid}:{worker.address}" for worker in workers)


def tpu_env(worker: Worker, *, accelerator: str, node_id: str, zone: str, topology: str, runtime_version: str) -> str:
    """``tpu-env``: the YAML of ``KEY: 'value'`` lines a TPU VM's metadata gives each worker.

    Every host of these slices holds 2x2x1 chips; the host bounds are the topology divided by that.
    """
    dims = [int(part) for part in topology.split("x")] + [1] * (3 - len(topology.split("x")))
    hosts = [max(1, size // chips) for size, chips in zip(dims, (2, 2, 1), strict=True)]
    values = {
        "ACCELERATOR_TYPE": accelerator,
        "CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "HOST_BOUNDS": ",".join(map(str, hosts)),
        "NODE_ID": node_id,
        "RUNTIME_VERSION": runtime_version,
        "TOPOLOGY": topology,
        "WORKER_ID": str(worker.number),
        "ZONE": zone,
    }
    return "".join(f"{key}: '{value}'\n" for key, value in values.items())


class AddressPool:
    """Loopback addresses for the workers of multi-host nodes: unique within this emulator, 8470 free when given.

    Thread-safe. ``release`` returns a node's addresses once its processes are gone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._next = random.randrange(1 << 16)

    def allocate(self, count: int) -> list[str]:
        """``count`` addresses 127.0.X.Y (X in 1..255, Y in 1..254) on which port 8470 is free now.

        Raises:
            RuntimeError: no free address left (65 000 workers, or a machine whose 8470 is taken everywhere).
        """
        chosen: list[str] = []
        with self._lock:
            for _ in range(255 * 254):
                index, self._next = self._next, (self._next + 1) % (255 * 254)
                address = f"127.0.{index // 254 + 1}.{index % 254 + 1}"
                if address not in self._held and _port_free(address):
                    chosen.append(address)
                    self._held.add(address)
                    if len(chosen) == count:
                        return chosen
            self._held.difference_update(chosen)
        raise RuntimeError(f"no {count} loopback addresses with port {TPU_RUNTIME_PORT} free")

    def release(self, addresses: list[str]) -> None:
        with self._lock:
            self._held.difference_update(addresses)


def _port_free(address: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, TPU_RUNTIME_PORT))
        except OSError:
            return False
    return True


def runtime_answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether a gRPC (HTTP/2) server answers on ``address``:8470: it sends SETTINGS after our preface."""
    try:
        with socket.create_connection((address, TPU_RUNTIME_PORT), timeout=timeout_s) as conn:
            conn.sendall(_PREFACE)
            header = b""
            while len(header) < 9:
                chunk = conn.recv(9 - len(header))
                if not chunk:
                    return False
                header += chunk
    except OSError:
        return False
    return header[3] == _SETTINGS


class RuntimeImage:
    """What a ``-pod`` image's workers run as their TPU runtime: ``tpu_runtime.py`` under the image's python.

    TensorFlow's server binds the wildcard address, so every runtime gets ``bindaddr.c`` (built once per
    emulator with the C compiler) preloaded to hold only its worker's address. Without an image python
    or a compiler there is no runtime stand-in (``usable`` is False; a failed build is logged once):
    slices then boot without one and a READY slice is HEALTHY, as before workers had runtimes.
    """

    def __init__(self, state_dir: Path, image_python: str | None) -> None:
        self._dir = state_dir / "tpu-runtime"
        self._python = str(Path(image_python).absolute()) if image_python else None
        self._lock = threading.Lock()
        self._shim: Path | None = None
        self._unavailable: str | None = None if image_python else "no image python (--image-python)"

    def usable(self) -> bool:
        """Whether workers can run the runtime stand-in here (builds the shim the first time)."""
        return self._built_shim() is not None

    def script(self, endpoints: list[str], worker: Worker) -> str | None:
        """The bash text that starts worker ``worker``'s runtime in the cluster ``endpoints``, or None."""
        shim = self._built_shim()
        if shim is None or self._python is None:
            return None
        program = Path(__file__).with_name("tpu_runtime.py")
        return (f"export LD_PRELOAD={shlex.quote(str(shim))} TPU_RUNTIME_BIND_ADDRESS={worker.address}\n"
                f"exec {shlex.quote(self._python)} {shlex.quote(str(program))} {','.join(endpoints)} {worker.number}\n")

    def _built_shim(self) -> Path | None:
        with self._lock:
            if self._shim is None and self._unavailable is None:
                self._shim, self._unavailable = self._build()
                if self._unavailable:
                    log.warning("slices boot without a TPU runtime stand-in: %s", self._unavailable)
            return self._shim

    def _build(self) -> tuple[Path | None, str | None]:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            return None, "no C compiler (cc) to build bindaddr.so"
        self._dir.mkdir(parents=True, exist_ok=True)
        target = self._dir / "bindaddr.so"
        source = Path(__file__).with_name("bindaddr.c")
        result = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(target), str(source), "-ldl"],
                                capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            return None, f"building bindaddr.so failed: {result.stderr.strip()[-300:]}"
        return target, None
