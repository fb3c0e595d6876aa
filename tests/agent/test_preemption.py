"""The preemption notice: SIGTERM and the metadata server both raise the flag, nothing more."""

import http.server
import os
import signal
import threading
import time
from typing import ClassVar, Iterator, List

import pytest
from tpuops.agent.preemption import METADATA_PATH, PreemptionNotice, metadata_host

pytestmark = pytest.mark.tf


class _Metadata(http.server.BaseHTTPRequestHandler):
    value = "FALSE"
    requests: ClassVar[List[str]] = []

    def do_GET(self) -> None:
        type(self).requests.append(self.path if self.headers.get("Metadata-Flavor") == "Google" else "no header")
        body = type(self).value.encode()
        self.send_response(200)
        self.send_header("ETag", "etag-" + type(self).value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_server() -> Iterator[http.server.HTTPServer]:
    _Metadata.value, _Metadata.requests = "FALSE", []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_metadata_preempted_true_raises_the_flag(metadata_server: http.server.HTTPServer) -> None:
    notice = PreemptionNotice()
    notice.watch_metadata(f"127.0.0.1:{metadata_server.server_address[1]}")
    deadline = time.monotonic() + 10
    while len(_Metadata.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _Metadata.requests[0] == METADATA_PATH, "first a plain read, with the Metadata-Flavor header"
    assert "wait_for_change=true" in _Metadata.requests[1] and "last_etag=etag-FALSE" in _Metadata.requests[1]
    assert not notice.requested(), "FALSE must not trigger"
    _Metadata.value = "TRUE"
    assert notice.wait(10)
    assert notice.reason == "metadata instance/preempted"


def test_sigterm_only_raises_the_flag() -> None:
    notice = PreemptionNotice()
    previous = signal.getsignal(signal.SIGTERM)
    notice.install_signal_handler()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert notice.wait(5)
        assert notice.reason == "signal SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_metadata_host_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    assert metadata_host() == "127.0.0.1:9"
    assert PreemptionNotice().watch_metadata(None) is None
