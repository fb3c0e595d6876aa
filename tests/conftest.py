"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest_gcs import fake_gcs, gcs_bucket  # noqa: F401  (fixtures: fake-gcs-server for the store tests)
from helpers import poll
from lanes import pytest_collection_modifyitems  # noqa: F401  (every test has a lane)

T = TypeVar("T")

# ----- local Cloud TPU emulator (tpuops.emulator) -------------------------------------------
# `emulator` starts one on a free port for a test and stops it (and every process it started);
# `tpu_client` is the official google-cloud-tpu REST client pointed at it; `finish` waits for a
# long-running operation with fast polling (the client's default starts at 1 s); `wait_until`
# polls a condition with a deadline, since tests never sleep to synchronise.

EMULATOR_PROJECT = "proj-test"


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Any]:
    from tpuops.emulator import control

    state_dir = tmp_path / "emulator"
    info = control.start_background(state_dir, port=0, boot_delay_s=0.2, grace_s=2.0, timeout_s=30.0)
    try:
        yield info
    finally:
        control.stop(state_dir)


@pytest.fixture
def tpu_client(emulator: Any) -> Any:
    """The official client with the emulator's bearer token (tests of --no-auth make their own)."""
    from google.cloud import tpu_v2
    from google.oauth2.credentials import Credentials

    return tpu_v2.TpuClient(
        credentials=Credentials(emulator.token), transport="rest", client_options={"api_endpoint": emulator.endpoint}
    )


@pytest.fixture
def emulator_admin(emulator: Any) -> Any:
    from tpuops.emulator.control import AdminClient

    return AdminClient(emulator.endpoint)


@pytest.fixture
def finish() -> Callable[..., Any]:
    """``finish(operation, timeout=120)``: the operation's result, polled every 50-200 ms.

    The deadlines here and in ``wait_until`` are for a test that has already failed: a passing one
    returns as soon as its condition holds, so they are long enough for a machine that 6 test runs load.
    """
    from google.api_core.future import polling

    fast = polling.DEFAULT_POLLING.with_delay(initial=0.05, maximum=0.2, multiplier=1.5)

    def _finish(operation: Any, timeout: float = 120.0) -> Any:
        return operation.result(timeout=timeout, polling=fast)

    return _finish


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """``wait_until(condition, timeout=60)``: poll until ``condition()`` is truthy, return it."""

    def _wait_until(condition: Callable[[], T], timeout: float = 60.0, interval: float = 0.05) -> T:
        return poll(condition, str(condition), timeout, interval)

    return _wait_until
