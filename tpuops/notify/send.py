"""One notice to one target: the bodies (Slack-compatible, the generic versioned JSON, an email) and their delivery.

Every failure is one class of the taxonomy (``tpuops.core.errors``), so that the outbox knows from ``retryable``
whether a later pass may try again: a refused connection is ``Unreachable``, a 5xx or 429 or a timeout is a
``TransientError``, a 4xx or a refused recipient is final. No message here names a URL, a host's password or
anything a secret could be read from: the errors say the status code or what happened.

What users control (run names, reasons, log lines) is escaped for each medium: Slack's ``&``, ``<`` and
``>``, control characters everywhere, line breaks in email headers.
"""

from __future__ import annotations

import hashlib
import json
import smtplib
import socket
import ssl
import urllib.error
import urllib.request
from datetime import datetime
from email.message import EmailMessage
from typing import Any

from tpuops.core.clock import UTC
from tpuops.core.errors import InvalidRequest, NotFound, PermissionDenied, TpuopsError, TransientError, Unreachable
from tpuops.core.formats import format_usd
from tpuops.core.notices import SCHEMA, Notice, NotifyTarget
from tpuops.notify import wire

KEY_HEADER = "Idempotency-Key"
"""The header (and, as ``idempotency_key``, the body field) a receiver drops a repeated message by."""


class NoAnswer(TransientError):
    """The receiver did not answer within the delivery's bound: the pass skips it until the next one."""


def clean(text: str) -> str:
    """``text`` without control characters other than a newline or a tab."""
    return "".join(c for c in text if c in "\n\t" or (c >= " " and c != "\x7f"))


