"""What notifications are made of: kinds, targets (config), a notice and its deliveries (kept in memory).

Nothing here reads the environment or sends anything. Secrets: a target's URL or password is resolved once by
``tpuops.config`` into a private attribute (``SecretStr``), so that no dump of the settings, no ``--json`` and
no error message can carry it.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator

from tpuops.core.kinds import ValueEnum

SCHEMA = "tpuops.notification/1"
"""The generic webhook's schema name and version (docs/notifications.md)."""

MAX_NOTICES = 50
"""Notices a memory keeps: the delivered ones go first."""


class Kind(ValueEnum):
    """What a notice is about; each can be turned off (``on``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RESTARTS_EXHAUSTED = "restarts-exhausted"
    BUDGET = "budget"
    DEADLINE_ON_DEMAND = "deadline-on-demand"
    DEADLINE_AT_RISK = "deadline-at-risk"
    STALLED = "stalled"
    SWEEP_FINISHED = "sweep-finished"
    TEST = "test"


DEFAULT_KINDS = tuple(kind for kind in Kind if kind is not Kind.TEST)
"""Every kind but the test message; a recovered preemption is not one (it needs nobody)."""


class State(ValueEnum):
    """Where one delivery stands."""

    PENDING = "pending"  # decided and written; not acknowledged yet (a retry is due at ``next_at``)
    SENT = "sent"  # the target acknowledged it
    GAVE_UP = "gave-up"  # refused for good (4xx, a target gone from the config) or retried past the give-up time


class Delivery(BaseModel):
    """One notice to one target (by name: the target's secrets are never here)."""

    model_config = ConfigDict(extra="ignore")

    target: str
    state: State = State.PENDING
    attempts: int = 0
    next_at: float = 0.0
    error: str = ""


class Notice(BaseModel):
    """One message, as decided: the same bytes go to every target and to every retry."""

    model_config = ConfigDict(extra="ignore")

    key: str
    """The idempotency key: ``<subject>/<kind>/<milliseconds of the deciding event>``."""
    kind: Kind
    at: float
    scope: Literal["run", "sweep", "test"] = "run"
    subject: str
    title: str
    details: list[str] = Field(default_factory=list)
    cost_usd: float | None = None
    metric: dict[str, float] = Field(default_factory=dict)
    log_tail: list[str] = Field(default_factory=list)
    link: str | None = None
    deliveries: list[Delivery] = Field(default_factory=list)

    @property
    def waiting(self) -> bool:
        """Some delivery is still to be made (pending, not given up)."""
        return any(d.state is State.PENDING for d in self.deliveries)

    def summary(self) -> dict[str, Any]:
        """What ``tpuops events RUN --json`` shows of it: the decision and each target's delivery state (names,
        states and why a try failed; never a URL: an error names the status code or what happened)."""
        return {"key": self.key, "kind": self.kind.value, "at": self.at, "title": self.title,
                "deliveries": [{"target": d.target, "state": d.state.value, "attempts": d.attempts,
                                "next_at": d.next_at if d.state is State.PENDING else None, "error": d.error or None}
                               for d in self.deliveries]}


def keep_last(notices: list[Notice]) -> None:
    """Trim to ``MAX_NOTICES``, dropping the oldest notices that wait for nothing first."""
    while len(notices) > MAX_NOTICES:
        done = next((i for i, notice in enumerate(notices) if not notice.waiting), 0)
        del notices[done]


class NotifyChoice(BaseModel):
    """An experiment's or sweep's ``notify:``: which configured targets (by name) and which kinds.

    None keeps the ``[notify]`` defaults; ``to: []`` turns notifications off for this run or sweep.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    to: list[str] | None = None
    on: list[Kind] | None = None


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_webhook_url(url: str) -> str:
    """``url`` if it is a well-formed https URL, or http to a loopback address; else ValueError.

    Well-formed as the HTTP client will need it: printable ASCII without spaces (a space, a CR or an LF
    is what a pasted or quoted value brings, and ``http.client`` refuses it only when sending), a host and,
    if given, a port between 1 and 65535. The error never holds the URL: its path is a secret.
    """
    bad = next((c for c in url if not " " < c < "\x7f"), None)
    if bad is not None:
        what = {" ": "a space", "\r": "a carriage return (CR)", "\n": "a line feed (LF)", "\t": "a tab"}.get(
            bad, f"the character {ord(bad):#x}" if bad.isascii() else "a non-ASCII character")
        at = url.index(bad)
        raise ValueError(f"a webhook URL holds {what} (character {at + 1}): write it without "
                         "(percent-encode what must stay, as %20)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("a webhook URL must be https://HOST[:PORT]/PATH: its host or port is malformed") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("a webhook URL must be https://HOST/PATH (http:// only to a loopback address)")
    if port == 0:
        raise ValueError("a webhook URL's port must be between 1 and 65535")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError("a webhook URL must be https:// (http:// only to a loopback address)")
    return url


class NotifyTarget(BaseModel):
    """One ``[notify.targets.NAME]`` of tpuops.toml.

    ``slack`` and ``webhook`` take ``url`` (in the file) or ``url_env`` (the name of an environment variable);
    ``email`` takes ``host``, ``port``, ``starttls``, ``user``, ``sender``, ``to`` and the password from
    ``password_env`` or ``password_file``, never from the file itself.

    A URL the HTTP client would refuse, in the file or in its variable, is not refused by this model: reading the
    config holds the target back (``held``) and the command decides (``tpuops.config.load_settings``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    kind: Literal["slack", "webhook", "email"]
    url: SecretStr | None = None
    url_env: str | None = None
    host: str | None = None
    port: int = Field(default=587, gt=0, lt=65536)
    starttls: bool = True
    user: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    sender: str | None = None
    to: list[str] = Field(default_factory=list)
    _url: SecretStr | None = PrivateAttr(default=None)
    _password: SecretStr | None = PrivateAttr(default=None)
    _missing: str | None = PrivateAttr(default=None)
    _held: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _no_password_here(cls, data: Any) -> Any:
        if isinstance(data, dict) and "password" in data:
            raise ValueError("a password is never read from the config: give password_env (an environment "
                             "variable's name) or password_file")
        return data

    @field_validator("host", "user", "sender", "to", "url_env", "password_env", "password_file")
    @classmethod
    def _one_line(cls, value: Any) -> Any:
        """A CR or LF here would end a mail header or an SMTP command: refused when read, not when sending."""
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and any(c < " " or c == "\x7f" for c in text):
                raise ValueError("a control character (a CR, an LF, a tab...) is not allowed here")
        return value

    @model_validator(mode="after")
    def _complete(self) -> NotifyTarget:
        if self.kind == "email":
            if not self.host or not self.to or not self.sender:
                raise ValueError("an email target needs host, sender and to")
            if self.password_env and self.password_file:
                raise ValueError("give password_env or password_file, not both")
        elif (self.url is None) == (self.url_env is None):
            raise ValueError(f"a {self.kind} target needs url or url_env (one of them)")
        return self

    def resolved(self, url: str | None, password: str | None, missing: str | None,
                 held: str | None = None) -> NotifyTarget:
        """A copy holding the secrets read by ``tpuops.config`` (``missing``: why one could not be read; ``held``:
        why its URL is held back, one line that never holds the URL)."""
        copy = self.model_copy()
        copy._url = SecretStr(url) if url is not None else self.url
        copy._password = SecretStr(password) if password is not None else None
        copy._missing = missing
        copy._held = held
        return copy

    @property
    def held(self) -> str | None:
        """Why this target is held back (its URL is malformed: nothing is sent to it, its deliveries wait), if it is."""
        return self._held

    def secret_url(self) -> str:
        if self._held:
            raise ValueError(self._held)
        if self._missing:
            raise ValueError(self._missing)
        value = self._url or self.url
        if value is None:
            raise ValueError("no url")
        return check_webhook_url(value.get_secret_value())

    def secret_password(self) -> str | None:
        if self._missing:
            raise ValueError(self._missing)
        return self._password.get_secret_value() if self._password is not None else None


class NotifySettings(BaseModel):
    """``[notify]`` in tpuops.toml: the targets and what is worth a message."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    targets: dict[str, NotifyTarget] = Field(default_factory=dict)
    on: list[Kind] = Field(default_factory=lambda: list(DEFAULT_KINDS))
    stalled_after_s: float = Field(default=3600.0, gt=0, le=7 * 86400)
    """No step progress for this long while the node is READY (billed): a ``stalled`` notice."""
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    """One delivery's bound: a pass never waits longer than this per target."""
    deliver_budget_s: float = Field(default=15.0, gt=0, le=600)
    """All of one pass's deliveries (every run and sweep) end within this, from the first one, whatever the
    receivers do; what it leaves untried waits for the next pass (``tpuops.notify.outbox.Round``)."""
    give_up_after_s: float = Field(default=86400.0, gt=0, le=7 * 86400)
    dashboard_url: str | None = None
    """Where ``tpuops dashboard`` is reachable for the reader, for the link in each message (none: no link)."""

    def held_back(self) -> dict[str, str]:
        """By target name: why each target held back is (``NotifyTarget.held``); its deliveries wait, untried."""
        return {name: target.held for name, target in self.targets.items() if target.held}

    def chosen(self, choice: NotifyChoice | None) -> tuple[list[str], set[Kind]]:
        """The target names and kinds for a run or sweep with this ``notify:`` choice."""
        to = list(self.targets) if choice is None or choice.to is None else [t for t in choice.to]
        on = set(self.on if choice is None or choice.on is None else choice.on)
        return to, on
