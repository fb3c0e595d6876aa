"""What an emulated node sees of the network: Google's host names, resolved to the local servers.

On a TPU VM ``storage.googleapis.com``, ``www.googleapis.com`` and ``metadata.google.internal``
(``metadata``) are Google's. An emulated node's processes run in a private mount namespace (``unshare -m``) in
which ``/etc/hosts`` is a bind mount of ``<state-dir>/node-hosts``: the machine's own entries plus
those names sent to the storage front's loopback address, where port 443 is the storage front
(``gcs.front``) and port 80 the metadata door (``metadoor``). Nothing else on the machine sees
that file, so the emulator never changes the host's name resolution.

The node's environment also trusts the emulator's CA (``CURL_CA_BUNDLE`` for TensorFlow's curl,
``SSL_CERT_FILE`` for Python's ``ssl``, ``REQUESTS_CA_BUNDLE`` for requests and pip), through a
bundle that keeps the system's CAs so PyPI stays reachable. The node's programs therefore use
the real URLs and the metadata server's token with no "am I emulated" branch.

``unavailable_reason`` tells in one line why this cannot work here (not root, no ``unshare``, a
kernel or sandbox that refuses mount namespaces); callers then fall back to a local store.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# "metadata" is the short name TensorFlow's own GCS credentials use (a VM resolves it through its search domain).
GOOGLE_HOSTS = ("storage.googleapis.com", "www.googleapis.com", "metadata.google.internal", "metadata")
HOSTS_FILE = "node-hosts"
# $0 is the hosts file, the rest the command: no value is ever pasted into the shell text.
_ENTER = 'mount --bind "$0" /etc/hosts && exec "$@"'


@functools.cache
def unavailable_reason() -> str | None:
    """None when node processes can get a private /etc/hosts here; otherwise why not, in one line (asked once)."""
    if os.geteuid() != 0:
        return "a gs:// store on the local emulator needs root (private mount namespaces for each node)"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "a gs:// store on the local emulator needs unshare and mount (util-linux)"
    with tempfile.NamedTemporaryFile("w", prefix="tpuops-hosts-") as probe:
        probe.write("127.0.0.1 localhost\n")
        probe.flush()
        try:
            result = subprocess.run(enter_command(Path(probe.name), ["true"]), check=False, capture_output=True,
                                    timeout=10)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"a gs:// store on the local emulator needs mount namespaces: {err}"
    if result.returncode != 0:
        detail = (result.stderr.decode(errors="replace").strip().splitlines() or ["refused"])[-1]
        return f"a gs:// store on the local emulator needs mount namespaces (unshare -m: {detail})"
    return None


def enter_command(hosts: Path, command: list[str]) -> list[str]:
    """``command`` run in a new mount namespace whose /etc/hosts is ``hosts``."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _ENTER, str(hosts), *command]


@dataclass(frozen=True)
class NodeNetwork:
    """How every node of one emulator reaches Google's names: the hosts file and the CA bundle."""

    hosts: Path
    ca_bundle: str

    def environment(self) -> dict[str, str]:
        """Variables a node gets so that its TLS clients trust the emulator's CA."""
        return {"CURL_CA_BUNDLE": self.ca_bundle, "SSL_CERT_FILE": self.ca_bundle,
                "REQUESTS_CA_BUNDLE": self.ca_bundle}

    def wrap(self, command: list[str]) -> list[str]:
        return enter_command(self.hosts, command)


def write_hosts(state_dir: Path, address: str, system_hosts: Path = Path("/etc/hosts")) -> Path:
    """``<state-dir>/node-hosts``: the machine's hosts file with Google's names sent to ``address``."""
    try:
        base = system_hosts.read_text()
    except OSError:
        base = "127.0.0.1 localhost\n"
    kept = [line for line in base.splitlines() if not set(line.split()[1:]) & set(GOOGLE_HOSTS)]
    lines = [*kept, f"{address} {' '.join(GOOGLE_HOSTS)}", ""]
    path = Path(state_dir) / HOSTS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)
    return path
