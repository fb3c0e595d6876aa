"""Where a delivery meets the network and the clock: the one seam a simulated receiver stands in at.

``Wire`` is the real thing, and the only one the product uses: ``urllib`` for a webhook's POST, the
monotonic clock for a pass's delivery budget (``outbox.Round``), and a daemon thread per send, waited for
until a monotonic deadline. The fault swarm (``tpuops.sim.swarm.receivers``) puts a wire of its own in for
the length of a seed (``wired``): its POST is answered by simulated receivers at once, its clock is virtual,
and a send runs inline and "takes" the virtual time its receiver holds it. Everything else, the bodies and
headers, the mapping of answers to the error taxonomy, the outbox's round, bound, skip of a silent target,
retries and give-up, is the real code either way.

One wire at a time per process (a module-level choice, as the swarm plays one seed at a time per process).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Waiter = Callable[[float], bool]
"""Waits for one started send until the wire's time ``until``; whether it ended by then."""


class Wire:
    """Real sockets and real time (the module docstring)."""

    def post(self, request: urllib.request.Request, timeout_s: float) -> None:
        """Send ``request`` and read the answer within ``timeout_s``; raise what ``urlopen`` raises."""
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            answer.read()

    def now(self) -> float:
        """The clock a pass's deliveries are bounded by (monotonic seconds)."""
        return time.monotonic()

    def start(self, work: Callable[[], None], name: str) -> Waiter:
        """Run ``work`` (one send, which never raises) beside the caller, at once; how to wait for it."""
        done = threading.Event()

        def run() -> None:
            try:
                work()
            finally:
                done.set()

        threading.Thread(target=run, daemon=True, name=name).start()  # a daemon: a receiver cannot hold the process
        return lambda until: done.wait(max(0.0, until - self.now()))


_current: list[Wire] = [Wire()]


def current() -> Wire:
    """The wire deliveries go through now."""
    return _current[-1]


@contextmanager
def wired(wire: Wire) -> Iterator[Wire]:
    """Deliveries go through ``wire`` for the block (the fault swarm's simulated receivers)."""
    _current.append(wire)
    try:
        yield wire
    finally:
        _current.remove(wire)
