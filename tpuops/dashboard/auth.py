"""The dashboard's token, as Jupyter keeps one: made at each start, printed once, kept in a 0600 file.

Whoever holds the token may read and act; anyone else gets 401 from every page, data call and
action. A browser proves it once (``/?token=...``) and gets an HttpOnly, SameSite=Strict cookie.

CSRF: actions are POST only and need the ``X-Tpuops-Csrf`` header, whose value (``csrf_value``,
an HMAC of the token) is in the pages' ``<meta>``: another site can neither read it nor send a
custom header cross-origin without a preflight we never answer. Comparisons are constant-time.
The token never appears in a log line, a store object or a run's metadata.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

COOKIE = "tpuops_dashboard"
CSRF_HEADER = "x-tpuops-csrf"


def issue_token(path: Path) -> str:
    """A fresh token, written to ``path`` readable by its owner only (created 0600, never widened)."""
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


def csrf_value(token: str) -> str:
    return hmac.new(token.encode(), b"tpuops-dashboard-csrf", hashlib.sha256).hexdigest()


def cookie(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    """The value of cookie ``name`` among raw ASGI headers, if sent."""
    for key, value in headers:
        if key == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, _, v = part.strip().partition("=")
                if k == name:
                    return v
    return None


def same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
