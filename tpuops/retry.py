"""The one retry policy: exponential backoff with jitter, bounded by a deadline.

Only errors whose class says ``retryable`` are retried, so the decision of what is
transient lives in the taxonomy (``tpuops.errors``), not at each call site. The deadline
bounds total time, not attempts: a 503 storm that outlasts it ends with the last error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from tpuops.errors import TpuopsError

T = TypeVar("T")


def _is_retryable(err: BaseException) -> bool:
    return isinstance(err, TpuopsError) and err.retryable


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
        stop=stop_after_delay(deadline_s),
        before_sleep=_before_sleep,
        reraise=True,
    )
    return retrying(fn)
