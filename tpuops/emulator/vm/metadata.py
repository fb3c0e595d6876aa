"""A GCE-style metadata server for one emulated node (``GCE_METADATA_HOST``).

It serves the paths a TPU VM program reads under ``/computeMetadata/v1/``: instance
attributes (the node's metadata plus ``agent-worker-number`` and ``accelerator-type``), name,
hostname, id, zone (``projects/<number>/zones/<zone>``), ``preempted``, project id and number,
and guest attributes a program may write. Like the real server it answers only requests
that carry ``Metadata-Flavor: Google``, labels its answers the same way, lists directories
one entry a line (JSON with ``?recursive=true``) and long-polls with
``?wait_for_change=true[&timeout_sec=N][&last_etag=E]``.

The values live in a ``MetadataView`` that the emulator updates under its own lock; a change
wakes every long-poll waiting on it.

Only the node's own processes may ask: every server has a random secret, and its address
(``host``, what the node's ``GCE_METADATA_HOST`` is set to) is ``127.0.0.1:PORT/<secret>``.
Clients build ``http://$GCE_METADATA_HOST/computeMetadata/v1/...`` (google-auth, curl in the
startup script, the agent), so the secret rides in the path; a request without it is 403.
Another local user scanning ports learns nothing and cannot write guest attributes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/"
DEFAULT_WAIT_S = 60.0
MAX_WAIT_S = 3600.0


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class MetadataView:
    """The current metadata of one node. Thread-safe."""

    def __init__(self, instance: dict[str, str], project: dict[str, str], attributes: dict[str, str]) -> None:
        self._cond = threading.Condition()
        self._instance = dict(instance)
        self._project = dict(project)
        self._attributes = dict(attributes)
        self._guest: dict[str, str] = {}
        self._preempted = False
        self._closed = False

    def set_attributes(self, attributes: dict[str, str]) -> None:
        with self._cond:
            self._attributes = dict(attributes)
            self._cond.notify_all()

    def set_preempted(self, preempted: bool) -> None:
        with self._cond:
            self._preempted = preempted
            self._cond.notify_all()

    def set_guest_attribute(self, path: str, value: str) -> None:
        with self._cond:
            self._guest[path] = value
            self._cond.notify_all()

    def guest_attributes(self) -> dict[str, str]:
        """Guest attributes by ``namespace/key``."""
        with self._cond:
            return dict(self._guest)

    def close(self) -> None:
        """Wake every waiter; the node is going away."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _flat(self) -> Iterator[tuple[str, str]]:
        for key, value in self._instance.items():
            yield f"instance/{key}", value
        yield "instance/preempted", "TRUE" if self._preempted else "FALSE"
        for key, value in self._attributes.items():
            yield f"instance/attributes/{key}", value
        for key, value in self._guest.items():
            yield f"instance/guest-attributes/{key}", value
        for key, value in self._project.items():
            yield f"project/{key}", value

    def _render(self, path: str, recursive: bool) -> str | None:
        """The text at ``path``; a path ending in ``/`` (or the root) is a directory."""
        path = path.lstrip("/")
        flat = dict(self._flat())
        if path and not path.endswith("/"):
            if path in flat:
                return flat[path]
            if not any(key.startswith(path + "/") for key in flat):
                return None
            path += "/"
        children = {key[len(path) :]: value for key, value in flat.items() if key.startswith(path)}
        if not children:
            return None
        if recursive:
            tree: dict[str, Any] = {}
            for key, value in children.items():
                *parents, leaf = key.split("/")
                node = tree
                for parent in parents:
                    node = node.setdefault(parent, {})
                node[leaf] = value
            return json.dumps(tree, sort_keys=True)
        entries = sorted({key.split("/", 1)[0] + ("/" if "/" in key else "") for key in children})
        return "".join(entry + "\n" for entry in entries)

    def read(self, path: str, recursive: bool) -> str | None:
        with self._cond:
            return self._render(path, recursive)

    def wait_for_change(self, path: str, recursive: bool, last_etag: str | None, timeout_s: float) -> str | None:
        """The value at ``path`` once its etag differs from ``last_etag`` (or the current one).

        Returns the current value after ``timeout_s`` even if it did not change.
        """
        with self._cond:
            first = self._render(path, recursive)
            expected = last_etag or etag(first or "")
            self._cond.wait_for(
                lambda: self._closed or etag(self._render(path, recursive) or "") != expected, timeout_s
            )
            return self._render(path, recursive)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without this, Nagle's algorithm and the
    # peer's delayed ACK add ~40 ms to every keep-alive response.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged: scripts poll this server often."""

    def _reply(self, status: int, body: str, content_type: str = "application/text") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if status == 200:
            self.send_header("ETag", etag(body))
        self.end_headers()
        self.wfile.write(data)

    def _checked_path(self) -> tuple[str, dict[str, str]] | None:
        url = urlsplit(self.path)
        secret = f"/{self.server.secret}"
        # "http://$GCE_METADATA_IP" alone (google-auth's ping) asks for the secret without a slash.
        request_path = url.path if url.path != secret else secret + "/"
        if not hmac.compare_digest(request_path[: len(secret) + 1].encode(), (secret + "/").encode()):
            self._reply(403, "This metadata server answers only the processes of its own node.\n")
            return None
        path = request_path[len(secret) :]
        if self.headers.get("Metadata-Flavor") != "Google" or self.headers.get("X-Forwarded-For"):
            self._reply(403, "Missing required header: Metadata-Flavor: Google\n")
            return None
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        if path in ("/", "/computeMetadata/", "/computeMetadata"):
            self._reply(200, "v1/\n")
            return None
        if not path.startswith(PREFIX):
            self._reply(404, "Not Found\n")
            return None
        return path[len(PREFIX) :], query

    def do_GET(self) -> None:
        checked = self._checked_path()
        if checked is None:
            return
        path, query = checked
        view = self.server.view
        recursive = query.get("recursive", "").lower() == "true"
        if query.get("wait_for_change", "").lower() == "true":
            try:
                timeout = min(float(query.get("timeout_sec", DEFAULT_WAIT_S)), MAX_WAIT_S)
            except ValueError:
                self._reply(400, "Invalid timeout_sec\n")
                return
            value = view.wait_for_change(path, recursive, query.get("last_etag"), max(timeout, 0.0))
        else:
            value = view.read(path, recursive)
        if value is None:
            self._reply(404, "Not Found\n")
        else:
            # GCE labels recursive answers and access tokens JSON (oauth2client parses only what is labelled so).
            json_answer = recursive or path.endswith("/token")
            self._reply(200, value, "application/json" if json_answer else "application/text")

    def do_PUT(self) -> None:
        checked = self._checked_path()
        if checked is None:
            return
        path, _ = checked
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        key = path.removeprefix("instance/guest-attributes/")
        if key == path or key.count("/") != 1:
            self._reply(403, "Only instance/guest-attributes/<namespace>/<key> can be written\n")
            return
        self.server.view.set_guest_attribute(key, body)
        self._reply(200, "")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, view: MetadataView) -> None:
        self.view = view
        self.secret = secrets.token_urlsafe(18)
        super().__init__(("127.0.0.1", 0), _Handler)


class MetadataServer:
    """One metadata server on 127.0.0.1 and a free port, serving ``view``."""

    def __init__(self, view: MetadataView) -> None:
        self.view = view
        self._server = _Server(view)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="metadata", daemon=True
        )
        self._thread.start()

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>/<secret>``, the value of ``GCE_METADATA_HOST``."""
        return f"127.0.0.1:{self._server.server_address[1]}/{self._server.secret}"

    def close(self) -> None:
        """Stop serving, without blocking the caller (it may hold the emulator's lock)."""
        self.view.close()
        threading.Thread(target=self._shutdown, name="metadata-close", daemon=True).start()

    def _shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
