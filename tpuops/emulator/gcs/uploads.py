"""Resumable-upload status queries answered as Cloud Storage answers them, for the storage fronts.

A client that loses an upload request asks its session how far it got: ``PUT <session URI>``
with an empty body and ``Content-Range: bytes */<size>`` (or ``bytes */*``). Cloud Storage
answers 308 with ``Range: bytes=0-<last>`` for the bytes it holds (no ``Range`` when it holds
none), or 200 with the object once the upload has completed, and a 404 for a session it does
not know. fake-gcs-server instead takes the query for the last chunk and finalises the object
with the bytes it holds: zero bytes when the lost request never reached it. TensorFlow 2.9
retries every failed upload with this query first (``GcsWritableFile::SyncImpl``), takes the
200 for "already uploaded" and reports success. Behind the fault front, 2 % of failing requests
were enough to publish an empty ``status.json`` (a clean-clone CI run of
``test_two_percent_of_storage_requests_failing_changes_nothing``), and the same path could
publish an empty or truncated checkpoint shard.

So the fronts never forward a status query. They answer it from what they relayed of the
session: created (no bytes), partly written (the ``Range`` of fake-gcs-server's last 308) or
completed (its 2xx and the object it returned). That is enough because the front forwards every
upload request whole or not at all: an injected failure is answered before anything reaches
fake-gcs-server.

Invariants: a status query never reaches fake-gcs-server; a session's state changes only on a
response fake-gcs-server gave; at most ``MAX_SESSIONS`` sessions are remembered, the oldest
forgotten first (a query on a forgotten or unknown session gets 404, which makes TensorFlow
and google-resumable-media restart the upload, as Cloud Storage's expired sessions do).
Thread-safe: the fronts serve every connection on its own thread.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field

MAX_SESSIONS = 4096
_JSON = ("Content-Type", "application/json; charset=UTF-8")


@dataclass(frozen=True)
class Answer:
    """An HTTP response the front sends itself: status, reason, headers and body."""

    status: int
    reason: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


@dataclass
class _Session:
    received: str | None = None  # the Range of the last 308, e.g. "bytes=0-4"; None: nothing held
    done: tuple[int, bytes] | None = None  # status and body of the completing response


def _upload_id(target: str) -> str | None:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    ids = query.get("upload_id")
    return ids[0] if ids else None


def is_status_query(method: str, target: str, content_range: str | None, length: int) -> bool:
    """Whether a request asks a resumable session for its state instead of sending bytes."""
    return (method == "PUT" and length == 0 and _upload_id(target) is not None
            and (content_range or "").replace(" ", "").startswith("bytes*/"))


def is_upload(method: str, target: str) -> bool:
    """Whether fake-gcs-server's response to this request changes a resumable session's state."""
    if method == "POST":
        return "resumable" in urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get("uploadType", [])
    return method == "PUT" and _upload_id(target) is not None


class UploadSessions:
    """What the front has relayed of each resumable upload session, keyed by ``upload_id``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def relayed(self, method: str, target: str, status: int, location: str | None, range_header: str | None,
                body: bytes) -> None:
        """Record fake-gcs-server's response to a forwarded request (only upload requests change anything)."""
        if method == "POST" and location and 200 <= status < 300:
            started = _upload_id(location)
            if started is not None:
                self._remember(started, _Session())
            return
        upload_id = _upload_id(target) if method == "PUT" else None
        if upload_id is None:
            return
        with self._lock:
            session = self._sessions.get(upload_id)
            if session is None:
                return
            if 200 <= status < 300:
                session.done = (status, body)
            elif status == 308:
                session.received = range_header

    def answer(self, target: str) -> Answer:
        """The answer Cloud Storage gives a status query on the session ``target`` names."""
        with self._lock:
            session = self._sessions.get(_upload_id(target) or "")
            if session is None:
                body = b'{"error": {"code": 404, "message": "No such upload session."}}'
                return Answer(404, "Not Found", [_JSON], body)
            if session.done is not None:
                return Answer(session.done[0], "OK", [_JSON], session.done[1])
            headers = [("Range", session.received)] if session.received else []
            return Answer(308, "Resume Incomplete", headers)

    def _remember(self, upload_id: str, session: _Session) -> None:
        with self._lock:
            self._sessions[upload_id] = session
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
