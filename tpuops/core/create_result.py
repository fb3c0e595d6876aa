"""``CreateResult``: the one vocabulary for where a node create stands.

Whether the request was refused at once or its long-running operation ended with an error,
both are classified by ``CreateResult.of`` from the error's class (``tpuops.core.errors``), so the
controller decides on one value however the failure arrived.
"""

from __future__ import annotations

from tpuops.core.errors import CapacityError, Timeout, TpuopsError
from tpuops.core.kinds import ValueEnum


class CreateResult(ValueEnum):
    """Where a create request stands, and what a failed one means for the run."""

    RUNNING = "running"  # the operation has not finished
    OK = "ok"  # the node was made (or the operation is gone: the listing decides)
    CAPACITY = "capacity"  # stockout: block the zone, fail over to the next one
    RETRY = "retry"  # transient (UNAVAILABLE, INTERNAL, DEADLINE_EXCEEDED, a timeout): ask again
    FAILED = "failed"  # quota, permission, an invalid request: finish the run, never retry

    @classmethod
    def of(cls, err: TpuopsError) -> CreateResult:
        if isinstance(err, CapacityError):
            return cls.CAPACITY
        if err.retryable or isinstance(err, Timeout):
            return cls.RETRY
        return cls.FAILED
