"""The emulator process: one HTTP server on 127.0.0.1 for the Cloud TPU API and the admin API.

``Emulator`` wires the parts together; ``serve`` runs it in the foreground until SIGTERM,
SIGINT or ``POST /_admin/shutdown``, and on the way out ends every process group it
started, closes the billing intervals and stops the metadata servers. Every request passes
the ``auth`` check first (unless the emulator runs with ``--no-auth``). With buckets to serve
(a ``gs://`` store) it also runs fake-gcs-server and its HTTPS front (``gcs.storage``, imported only
then), started before the first node and stopped after the last one: the two stop together.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from tpuops.emulator.api import discovery
from tpuops.emulator.api.admin import ADMIN_PREFIX, AdminApi, AfterAnswer
from tpuops.emulator.api.auth import Authenticator
from tpuops.emulator.api.rest import RestApi, parse_body
from tpuops.emulator.apierror import ApiError
from tpuops.emulator.cloud.queued import QueuedResources
from tpuops.emulator.cloud.state import EmulatorConfig, EmulatorState
from tpuops.emulator.faults import Faults
from tpuops.emulator.stats import RpcStats
from tpuops.emulator.vm.metadoor import MetadataDoor

if TYPE_CHECKING:
    from tpuops.emulator.gcs.storage import Storage

log = logging.getLogger(__name__)


class Emulator:
    """State, queued resources, faults, stats and the two APIs of one emulator."""

    def __init__(self, config: EmulatorConfig, token: str | None = None, token_file: str = "") -> None:
        self.faults = Faults()
        self.stats = RpcStats()
        self.state = EmulatorState(config, self.faults)
        self.auth = Authenticator(token, token_file, self.state.node_for_token)
        self.queued = QueuedResources(self.state)
        self.rest = RestApi(self.state, self.queued, self.faults, self.stats)
        self.admin = AdminApi(self.state, self.faults, self.stats, self.request_shutdown)
        self._httpd: _Server | None = None
        self._shutdown_started = threading.Event()

    def request_shutdown(self) -> None:
        """Stop serving soon; safe from any thread, including a signal handler."""
        if self._httpd is not None and not self._shutdown_started.is_set():
            self._shutdown_started.set()
            threading.Thread(target=self._httpd.shutdown, name="emulator-shutdown", daemon=True).start()

    def serve(self, port: int, announce: Callable[[str], None]) -> None:
        """Bind 127.0.0.1:``port`` (0: any free port), announce the endpoint, serve until told to stop.

        Raises:
            OSError: the port cannot be bound (in use).
        """
        self._httpd = _Server(("127.0.0.1", port), self)
        endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self.state.slices.sandboxes.use_api(endpoint)
        announce(endpoint)
        try:
            self._httpd.serve_forever(poll_interval=0.1)
        finally:
            self.state.close()
            self._httpd.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], app: Emulator) -> None:
        self.app = app
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without this, Nagle's algorithm and the
    # peer's delayed ACK add ~40 ms to every keep-alive response.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Access lines are not logged; failed calls are, in ``_dispatch``."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        app = self.server.app
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        version = discovery.requested_version(path, query) if self.command == "GET" else None
        if version is not None:  # public, as Google's discovery service is: no token asked
            host = self.headers.get("Host") or "{}:{}".format(*self.server.server_address[:2])
            doc = discovery.document(version, f"http://{host}/")
            self._send_json(*((200, doc) if doc is not None else
                              (404, ApiError("NOT_FOUND", f"No discovery document for tpu {version!r}.").http_body())))
            return
        found = None if path.startswith(ADMIN_PREFIX) else app.rest.route(self.command, path)
        refused = app.auth.check(self.headers, found[0] if found else None, found[2] if found else {})
        if refused is not None:
            log.info("%s %s -> %s %s", self.command, path, refused.http_status, refused.status)
            self._send_json(refused.http_status, refused.http_body())
            return
        after_answer: AfterAnswer | None = None
        try:
            if path.startswith(ADMIN_PREFIX):
                try:
                    status, body, after_answer = app.admin.handle(self.command, path, parse_body(raw))
                except ApiError as err:
                    status, body = err.http_status, err.http_body()
            else:
                delay = app.faults.latency_s()
                if delay > 0:
                    time.sleep(delay)
                status, body = app.rest.handle(self.command, path, query, raw)
        except Exception:
            log.exception("%s %s failed", self.command, self.path)
            status, body = 500, ApiError("INTERNAL", "Internal error in the emulator.").http_body()
        if status >= 400:
            log.info("%s %s -> %s %s", self.command, path, status, body.get("error", {}).get("message"))
        if after_answer is None:
            self._send_json(status, body)
            return
        # The shutdown: its answer is the last on this connection and is written (sendall) before
        # the stop starts, since the process may exit as soon as it does. Run even if the caller left.
        try:
            self._send_json(status, body, last=True)
        finally:
            after_answer()

    def _send_json(self, status: int, body: dict[str, Any], last: bool = False) -> None:
        """Write the answer; ``last``: then close the connection (``Connection: close``)."""
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        if last:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def run(config: EmulatorConfig, port: int, token_file: str | None = None, gcs_buckets: list[str] | None = None) -> int:
    """Run an emulator in the foreground; the process's exit code (2: port in use).

    ``token_file`` holds the bearer token every request must carry; None serves without auth.
    ``gcs_buckets``: serve Cloud Storage with these buckets to the nodes as storage.googleapis.com.
    """
    token = None
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as err:
            print(f"tpuops emulator: cannot read the token file {token_file}: {err.strerror}", file=sys.stderr)
            return 1
        if not token:
            print(f"tpuops emulator: the token file {token_file} is empty", file=sys.stderr)
            return 1
    emulator = Emulator(config, token, token_file or "")
    storage: Storage | None = None
    if gcs_buckets:
        # Only here: its CA needs cryptography, which an emulator without a gs:// store does without.
        from tpuops.emulator.gcs.storage import StorageUnavailable
        from tpuops.emulator.gcs.storage import serve as serve_storage

        try:
            storage = serve_storage(config.state_dir, gcs_buckets, emulator.faults, emulator.stats,
                                    emulator.auth.storage_caller)
        except (StorageUnavailable, TimeoutError) as err:
            emulator.state.close()
            print(f"tpuops emulator: cannot serve Cloud Storage: {err}", file=sys.stderr, flush=True)
            return 1
        emulator.state.slices.sandboxes.use_network(storage.network)
    door: MetadataDoor | None = None
    try:
        if storage is not None:
            try:
                door = MetadataDoor(storage.front.address, emulator.state.slices.metadata_hosts_by_group)
            except OSError as err:
                emulator.state.close()
                print(f"tpuops emulator: cannot serve metadata on {storage.front.address}:80: {err.strerror}",
                      file=sys.stderr, flush=True)
                return 1
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: emulator.request_shutdown())
        try:
            emulator.serve(port, lambda endpoint: print(f"tpuops emulator listening on {endpoint}", flush=True))
        except OSError as err:
            emulator.state.close()
            print(f"tpuops emulator: cannot listen on 127.0.0.1:{port}: {err.strerror}", file=sys.stderr, flush=True)
            return 2
    finally:
        if door is not None:
            door.close()
        if storage is not None:
            storage.close()
    return 0
