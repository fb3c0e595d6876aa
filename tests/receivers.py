"""Real receivers on loopback for the notification tests: an HTTP server and an SMTP server (aiosmtpd).

``HttpReceiver`` answers each POST 200 and keeps its body and idempotency key (``delivered``); told to, it
answers 500 to the next N requests (``failing``), or holds the next request, read in full, until the test
releases it (``hold``): the test can kill the sender while its request is in the receiver's hands. Such a
request is kept in ``held``, never in ``delivered``: its sender never saw an answer.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

SECRET_PATH = "hooks/T0-s3cr3t-webhook-path"
"""The part of a webhook URL that is a secret: no file a test produces may contain it."""


class _Closes:
    """A receiver is a context manager: ``with http_receiver() as hook:`` closes it whatever the test did."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


R = TypeVar("R", bound=_Closes)


@dataclass
class Received:
    key: str | None
    body: dict[str, Any]


@dataclass
class HttpReceiver(_Closes):
    server: ThreadingHTTPServer
    delivered: list[Received] = field(default_factory=list)
    refused: list[Received] = field(default_factory=list)
    held: list[Received] = field(default_factory=list)
    failing: int = 0
    holding: bool = False
    got_held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{SECRET_PATH}"

    def hold(self) -> None:
        """Hold the next request (read in full) until ``release`` is set."""
        self.got_held.clear()
        self.release.clear()
        self.holding = True

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def http_receiver() -> HttpReceiver:
    receiver: HttpReceiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got = Received(self.headers.get("Idempotency-Key"), json.loads(data))
            if self.path != "/" + SECRET_PATH:
                self.send_response(404)
                self.end_headers()
                return
            with receiver.lock:
                hold, receiver.holding = receiver.holding, False
                fail = not hold and receiver.failing > 0
                receiver.failing -= 1 if fail else 0
            if hold:
                receiver.held.append(got)
                receiver.got_held.set()
                receiver.release.wait(120)
                self.close_connection = True
                return
            (receiver.refused if fail else receiver.delivered).append(got)
            self.send_response(500 if fail else 200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver = HttpReceiver(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver


SMTP_USER, SMTP_PASSWORD = "tpuops", "pw-s3cr3t-smtp-password"


@dataclass
class SmtpReceiver(_Closes):
    controller: Any
    messages: list[Message] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.controller.port)

    def close(self) -> None:
        self.controller.stop()


def smtp_receiver() -> SmtpReceiver:
    """aiosmtpd on a free loopback port, with a login (plain, no TLS: loopback) and every message kept."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    receiver = SmtpReceiver(None)

    class Handler:
        async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:
            receiver.messages.append(message_from_bytes(envelope.content))
            return "250 OK"

    def authenticate(_server: Any, _session: Any, _envelope: Any, mechanism: str, data: Any) -> AuthResult:
        login, password = data.login.decode(), data.password.decode()
        receiver.logins.append((login, password))
        return AuthResult(success=(login, password) == (SMTP_USER, SMTP_PASSWORD))

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    receiver.controller = Controller(Handler(), hostname="127.0.0.1", port=port, authenticator=authenticate,
                                     auth_require_tls=False)
    receiver.controller.start()
    return receiver


def free_port() -> int:
    """A loopback port nothing listens on (an SMTP host that does not answer)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def files_holding(root: Any, *secrets: str) -> list[str]:
    """Every file under ``root`` whose bytes contain one of ``secrets``."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found.extend(f"{path}: {secret}" for secret in secrets if secret.encode() in data)
    return found


def target_toml(name: str, **fields: Any) -> str:
    """tpuops.toml's ``[notify.targets.<name>]`` table holding ``fields`` (strings, numbers, booleans, lists)."""
    return f"\n[notify.targets.{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in fields.items())


def mail_target(name: str, port: int, **login: str) -> str:
    """The target of an email to the SMTP server on loopback ``port`` (no TLS), with ``login`` (``user=SMTP_USER``
    and ``password_env`` or ``password_file``) where the test gives one."""
    return target_toml(name, kind="email", host="127.0.0.1", port=port, starttls=False, **login,
                       sender="tpuops@localhost", to=["me@localhost"])
