"""The one retry policy: exponential backoff with jitter, bounded by a deadline.

Only errors whose class says ``retryable`` are retried, so the decision of what is
transient lives in the taxonomy (``tpuops.core.errors``), not at each call site. The deadline
bounds total time, not attempts: a 503 storm that outlasts it ends with the last error. An
error class may cap that further (``retry_window_s``): an endpoint where nothing listens is
given seconds, not the whole deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_random_exponential

from tpuops.core.errors import TpuopsError

T = TypeVar("T")


def _is_retryable(err: BaseException) -> bool:
    return isinstance(err, TpuopsError) and err.retryable


def _stop_after(deadline_s: float) -> Callable[[RetryCallState], bool]:
    """Stop at the deadline, or sooner when the error's class caps how long it is worth retrying."""

    def stop(state: RetryCallState) -> bool:
        elapsed = state.seconds_since_start or 0.0
        err = state.outcome.exception() if state.outcome is not None else None
        window = getattr(err, "retry_window_s", None)
        return elapsed >= (deadline_s if window is None else min(deadline_s, window))

    return stop


def call_with_retry(
    fn: Callable[[], T],
    *,
    deadline_s: float = 120.0,
    initial_s: float = 0.5,
    max_wait_s: float = 20.0,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> T:
    """Call ``fn`` until it returns, raises a non-retryable error or the deadline passes.

    ``on_retry(error, wait_seconds)`` lets a caller show why it is waiting.
    """

    def _before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            err = state.outcome.exception()
            wait = state.next_action.sleep if state.next_action else 0.0
            if err is not None:
                on_retry(err, wait)

    retrying = Retrying(
        retry=retry_if_exception(_is_retryable),
        wait=wait_random_exponential(multiplier=initial_s, max=max_wait_s),
        stop=_stop_after(deadline_s),
        before_sleep=_before_sleep,
        reraise=True,
    )
    return retrying(fn)
