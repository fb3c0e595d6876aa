"""Where tpuops reads the time from: one injectable clock, so that a simulation runs the real code in virtual time.

A ``Clock`` is a callable returning epoch seconds. Production code gets ``system_clock`` (wall time);
the virtual-time simulation (``tpuops.sim``) hands the same components (``Fleet``, ``Controller``,
its provider) one ``VirtualClock`` that it moves forward itself. Only what dates things in the
domain (ledger transitions, controller decisions, sweep passes) reads it; timeouts of real waits on
real I/O stay on the monotonic clock of the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

UTC = timezone.utc  # datetime.UTC exists from Python 3.11 only

Clock = Callable[[], float]
"""Epoch seconds now."""


def system_clock() -> float:
    """Wall time: the clock of everything that is not a simulation."""
    return time.time()


def utc_now(clock: Clock) -> datetime:
    """``clock``'s now as a timezone-aware UTC datetime (what the ledger stores)."""
    return datetime.fromtimestamp(clock(), UTC)


class VirtualClock:
    """A clock that moves only when told to, never backwards. Thread-safe."""

    def __init__(self, start: float) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance_to(self, when: float) -> None:
        """Move to ``when``; a time already past is a bug in the caller (ValueError)."""
        with self._lock:
            if when < self._now:
                raise ValueError(f"a virtual clock does not go back: {when} < {self._now}")
            self._now = when
