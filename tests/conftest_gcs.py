"""fake-gcs-server fixtures: one in-memory server per test session on a free loopback port.

Use them from a test module with ``pytest_plugins = ["conftest_gcs"]``, or make them global
from ``tests/conftest.py`` with ``from conftest_gcs import fake_gcs, gcs_bucket  # noqa: F401``.
The server is a module-level singleton, so both ways together still start one process; it
is stopped when the session ends.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fake_gcs import FakeGcsServer

_SERVER: FakeGcsServer | None = None


def _shared_server() -> FakeGcsServer:
    global _SERVER  # noqa: PLW0603 - one server per test session, whichever fixture asks first
    if _SERVER is None:
        server = FakeGcsServer(backend="memory")
        server.start()
        _SERVER = server
    return _SERVER


def _close_shared_server() -> None:
    global _SERVER  # noqa: PLW0603
    if _SERVER is not None:
        _SERVER.close()
        _SERVER = None


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGcsServer]:
    """A running in-memory fake-gcs-server; use ``.endpoint`` with ``tpuops.store.gcs_client``."""
    yield _shared_server()
    _close_shared_server()


@pytest.fixture
def gcs_bucket(fake_gcs: FakeGcsServer) -> str:
    """A fresh, empty bucket on the session's server; its name."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    fake_gcs.create_bucket(name)
    return name