def _mrkdwn(text: str) -> str:
    return clean(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _when(notice: Notice) -> str:
    return datetime.fromtimestamp(notice.at, UTC).isoformat(timespec="seconds")


def webhook_body(notice: Notice) -> dict[str, Any]:
    """The generic webhook's JSON (schema ``tpuops.notification/1``, docs/notifications.md)."""
    return {
        "schema": SCHEMA, "idempotency_key": notice.key, "kind": notice.kind.value, "at": _when(notice),
        "subject": {"type": notice.scope, "id": notice.subject}, "title": clean(notice.title),
        "details": [clean(line) for line in notice.details], "cost_usd": notice.cost_usd,
        "metrics": notice.metric, "log_tail": [clean(line) for line in notice.log_tail], "link": notice.link,
    }


def slack_body(notice: Notice) -> dict[str, Any]:
    """Slack's incoming-webhook JSON: ``text`` (the notification's line) and blocks with the run, what happened,
    the cost so far, the metrics, the last log lines and the dashboard link; the key in a context block."""
    lines = [f"*{notice.scope}* `{_mrkdwn(notice.subject)}`", *(_mrkdwn(line) for line in notice.details)]
    if notice.cost_usd is not None:
        lines.append(f"*cost so far* {format_usd(notice.cost_usd)}")
    if notice.metric:
        lines.append("*metrics* " + ", ".join(f"{_mrkdwn(k)} {v:.4g}" for k, v in notice.metric.items()))
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": clean(notice.title)[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}},
    ]
    if notice.log_tail:
        tail = "\n".join(_mrkdwn(line).replace("```", "'''") for line in notice.log_tail)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{tail[-2900:]}```"}})
    context = [f"{_mrkdwn(notice.kind.value)} at {_when(notice)}", f"key {_mrkdwn(notice.key)}"]
    if notice.link:
        context.append(f"<{_mrkdwn(notice.link)}|dashboard>")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": text} for text in context]})
    return {"text": clean(notice.title), "blocks": blocks}


def email_message(notice: Notice, target: NotifyTarget) -> EmailMessage:
    """A plain-text email; its ``Message-ID`` is derived from the key, so a mail system drops a repeat too."""
    message = EmailMessage()
    message["Subject"] = "[tpuops] " + " ".join(clean(notice.title).split())
    message["From"] = target.sender or ""
    message["To"] = ", ".join(target.to)
    message["Message-ID"] = f"<{hashlib.sha256(notice.key.encode()).hexdigest()[:32]}@tpuops>"
    message["X-Tpuops-Idempotency-Key"] = notice.key
    body = [clean(notice.title), "", *(clean(line) for line in notice.details)]
    if notice.cost_usd is not None:
        body.append(f"cost so far: {format_usd(notice.cost_usd)}")
    body.extend(f"{clean(k)}: {v:.4g}" for k, v in notice.metric.items())
    if notice.log_tail:
        body += ["", "last lines:", *(clean(line) for line in notice.log_tail)]
    if notice.link:
        body += ["", f"dashboard: {notice.link}"]
    body += ["", f"{notice.kind.value} at {_when(notice)}, idempotency key {notice.key}"]
    message.set_content("\n".join(body) + "\n")
    return message


def send(target: NotifyTarget, notice: Notice, timeout_s: float) -> None:
    """Deliver ``notice`` to ``target`` once, within ``timeout_s``; a ``TpuopsError`` says why not."""
    if target.kind == "email":
        _send_mail(target, notice, timeout_s)
        return
    body = webhook_body(notice) if target.kind == "webhook" else slack_body(notice)
    _post(target, json.dumps(body, allow_nan=False).encode(), notice.key, timeout_s)


def _post(target: NotifyTarget, data: bytes, key: str, timeout_s: float) -> None:
    try:
        url = target.secret_url()
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", KEY_HEADER: key, "User-Agent": "tpuops"})
    try:
        wire.current().post(request, timeout_s)  # urlopen, or the fault swarm's receivers (tpuops.notify.wire)
    except urllib.error.HTTPError as err:
        raise _http_error(err.code) from None
    except urllib.error.URLError as err:
        raise _network_error(err.reason, timeout_s) from None
    except (TimeoutError, OSError) as err:
        raise _network_error(err, timeout_s) from None


def _http_error(code: int) -> TpuopsError:
    if code == 429 or code >= 500:
        return TransientError(f"the receiver answered HTTP {code}")
    if code in (401, 403):
        return PermissionDenied(f"the receiver refused it: HTTP {code}")
    if code in (404, 410):
        return NotFound(f"the receiver answered HTTP {code}: the webhook is gone")
    return InvalidRequest(f"the receiver refused it: HTTP {code}")


def _network_error(reason: object, timeout_s: float) -> TpuopsError:
    if isinstance(reason, TimeoutError | socket.timeout):
        return NoAnswer(f"no answer within {timeout_s:g} s")
    if isinstance(reason, ConnectionRefusedError | socket.gaierror):
        return Unreachable("nothing answers at the receiver (connection refused or unknown host)")
    if isinstance(reason, ssl.SSLError):
        return TransientError(f"TLS failed ({type(reason).__name__})")
    return TransientError(f"the connection failed ({type(reason).__name__})")


def _send_mail(target: NotifyTarget, notice: Notice, timeout_s: float) -> None:
    try:
        password = target.secret_password()
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    try:
        with smtp_session(target, timeout_s) as smtp:
            if target.user:
                smtp.login(target.user, password or "")
            smtp.send_message(email_message(notice, target))
    except smtplib.SMTPAuthenticationError as err:
        raise PermissionDenied(f"the SMTP server refused the login ({err.smtp_code})") from None
    except smtplib.SMTPRecipientsRefused:
        raise InvalidRequest("the SMTP server refused every recipient") from None
    except smtplib.SMTPResponseException as err:
        if err.smtp_code >= 500:
            raise InvalidRequest(f"the SMTP server refused it ({err.smtp_code})") from None
        raise TransientError(f"the SMTP server answered {err.smtp_code}") from None
    except smtplib.SMTPException as err:
        raise TransientError(f"SMTP failed ({type(err).__name__})") from None


def smtp_session(target: NotifyTarget, timeout_s: float) -> smtplib.SMTP:
    """A connected SMTP session (after STARTTLS when asked for); ``Unreachable`` when nothing answers."""
    try:
        smtp = smtplib.SMTP(target.host or "", target.port, timeout=timeout_s)
    except OSError as err:
        error = _network_error(err, timeout_s)
        raise Unreachable(f"no SMTP server answers at {target.host}:{target.port}") if isinstance(
            error, Unreachable) else error from None
    try:
        if target.starttls:
            smtp.starttls(context=ssl.create_default_context())
    except (smtplib.SMTPException, OSError) as err:
        smtp.close()
        raise TransientError(f"STARTTLS failed at {target.host}:{target.port} ({type(err).__name__})") from None
    return smtp
