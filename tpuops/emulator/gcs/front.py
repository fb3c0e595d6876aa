"""The fronts of fake-gcs-server: the HTTPS one emulated nodes reach as ``storage.googleapis.com``, and the
control plane's.

A small HTTP/1.1 proxy: TLS with the emulator's certificate (``tls``) on ``<address>:443``,
plain HTTP to fake-gcs-server. It exists for four reasons:

* TensorFlow 2.9's uploads carry ``Transfer-Encoding: identity`` (with a Content-Length), which
  Google's front end accepts and Go's HTTP server, hence fake-gcs-server, refuses with
  501 "Unsupported transfer encoding": the front drops that header. It also sends
  ``X-Forwarded-Proto: https`` so that the resumable-upload ``Location`` fake-gcs-server answers
  is an https URL on the host the client used, as Google's is.
* Credentials: a request must carry ``Authorization: Bearer`` with a token ``authorized`` accepts
  (a node's service-account token from its metadata server, or the emulator's own), else 401 as
  from Google: a node that fails to fetch its token fails here as it would on GCP.
* Faults (``Faults.storage_fault``): every request waits ``gcs_latency_ms``; at ``gcs_error_rate``
  a request is answered 503 or 429 (Cloud Storage's retryable statuses, in its JSON error shape)
  or its connection is reset before a response byte, without reaching fake-gcs-server, so an
  injected failure never half-applies a write.
* Resumable-upload status queries (``uploads``): fake-gcs-server finalises the object with the
  bytes it holds, where Cloud Storage answers 308 and keeps the session open; TensorFlow asks
  after every failed upload request, so behind the faults that published empty objects. The
  front answers those queries itself, from the session states it relayed.

The control plane's front (``tls=None``) is plain HTTP on 127.0.0.1 and lets every request through
(the control plane's client is anonymous against an emulator, as against any fake-gcs-server), so
its only job is the faults: the control plane's own retries (``tpuops.core.retry`` around
google-cloud-storage) meet the same 503s, 429s, resets and latency as TensorFlow's do.

Invariants: responses and Content-Length request bodies stream through in 1-MiB pieces (a 64-MiB
ranged read is never held whole); a ``Transfer-Encoding: chunked`` request body is buffered whole,
because fake-gcs-server needs its Content-Length (TensorFlow's uploads send Content-Length, so
only small requests of other clients take that path);
one upstream connection per client connection, so keep-alive on one side is keep-alive on the
other; every request is counted as ``<name>:<METHOD>`` and every injected failure as
``<name>:injected-<503|429|reset>`` (``RpcStats``, ``GET /_admin/stats``), where ``<name>`` is
``storage`` for the nodes' front and ``control-storage`` for the control plane's: that is how the
benchmark counts the nodes' requests per 1,000 steps and the fault tests see that faults were injected.
"""

from __future__ import annotations

import http.client
import json
import socket
import socketserver
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from tpuops.emulator.background import Background
from tpuops.emulator.faults import Faults
from tpuops.emulator.gcs import uploads

CHUNK = 1 << 20
# A client connection idle this long is closed (TensorFlow reconnects as it would to Google).
IDLE_S = 300.0
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "expect"}
)
_STATUS_TEXT = {401: ("Unauthorized", "required"), 429: ("Too Many Requests", "rateLimitExceeded"),
                503: ("Service Unavailable", "backendError")}


class _Closed(Exception):
    """The client went away (or sent something that is not HTTP/1.1): end this connection."""


def _read_head(stream: BinaryIO) -> tuple[str, list[tuple[str, str]]] | None:
    line = stream.readline(65537)
    if not line:
        return None
    request_line = line.decode("latin-1").rstrip("\r\n")
    headers: list[tuple[str, str]] = []
    while True:
        raw = stream.readline(65537)
        if not raw:
            raise _Closed
        if raw in (b"\r\n", b"\n"):
            return request_line, headers
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key.lower() == name), None)


def _chunks(stream: BinaryIO, length: int) -> Iterator[bytes]:
    """``length`` bytes of ``stream`` in pieces of at most ``CHUNK``."""
    left = length
    while left > 0:
        data = stream.read(min(CHUNK, left))
        if not data:
            raise _Closed
        left -= len(data)
        yield data


