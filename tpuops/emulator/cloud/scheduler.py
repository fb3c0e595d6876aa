"""One timer thread that drives every delayed lifecycle transition.

Requests never sleep to make time pass: they schedule a callback here and return. Callbacks
run one at a time on this thread, so each must be quick (take the state lock, change
state, start or signal processes) and must check that the world is still the one it was
scheduled for (the emulator uses a per-node generation counter for that).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Scheduler:
    """Run callables at monotonic times on one daemon thread."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="emulator-scheduler", daemon=True)
        self._thread.start()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` after ``delay_s`` seconds (ignored once the scheduler is closed)."""
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq), fn))
            self._cond.notify()

    def close(self) -> None:
        """Drop pending callbacks and stop the thread."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                if self._closed:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:
                log.exception("scheduled callback failed")
