"""``http://metadata.google.internal`` (and ``http://metadata``) for emulated nodes: port 80, no secret.

Some clients on a TPU VM cannot be told where the metadata server is: TensorFlow 2.9's own
GCS credentials ask ``http://metadata/computeMetadata/v1/...`` whatever the environment says.
A node's hosts file (``netview``) sends both names to the emulator's storage address, where
this door listens on port 80 and forwards each request to the asking node's own metadata
server (``metadata``, which needs its secret path: the door adds it).

Which node asks is read from the kernel, not from the request: the door finds the socket of
the connecting peer in ``/proc/net/tcp`` and the process that holds it among the process groups
the emulator started, and serves only the node owning that group. Any other caller (another
user's process, a process outside every node) gets 403, so a node's token stays with its node,
as on a VM where the metadata server answers only its own machine.
"""

from __future__ import annotations

import http.client
import os
import socket
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from tpuops.emulator.background import Background, QuietHandler
from tpuops.emulator.vm.sandbox import process_groups

PORT = 80
_FORWARDED = ("Metadata-Flavor", "Content-Type", "Content-Length")


def _hex_endpoint(address: str, port: int) -> str:
    """``/proc/net/tcp``'s spelling of an IPv4 endpoint (address in host byte order)."""
    return f"{int.from_bytes(socket.inet_aton(address), 'little'):08X}:{port:04X}"


def socket_inode(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The inode of the client-side socket of the TCP connection ``client`` -> ``server``."""
    local, remote = _hex_endpoint(*client), _hex_endpoint(*server)
    try:
        with open("/proc/net/tcp", encoding="ascii") as table:
            for line in table:
                fields = line.split()
                if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                    return int(fields[9])
    except OSError:
        return None
    return None


def group_of_holder(inode: int, groups: set[int]) -> int | None:
    """The group (among ``groups``) of a process holding socket ``inode``, or None."""
    target = f"socket:[{inode}]"
    for pid, pgid in process_groups():
        if pgid not in groups:
            continue
        fds = f"/proc/{pid}/fd"
        try:
            if any(os.readlink(f"{fds}/{fd}") == target for fd in os.listdir(fds)):
                return pgid
        except OSError:
            continue
    return None


class _Handler(QuietHandler):
    server: _Door

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        host = self.server.host_for_peer(self.client_address)
        if host is None:
            self._deny()
            return
        address, _, secret = host.partition("/")
        name, _, port = address.partition(":")
        upstream = http.client.HTTPConnection(name, int(port), timeout=3700)
        try:
            headers = {key: value for key in _FORWARDED if (value := self.headers.get(key)) is not None}
            upstream.request(self.command, f"/{secret}{self.path}", body=body or None, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in ("content-length", "connection", "date", "server"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_PUT = _forward

    def _deny(self) -> None:
        data = b"This metadata server answers only the processes of an emulated node.\n"
        self.send_response(403)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Door(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: str, node_hosts: Callable[[], dict[int, str]]) -> None:
        self._node_hosts = node_hosts
        super().__init__((address, PORT), _Handler)

    def host_for_peer(self, peer: tuple[str, int]) -> str | None:
        """The metadata host of the node whose process is at the other end of ``peer``'s connection."""
        hosts = self._node_hosts()
        address, port = self.server_address[:2]
        inode = socket_inode(peer, (str(address), int(port)))
        if inode is None or not hosts:
            return None
        group = group_of_holder(inode, set(hosts))
        return hosts.get(group) if group is not None else None


class MetadataDoor:
    """Port 80 on ``address``; ``node_hosts()`` maps each live node process group to its metadata host."""

    def __init__(self, address: str, node_hosts: Callable[[], dict[int, str]]) -> None:
        self._running = Background(_Door(address, node_hosts), "metadata-door")

    def close(self) -> None:
        self._running.close()
