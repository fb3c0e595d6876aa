"""The notices a memory holds, delivered: queue (the write-ahead), then deliver what is due, then mark.

Why not ``tpuops.core.retry`` here: that policy retries within one call, sleeping; a notice is retried across
passes instead (one attempt per target per pass, bounded by ``NotifySettings.timeout_s``), so that no pass
waits on a receiver. What is retried is still decided by the taxonomy's ``retryable``: a 5xx, a 429, a
timeout or a refused connection waits for a later pass (``BACKOFF_S``, then gives up after
``give_up_after_s``); a 4xx, a refused recipient or a target gone from the config gives up at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tpuops.core.errors import TpuopsError
from tpuops.core.notices import Notice, NotifySettings, NotifyTarget, State, keep_last
from tpuops.notify.send import send

BACKOFF_S = (30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""The wait before the n-th retry of one delivery (the last repeats)."""

MAX_TRIES = 8
"""Deliveries one run or sweep tries per pass: a pass holds a lease (``lease_ttl_s``) for at most this many
``timeout_s``; what is left waits for the next pass."""

Note = Callable[[str, str], None]
"""Records one event about a notice: (event kind, message)."""


def queue(notices: list[Notice], new: list[Notice], note: Note) -> None:
    """Add the notices just decided to the ones a memory holds (the caller writes the memory before sending)."""
    for notice in new:
        notices.append(notice)
        note("notify", f"{notice.kind}: {notice.title}; to {', '.join(d.target for d in notice.deliveries)} "
                       f"(key {notice.key})")
    keep_last(notices)


def waiting(notices: list[Notice]) -> bool:
    """Some delivery is still to be made: the run or sweep stays in the pass's care until it is."""
    return any(notice.waiting for notice in notices)


def due(notices: list[Notice], now: float) -> bool:
    """Some delivery is to be tried now."""
    return any(d.state is State.PENDING and d.next_at <= now for notice in notices for d in notice.deliveries)


def deliver(notices: list[Notice], config: NotifySettings, now: float, note: Note) -> bool:
    """Try every delivery due at ``now``, once each; mark it sent, retried later, or given up. Whether any changed.

    The caller writes the memory afterwards (the mark). Nothing here raises: a failure is the delivery's state.
    """
    tries = 0
    targets: Mapping[str, NotifyTarget] = config.targets
    for notice in notices:
        for delivery in notice.deliveries:
            if delivery.state is not State.PENDING or delivery.next_at > now or tries >= MAX_TRIES:
                continue
            tries += 1
            delivery.attempts += 1
            target = targets.get(delivery.target)
            try:
                if target is None:
                    raise TpuopsError(f"target {delivery.target!r} is no longer in [notify.targets]")
                send(target, notice, config.timeout_s)
            except TpuopsError as err:
                delivery.error = str(err)
                if err.retryable and now - notice.at < config.give_up_after_s:
                    wait = BACKOFF_S[min(delivery.attempts, len(BACKOFF_S)) - 1]
                    delivery.next_at = now + wait
                    note("notify-failed", f"{notice.kind} to {delivery.target}: {err}; retrying after {wait:.0f} s")
                else:
                    delivery.state = State.GAVE_UP
                    note("notify-failed", f"{notice.kind} to {delivery.target}: {err}; given up")
                continue
            delivery.state, delivery.error = State.SENT, ""
            note("notified", f"{notice.kind} sent to {delivery.target} (key {notice.key})")
    return tries > 0


def test_all(config: NotifySettings, project: str, now: float) -> list[tuple[str, str, str]]:
    """``tpuops notify test``: one test message to every target; (target, kind, what happened) per target.

    Refused before anything is sent (``UsageError``): no target configured, a target whose secret cannot be
    read, an SMTP host where nothing answers.
    """
    from tpuops.core.errors import UsageError
    from tpuops.core.notices import Kind
    from tpuops.notify.send import smtp_session

    if not config.targets:
        raise UsageError("no target in tpuops.toml's [notify.targets] (docs/notifications.md shows one)")
    for name, target in config.targets.items():
        try:
            target.secret_password() if target.kind == "email" else target.secret_url()
        except ValueError as err:
            raise UsageError(f"notify target {name!r}: {err}") from None
        if target.kind == "email":
            try:
                smtp_session(target, config.timeout_s).quit()
            except TpuopsError as err:
                raise UsageError(f"notify target {name!r}: {err}") from None
    notice = Notice(key=f"test/{round(now * 1000)}", kind=Kind.TEST, at=now, scope="test", subject=project,
                    title=f"tpuops test message from project {project}",
                    details=["if you read this, tpuops can reach you here"])
    results = []
    for name, target in config.targets.items():
        try:
            send(target, notice, config.timeout_s)
        except TpuopsError as err:
            results.append((name, target.kind, f"failed: {err}"))
            continue
        results.append((name, target.kind, "sent"))
    return results
