"""The store journal keeps Optuna's contract for storages and what Optuna's journal backends promise.

Optuna's own ``StorageTestCase`` (shipped in ``optuna.testing``) runs over a ``JournalStorage`` on
``StoreJournal`` in both stores. The backend pickles, and ``append_logs`` keeps every log when many
threads share one backend and when many processes append at once.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers import local_or_gcs_store
from lanes import LOCAL_AND_GCS
from optuna.storages import BaseStorage, JournalStorage
from optuna.testing.pytest_storages import StorageTestCase

from tpuops.store import Store
from tpuops.sweeps.journal import StoreJournal

THREADS, APPENDS = 10, 20
PROCESSES, PROCESS_APPENDS = 4, 15

_COUNTER = iter(range(10**6))


@pytest.fixture(params=LOCAL_AND_GCS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return local_or_gcs_store(request, tmp_path)


def _journal(store: Store) -> StoreJournal:
    return StoreJournal(store, f"sweeps/contract-{next(_COUNTER)}/journal")


class TestOptunaStorageContract(StorageTestCase):
    """Every test of Optuna's storage contract, over the journal in the store."""

    @pytest.fixture
    def storage(self, store: Store) -> BaseStorage:
        return JournalStorage(_journal(store))


def test_a_backend_pickles_and_its_copy_reads_and_appends_the_same_journal(store: Store) -> None:
    backend = _journal(store)
    backend.append_logs([{"n": 0}])
    copy = pickle.loads(pickle.dumps(backend))
    assert copy.read_logs(0) == [{"n": 0}]
    copy.append_logs([{"n": 1}])
    assert backend.read_logs(0) == [{"n": 0}, {"n": 1}]


def _logs_of(tag: str, count: int) -> list[list[dict[str, Any]]]:
    return [[{"writer": tag, "i": i}] for i in range(count)]


def _readable(backend: StoreJournal) -> Callable[[], list[tuple[str, int]]]:
    fresh = StoreJournal(backend.store, backend.prefix)
    return lambda: sorted((log["writer"], log["i"]) for log in fresh.read_logs(0))


def test_appends_from_many_threads_through_one_backend_are_all_readable(store: Store) -> None:
    backend = _journal(store)
    with ThreadPoolExecutor(THREADS) as pool:
        for tag in range(THREADS):
            pool.submit(lambda t=tag: [backend.append_logs(logs) for logs in _logs_of(str(t), APPENDS)])
    expected = sorted((str(t), i) for t in range(THREADS) for i in range(APPENDS))
    assert _readable(backend)() == expected
    assert sorted((log["writer"], log["i"]) for log in backend.read_logs(0)) == expected


def _append_all(backend: StoreJournal, tag: str) -> None:
    for logs in _logs_of(tag, PROCESS_APPENDS):
        backend.append_logs(logs)


def test_appends_from_many_processes_at_once_are_all_readable(store: Store) -> None:
    backend = _journal(store)
    context = multiprocessing.get_context("spawn")  # the backend reaches each process pickled
    workers = [context.Process(target=_append_all, args=(backend, f"p{n}")) for n in range(PROCESSES)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES
    assert _readable(backend)() == sorted((f"p{n}", i) for n in range(PROCESSES) for i in range(PROCESS_APPENDS))
