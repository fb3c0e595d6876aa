"""One failure vocabulary for creates: an error inside a create operation is classified like the same error raised
by a call, and ``CreateResult.of`` says what it means for the run (fail over, ask again, give up)."""

from __future__ import annotations

import pytest

from tpuops.core.create_result import CreateResult
from tpuops.core.errors import (
    AlreadyExists,
    CapacityError,
    InvalidRequest,
    PermissionDenied,
    QuotaError,
    Timeout,
    TransientError,
)
from tpuops.providers.cloud_tpu.adapter import operation_error

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("code", "message", "kind", "result"), [
    (8, 'There is no more capacity in the zone "us-central1-a"', CapacityError, CreateResult.CAPACITY),
    (8, "Quota limit 'TPUV3sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded", QuotaError,
     CreateResult.FAILED),
    (14, "The service is currently unavailable", TransientError, CreateResult.RETRY),  # UNAVAILABLE
    (13, "Internal error", TransientError, CreateResult.RETRY),  # INTERNAL
    (4, "Deadline exceeded", TransientError, CreateResult.RETRY),  # DEADLINE_EXCEEDED
    (7, "Permission denied on the service account", PermissionDenied, CreateResult.FAILED),
    (6, "already exists", AlreadyExists, CreateResult.FAILED),
    (3, "v3-8 is not offered in us-central1-c", InvalidRequest, CreateResult.FAILED),
    (9, "failed precondition", InvalidRequest, CreateResult.FAILED),
])
def test_an_operation_error_gets_the_class_and_the_result_the_same_error_gets_from_a_call(
        code: int, message: str, kind: type, result: CreateResult) -> None:
    error = operation_error(code, message, "us-central1-a")
    assert type(error) is kind and str(error) == message
    assert CreateResult.of(error) is result


def test_a_timed_out_create_is_asked_again_and_a_stockout_names_its_zone() -> None:
    assert CreateResult.of(Timeout("operation did not finish within 1800 s")) is CreateResult.RETRY
    stockout = operation_error(8, "no capacity", "europe-west4-a")
    assert isinstance(stockout, CapacityError) and stockout.zone == "europe-west4-a"
    assert f"{CreateResult.RETRY}" == "retry" and CreateResult("capacity") is CreateResult.CAPACITY
