"""The emulator's side servers: run one on a daemon thread and stop it; the handler base they share."""

from __future__ import annotations

import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive, no access log, and headers not held back by Nagle's algorithm (~40 ms a response)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Not logged: these servers are polled."""


class Background:
    """``server.serve_forever`` on a daemon thread named ``name``, until ``close``."""

    def __init__(self, server: socketserver.BaseServer, name: str) -> None:
        self.server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name=name,
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the socket (blocks until the serving loop has returned)."""
        self.server.shutdown()
        self.server.server_close()
