"""The notices a memory holds, delivered: queue (the write-ahead), then deliver what is due, then mark.

Why not ``tpuops.core.retry`` here: that policy retries within one call, sleeping; a notice is retried across
passes instead (one attempt per target per pass, bounded by ``NotifySettings.timeout_s``), so that no pass
waits on a receiver. What is retried is still decided by the taxonomy's ``retryable``: a 5xx, a 429, a
timeout or a refused connection waits for a later pass (``BACKOFF_S``, then gives up after
``give_up_after_s``); a 4xx, a refused recipient or a target gone from the config gives up at once. A target
held back (its URL malformed when the config was read: ``NotifyTarget.held``) is not tried at all: its deliveries
stay pending, neither counted as tries nor given up, until a process that reads it fixed sends them.

A pass's time is bounded whatever the receivers do (``Round``): a run's due deliveries go out at once, each
in its own thread, and the pass waits for each at most ``timeout_s`` (the socket's own timeout does not bound a
receiver that drips its answer, nor a name lookup); all the deliveries of one pass, over all its runs and
sweeps, take at most ``deliver_budget_s`` from the first one. A target that did not answer in time is skipped
for the rest of the pass, and what the budget leaves untried waits, not counted as a try, for the next pass.
A send still under way when its wait ends may reach the receiver later: the one allowed duplicate's case (the
delivery stays pending and is sent again, with the same key).

Isolation: a delivery that fails in any way, with any exception (``ISOLATED_DELIVERY``), fails that delivery
alone; nothing a notice, a record or a target holds reaches the pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from tpuops.core.errors import TpuopsError, TransientError
from tpuops.core.guards import Guard
from tpuops.core.notices import Delivery, Notice, NotifySettings, NotifyTarget, State, keep_last
from tpuops.notify import wire
from tpuops.notify.send import NoAnswer, send

BACKOFF_S = (30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""The wait before the n-th retry of one delivery (the last repeats)."""

MAX_TRIES = 8
"""Deliveries one run or sweep tries per pass (at once); what is left waits for the next pass."""

LATE_S = 0.5
"""How long past ``timeout_s`` the pass waits for a send, so that the socket's own timeout (the clearer error)
usually answers first."""

ISOLATED_DELIVERY = Guard("notify.isolated_delivery", "a delivery that fails in any way (any exception) fails "
                          "that delivery alone, never the controller pass or another run")

WRITE_AHEAD = Guard("notify.write_ahead", "a run's notice is sent only after the memory that decided it was written, "
                    "by compare-and-swap under its lease: one decision, one idempotency key (tpuops.controller)")
KEPT_UNTIL_TOLD = Guard("notify.kept_until_told", "a finished run stays in the passes' care until its notices are sent "
                        "or given up (tpuops.controller): none is left pending for good")

Note = Callable[[str, str], None]
"""Records one event about a notice: (event kind, message)."""


class Round:
    """One pass's deliveries, over all its runs and sweeps: the time they may take together
    (``budget_s``, counted from the first delivery), and the targets that did not answer in time.

    Thread-safe: a pass's runs deliver from the workers of its pool.
    """

    def __init__(self, budget_s: float, clock: Callable[[], float] | None = None) -> None:
        self.budget_s = budget_s
        self._clock = clock or (lambda: wire.current().now())  # the wire's: monotonic, or the swarm's virtual time
        self._ends: float | None = None
        self._silent: set[str] = set()
        self._lock = threading.Lock()

    def left(self) -> float:
        """Seconds left of the budget (starting it at the first call)."""
        with self._lock:
            now = self._clock()
            if self._ends is None:
                self._ends = now + self.budget_s
            return self._ends - now

    def silent(self, target: str) -> bool:
        """``target`` did not answer in time during this pass: skip it until the next one."""
        with self._lock:
            return target in self._silent

    def timed_out(self, target: str) -> None:
        with self._lock:
            self._silent.add(target)


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