def _dechunked(stream: BinaryIO) -> Iterator[bytes]:
    """The body of a ``Transfer-Encoding: chunked`` request, decoded."""
    while True:
        size = int(stream.readline(1024).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while stream.readline(65537) not in (b"\r\n", b"\n", b""):
                pass
            return
        yield from _chunks(stream, size)
        stream.readline(1024)


class _Handler(socketserver.StreamRequestHandler):
    server: _Front

    def handle(self) -> None:
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=IDLE_S)
        try:
            if isinstance(self.connection, ssl.SSLSocket):
                self.connection.do_handshake()
            while self._one_request(upstream):
                pass
        except (_Closed, OSError, ValueError, http.client.HTTPException):
            pass
        finally:
            upstream.close()

    # Long: one HTTP/1.1 exchange relayed as it happens on the wire (head, 100-continue, body framing, the
    # answer, keep-alive); split, each part would hand the connection's half-read state to the next.
    def _one_request(self, upstream: http.client.HTTPConnection) -> bool:
        head = _read_head(self.rfile)
        if head is None:
            return False
        method, target, version = [*head[0].split(" "), "", ""][:3]
        headers = head[1]
        self.server.count(f"{self.server.name}:{method}")
        if (_header(headers, "expect") or "").lower() == "100-continue":
            # curl waits a second for this before sending a body (every upload of TensorFlow's).
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.flush()
        length = int(_header(headers, "content-length") or 0)
        chunked = (_header(headers, "transfer-encoding") or "").lower() == "chunked"
        body = _dechunked(self.rfile) if chunked else _chunks(self.rfile, length)
        if not self.server.authorized(_header(headers, "authorization") or ""):
            for _ in body:
                pass
            self.server.count(f"{self.server.name}:unauthenticated")
            self._send_error(401)
            return True
        delay, failure = self.server.faults.storage_fault()
        if delay > 0:
            time.sleep(delay)
        if failure is not None:
            self.server.count(f"{self.server.name}:injected-{failure}")
            for _ in body:
                pass
            if failure == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                raise _Closed
            self._send_error(int(failure))
            return True
        keep = version == "HTTP/1.1" and (_header(headers, "connection") or "").lower() != "close"
        if not chunked and uploads.is_status_query(method, target, _header(headers, "content-range"), length):
            self._send(self.server.uploads.answer(target))
            return keep
        forwarded = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"]
        upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for key, value in [*forwarded, ("X-Forwarded-Proto", self.server.scheme), ("Connection", "keep-alive")]:
            upstream.putheader(key, value)
        if chunked:
            pieces = list(body)
            upstream.putheader("Content-Length", str(sum(len(piece) for piece in pieces)))
            upstream.endheaders()
            for piece in pieces:
                upstream.send(piece)
        else:
            if length or method in ("POST", "PUT", "PATCH"):
                upstream.putheader("Content-Length", str(length))
            upstream.endheaders()
            for piece in body:
                upstream.send(piece)
        response = upstream.getresponse()
        if uploads.is_upload(method, target):
            # Small JSON answers; read whole so that the session's state is recorded before the client sees it.
            data = response.read()
            self.server.uploads.relayed(method, target, response.status, response.getheader("Location"),
                                        response.getheader("Range"), data)
            self._relay(method, response, data)
        else:
            self._relay(method, response)
        return keep and not response.will_close

    def _relay(self, method: str, response: http.client.HTTPResponse, data: bytes | None = None) -> None:
        out = self.wfile
        kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        length = response.getheader("Content-Length")
        if data is None and length is None and method != "HEAD" and response.status not in (204, 304):
            data = response.read()
        if data is not None:
            kept = [(k, v) for k, v in kept if k.lower() != "content-length"] + [("Content-Length", str(len(data)))]
            pieces = iter([data])
        else:
            pieces = iter(lambda: response.read(CHUNK), b"")
        lines = [f"HTTP/1.1 {response.status} {response.reason}"] + [f"{k}: {v}" for k, v in kept]
        out.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            for piece in pieces:
                out.write(piece)
        out.flush()

    def _send_error(self, status: int) -> None:
        reason, code = _STATUS_TEXT[status]
        message = "Anonymous caller does not have storage access." if status == 401 else f"Injected fault: {reason}."
        body = json.dumps({"error": {"code": status, "message": message,
                                     "errors": [{"reason": code, "message": reason}]}}).encode()
        self._send(uploads.Answer(status, reason, [("Content-Type", "application/json; charset=UTF-8")], body))

    def _send(self, answer: uploads.Answer) -> None:
        lines = [f"HTTP/1.1 {answer.status} {answer.reason}", *(f"{k}: {v}" for k, v in answer.headers),
                 f"Content-Length: {len(answer.body)}"]
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + answer.body)
        self.wfile.flush()


class _Front(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: str, port: int, context: ssl.SSLContext | None, upstream: tuple[str, int],
                 faults: Faults, count: Callable[[str], None], authorized: Callable[[str], bool], name: str) -> None:
        self.authorized = authorized
        self.context = context
        self.scheme = "http" if context is None else "https"
        self.upstream = upstream
        self.faults = faults
        self.count = count
        self.name = name
        self.uploads = uploads.UploadSessions()
        super().__init__((address, port), _Handler)

    def get_request(self) -> tuple[socket.socket, object]:
        sock, peer = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(IDLE_S)
        if self.context is None:
            return sock, peer
        # The handshake runs on the connection's own thread (``handle``), never in the accept loop.
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), peer

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that fails its TLS handshake or drops mid-request concerns only itself."""


class GcsFront:
    """A front on ``address:port`` forwarding to fake-gcs-server at ``upstream`` (host, port).

    ``tls`` is (certificate, key) for the nodes' HTTPS front, None for the control plane's plain one;
    ``count`` receives the name of every request and injected failure (``RpcStats.count``), prefixed
    with ``name``; ``authorized`` says whether a request's ``Authorization`` header may pass.
    """

    def __init__(self, address: str, port: int, tls: tuple[Path, Path] | None, upstream: tuple[str, int],
                 faults: Faults, count: Callable[[str], None], authorized: Callable[[str], bool],
                 name: str = "storage") -> None:
        context = None
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            context.set_alpn_protocols(["http/1.1"])
        self._running = Background(_Front(address, port, context, upstream, faults, count, authorized, name),
                                   name)

    @property
    def port(self) -> int:
        """The port it listens on (the one the kernel chose when asked for port 0)."""
        return int(self._running.server.server_address[1])

    def close(self) -> None:
        self._running.close()
