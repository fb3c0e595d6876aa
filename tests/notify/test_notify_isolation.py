"""No receiver, target or notice can crash a pass or hold it past its bound (issue 38: defect 2 and the dead
receiver), against real sockets on loopback: a receiver that never answers, one that drips its answer forever,
an SMTP server taking a message whose header no check foresaw.

``tpuops.notify.outbox.deliver`` is what every pass calls, per run and per sweep, with the pass's ``Round``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from helpers import poll
from receivers import SMTP_PASSWORD, SMTP_USER, HttpReceiver, http_receiver, smtp_receiver

from tpuops.core import guards
from tpuops.core.notices import Delivery, Kind, Notice, NotifySettings, NotifyTarget, State
from tpuops.notify.outbox import ISOLATED_DELIVERY, Round, deliver

pytestmark = pytest.mark.emulator  # loopback servers of its own

T0 = 1_900_000_000.0


def _notice(run: str, *targets: str) -> Notice:
    return Notice(key=f"{run}/failed/1900000000000", kind=Kind.FAILED, at=T0, subject=run, title=f"run {run} failed",
                  deliveries=[Delivery(target=name) for name in targets])


def _said() -> tuple[list[tuple[str, str]], object]:
    said: list[tuple[str, str]] = []
    return said, lambda kind, text: said.append((kind, text))


@pytest.fixture
def dead() -> Iterator[str]:
    """A webhook URL where a socket listens and never accepts: the connection is made, no answer ever comes."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hooks/dead"


@pytest.fixture
def dripping() -> Iterator[str]:
    """A webhook URL whose server answers one header byte every 0.1 s, forever: a socket timeout never fires."""
    stop = threading.Event()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.1)

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.1):
                try:
                    conn.sendall(b"X")
                except OSError:
                    return

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hooks/drip"
    finally:
        stop.set()
        server.close()


def _settings(timeout_s: float = 0.5, **urls: str) -> NotifySettings:
    return NotifySettings(timeout_s=timeout_s, targets={
        name: NotifyTarget(kind="webhook", url=url) for name, url in urls.items()})


def test_a_dead_receiver_costs_a_pass_one_timeout_and_is_skipped_for_the_rest_of_it(dead: str) -> None:
    with http_receiver() as hook:
        config = _settings(dead=dead, hook=hook.url)
        first, second = [_notice("run-a", "dead", "hook")], [_notice("run-b", "dead", "hook")]
        _, note = _said()
        one_pass = Round(config.deliver_budget_s)
        assert deliver(first, config, T0, note, one_pass)
        assert deliver(second, config, T0, note, one_pass)

        tried, skipped = first[0].deliveries[0], second[0].deliveries[0]
        assert (tried.state, tried.attempts, tried.error) == (State.PENDING, 1, "no answer within 0.5 s")
        assert tried.next_at == T0 + 30
        assert (skipped.state, skipped.attempts, skipped.next_at) == (State.PENDING, 0, 0.0)  # next pass, untried
        assert [d.state for d in (first[0].deliveries[1], second[0].deliveries[1])] == [State.SENT, State.SENT]
        assert len(hook.delivered) == 2

        assert deliver(second, config, T0 + 1, note, Round(config.deliver_budget_s))  # a new pass tries it again
        assert second[0].deliveries[0].attempts == 1


def test_a_receiver_that_drips_its_answer_holds_the_pass_no_longer_than_its_bound(dripping: str) -> None:
    config = _settings(drip=dripping)
    notices = [_notice("run-a", "drip")]
    said, note = _said()
    done = threading.Event()

    def passing() -> None:
        deliver(notices, config, T0, note)
        done.set()

    threading.Thread(target=passing, daemon=True).start()
    poll(done.is_set, "the delivery gives up waiting on the dripping receiver at its bound", timeout_s=60)
    delivery = notices[0].deliveries[0]
    assert (delivery.state, delivery.error) == (State.PENDING, "no answer within 0.5 s")
    assert said == [("notify-failed", "failed to drip: no answer within 0.5 s; retrying after 30 s")]


def test_what_a_spent_budget_leaves_waits_for_the_next_pass_untried() -> None:
    with http_receiver() as hook:
        config = _settings(hook=hook.url)
        clock = [0.0]
        one_pass = Round(10.0, clock=lambda: clock[0])
        notices = [_notice("run-a", "hook")]
        said, note = _said()
        assert one_pass.left() == 10.0  # the budget starts at the pass's first delivery
        clock[0] = 10.0
        assert not deliver(notices, config, T0, note, one_pass)
        assert (notices[0].deliveries[0].attempts, said, hook.delivered) == (0, [], [])
        assert deliver(notices, config, T0, note, Round(10.0))
        assert notices[0].deliveries[0].state is State.SENT


def _mail_hook(hook: HttpReceiver, port: int) -> NotifySettings:
    """A webhook and an email target whose recipient holds an LF: the config refuses that (test_notify_rules), so
    it stands here for what no check foresaw: building the message raises ValueError inside the send."""
    mail = NotifyTarget(kind="email", host="127.0.0.1", port=port, starttls=False, user=SMTP_USER,
                        password_env="SMTP_PASSWORD", sender="tpuops@localhost", to=["me@localhost"])
    mail = mail.model_copy(update={"to": ["me@localhost\nBcc: everyone@example.com"]})
    return NotifySettings(timeout_s=5, targets={"hook": NotifyTarget(kind="webhook", url=hook.url),
                                                "mail": mail.resolved(None, SMTP_PASSWORD, None)})


def test_a_delivery_that_raises_anything_fails_alone_and_the_guard_is_what_keeps_it_alone() -> None:
    with http_receiver() as hook, smtp_receiver() as smtp:
        config = _mail_hook(hook, smtp.port)
        notices = [_notice("run-a", "mail", "hook")]
        _, note = _said()
        assert deliver(notices, config, T0, note)
        mail, web = notices[0].deliveries
        assert (mail.state, mail.error, mail.next_at) == (State.PENDING, "the delivery failed unexpectedly "
                                                          "(ValueError)", T0 + 30)
        assert web.state is State.SENT and smtp.messages == [] and len(hook.delivered) == 1

        # the check can fail: without the guard, the pass would crash
        with guards.off(ISOLATED_DELIVERY.name), pytest.raises(ValueError, match="linefeed"):
            deliver([_notice("run-b", "mail")], config, T0, note)


def test_a_url_gone_bad_after_the_config_was_read_gives_that_delivery_up_and_says_no_secret() -> None:
    with http_receiver() as hook:
        target = NotifyTarget(kind="webhook", url_env="HOOK_URL").resolved(
            hook.url.replace("hooks/", "hooks/a b\r\n"), None, None)
        config = NotifySettings(targets={"hook": target})
        notices = [_notice("run-a", "hook")]
        said, note = _said()
        assert deliver(notices, config, T0, note)
        delivery = notices[0].deliveries[0]
        assert delivery.state is State.GAVE_UP and "a webhook URL holds a space" in delivery.error
        assert "hooks" not in delivery.error and all("hooks" not in text for _, text in said)
        assert hook.delivered == []