def deliver(notices: list[Notice], config: NotifySettings, now: float, note: Note,
            round_: Round | None = None) -> bool:
    """Try every delivery due at ``now`` (at most ``MAX_TRIES``, at once), within the pass's ``round_`` (a round
    of its own when None); mark each sent, retried later, or given up. Whether any was tried.

    The caller writes the memory afterwards (the mark). Nothing here raises: a failure is the delivery's state.
    """
    round_ = round_ or Round(config.deliver_budget_s)
    held = config.held_back()  # a malformed URL: its deliveries wait, untried and not given up, until it is fixed
    chosen = [(notice, delivery) for notice in notices for delivery in notice.deliveries
              if delivery.state is State.PENDING and delivery.next_at <= now and not round_.silent(delivery.target)
              and delivery.target not in held]
    chosen = chosen[:MAX_TRIES]
    wait_s = min(config.timeout_s, round_.left()) if chosen else 0.0
    if wait_s <= 0:
        return False  # the pass's budget is spent: they wait for the next pass, untried
    targets: Mapping[str, NotifyTarget] = config.targets
    sends = [_Send(delivery.target, targets.get(delivery.target), notice, config.timeout_s)
             for notice, delivery in chosen]
    ends = wire.current().now() + wait_s + LATE_S
    for (notice, delivery), sending in zip(chosen, sends, strict=True):
        failure = sending.outcome(ends, wait_s)
        delivery.attempts += 1
        if failure is None:
            delivery.state, delivery.error = State.SENT, ""
            note("notified", f"{notice.kind} sent to {delivery.target} (key {notice.key})")
            continue
        if sending.late:
            round_.timed_out(delivery.target)
        _failed(notice, delivery, failure, config, now, note)
    return True


def _failed(notice: Notice, delivery: Delivery, err: TpuopsError, config: NotifySettings, now: float,
            note: Note) -> None:
    delivery.error = str(err)
    if err.retryable and now - notice.at < config.give_up_after_s:
        wait = BACKOFF_S[min(delivery.attempts, len(BACKOFF_S)) - 1]
        delivery.next_at = now + wait
        note("notify-failed", f"{notice.kind} to {delivery.target}: {err}; retrying after {wait:.0f} s")
    else:
        delivery.state = State.GAVE_UP
        note("notify-failed", f"{notice.kind} to {delivery.target}: {err}; given up")


class _Send:
    """One send started at once beside the pass (``wire.Wire.start``: a daemon thread of its own, so that a
    receiver that never answers cannot hold the process)."""

    def __init__(self, name: str, target: NotifyTarget | None, notice: Notice, timeout_s: float) -> None:
        self.name, self.target, self.notice, self.timeout_s = name, target, notice, timeout_s
        self.failure: BaseException | None = None
        self.late = False
        self._ended = wire.current().start(self._send, f"tpuops-notify-{name}")

    def _send(self) -> None:
        try:
            if self.target is None:
                raise TpuopsError(f"target {self.name!r} is no longer in [notify.targets]")
            send(self.target, self.notice, self.timeout_s)
        except BaseException as err:  # handed to the pass's thread, which decides (outcome)
            self.failure = err

    def outcome(self, ends: float, waited_s: float) -> TpuopsError | None:
        """None when sent by the wire's time ``ends`` (``waited_s`` after the send, give or take ``LATE_S``);
        else why not, in the taxonomy (``late``: no answer)."""
        if not self._ended(ends):
            self.late = True
            return NoAnswer(f"no answer within {waited_s:.3g} s")
        err = self.failure
        if err is None or isinstance(err, TpuopsError):
            self.late = isinstance(err, NoAnswer)
            return err
        if ISOLATED_DELIVERY.on and isinstance(err, Exception):  # a bug, or a target no check foresaw
            return TransientError(f"the delivery failed unexpectedly ({type(err).__name__})")
        raise err


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
    from tpuops.notify.rules import key

    notice = Notice(key=key(project, Kind.TEST, now), kind=Kind.TEST, at=now, scope="test", subject=project,
                    title=f"tpuops test message from project {project}",
                    details=["if you read this, tpuops can reach you here"])
    sends = [(name, target, _Send(name, target, notice, config.timeout_s)) for name, target in config.targets.items()]
    ends = wire.current().now() + config.timeout_s + LATE_S  # at once, as a pass sends them: one bound for all
    results = []
    for name, target, sending in sends:
        failure = sending.outcome(ends, config.timeout_s)
        results.append((name, target.kind, "sent" if failure is None else f"failed: {failure}"))
    return results
