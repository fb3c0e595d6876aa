"""The SQLite ledger: idempotent records, deduplicated transitions, incarnations, concurrent writers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpuops.billing.ledger import DELETED, SCHEMA_VERSION, Ledger, Sighting
from tpuops.config import Capacity
from tpuops.core import guards
from tpuops.core.clock import UTC
from tpuops.core.errors import NotFound, UsageError

pytestmark = pytest.mark.unit


P, Z = "proj", "us-central1-b"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "state" / "ledger.sqlite")


def test_created_on_first_use_with_wal_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "ledger.sqlite"
    Ledger(path)
    Ledger(path)  # opening again migrates nothing and fails nothing

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(UsageError, match="upgrade tpuops"):
        Ledger(path)


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.write_text("not sqlite at all, but long enough to have a header " * 4)
    with pytest.raises(UsageError, match="is not a tpuops ledger"):
        Ledger(path)


def test_record_node_is_idempotent(ledger: Ledger) -> None:
    first = ledger.record_node(P, Z, "n1", "v3-8", Capacity.SPOT, run_id="r1", uid="111", at=at(0))
    again = ledger.record_node(P, Z, "n1", "v3-8", "spot", run_id="r1", uid="111", at=at(5))

    assert again == first
    assert first.capacity == "spot"
    assert first.created_at == at(0)
    assert first.deleted_at is None
    assert [n.name for n in ledger.nodes()] == ["n1"]


def test_uid_less_record_adopts_the_uid_later(ledger: Ledger) -> None:
    before = ledger.record_node(P, Z, "n1", "v3-8", "spot")
    ledger.observe(P, Z, "n1", "CREATING")
    after = ledger.record_node(P, Z, "n1", "v3-8", "spot", uid="42")

    assert after.id == before.id
    assert after.uid == "42"
    assert [t.state for t in ledger.transitions(P, Z, "n1", uid="42")] == ["CREATING"]


def test_transitions_recorded_once_and_in_order(ledger: Ledger) -> None:
    ledger.record_node(P, Z, "n1", "v2-8", "preemptible", uid="1")
    states = ["CREATING", "CREATING", "READY", "READY", "READY", "PREEMPTED", "READY"]
    seen = [ledger.observe(P, Z, "n1", state, at(i)) for i, state in enumerate(states)]

    assert seen == [True, False, True, False, False, True, True]
    assert [(t.state, t.at) for t in ledger.transitions(P, Z, "n1")] == [
        ("CREATING", at(0)), ("READY", at(2)), ("PREEMPTED", at(5)), ("READY", at(6)),
    ]


def test_times_are_stored_in_utc(ledger: Ledger) -> None:
    ledger.record_node(P, Z, "n1", "v2-8", "spot")
    ledger.observe(P, Z, "n1", "READY", datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))))

    (ready,) = ledger.transitions(P, Z, "n1")
    assert ready.at == T0
    assert ready.at.utcoffset() == timedelta(0)
    with pytest.raises(ValueError, match="timezone-aware"):
        ledger.observe(P, Z, "n1", "READY", datetime(2024, 5, 1, 12, 0))


def test_observe_needs_a_recorded_node(ledger: Ledger) -> None:
    with pytest.raises(NotFound, match="record_node"):
        ledger.observe(P, Z, "ghost", "READY")
    assert ledger.transitions(P, Z, "ghost") == []


def test_mark_deleted_closes_once(ledger: Ledger) -> None:
    ledger.record_node(P, Z, "n1", "v2-8", "spot", uid="1")
    ledger.observe(P, Z, "n1", "READY", at(1))

    assert ledger.mark_deleted(P, Z, "n1", at(9)) is True
    assert ledger.mark_deleted(P, Z, "n1", at(10)) is False
    assert ledger.mark_deleted(P, Z, "never-made") is False
    (node,) = ledger.nodes()
    assert node.deleted_at == at(9)
    assert [(t.state, t.at) for t in ledger.transitions(P, Z, "n1")] == [("READY", at(1)), (DELETED, at(9))]
    assert ledger.nodes(open_only=True) == []


def test_a_closed_incarnation_takes_no_further_transition(ledger: Ledger) -> None:
    """A sighting older than the node's end (a listing that lags) re-opened it READY, and nothing closed it again:
    the ledger billed hours the cloud never did (the swarm's seeds 615 and 762). A deleted node never comes back."""
    ledger.record_node(P, Z, "n1", "v2-8", "spot", uid="1", at=at(0))
    ledger.observe(P, Z, "n1", "READY", at(1))
    ledger.mark_deleted(P, Z, "n1", at(9))
    assert ledger.observe(P, Z, "n1", "READY", at(10)) is False
    stale = Sighting(project=P, zone=Z, name="n1", accelerator="v2-8", capacity="spot", state="READY", uid="1",
                     at=at(11))
    assert ledger.observe_nodes([stale]) == 0
    assert [(t.state, t.at) for t in ledger.transitions(P, Z, "n1")] == [("READY", at(1)), (DELETED, at(9))]
    with guards.off("ledger.closed_stays_closed"):  # what the guard keeps out
        assert ledger.observe_nodes([stale]) == 1


def test_two_incarnations_of_one_name_are_kept_apart(ledger: Ledger) -> None:
    ledger.record_node(P, Z, "n1", "v3-8", "spot", run_id="r1", uid="1", at=at(0))
    ledger.observe(P, Z, "n1", "READY", at(1))
    ledger.observe(P, Z, "n1", "PREEMPTED", at(2))
    ledger.mark_deleted(P, Z, "n1", at(3))
    ledger.record_node(P, Z, "n1", "v3-8", "spot", run_id="r1", uid="2", at=at(4))
    ledger.observe(P, Z, "n1", "READY", at(5))

    assert [t.state for t in ledger.transitions(P, Z, "n1", uid="1")] == ["READY", "PREEMPTED", DELETED]
    assert [t.state for t in ledger.transitions(P, Z, "n1")] == ["READY"]
    assert [(n.uid, n.deleted_at) for n in ledger.nodes(run_id="r1")] == [("1", at(3)), ("2", None)]


def test_a_uid_less_record_takes_the_capacity_of_the_node_that_adopts_it(ledger: Ledger) -> None:
    """A spot create whose answer was lost (recorded, no node made), then the run moved to on-demand: the on-demand
    create finds the spot record still open and is merged into it. The node, once seen, is what its record prices."""
    ledger.record_node(P, Z, "n1", "v2-32", "spot", run_id="r1", at=at(0))
    ledger.record_node(P, Z, "n1", "v2-8", "on-demand", run_id="r1", at=at(3))
    ledger.observe_nodes([Sighting(P, Z, "n1", "v2-8", "on-demand", "READY", uid="42", run_id="r1", at=at(4))])

    (node,) = ledger.nodes()
    assert (node.uid, node.accelerator, node.capacity) == ("42", "v2-8", "on-demand")


def test_uid_less_incarnations_are_kept_apart_too(ledger: Ledger) -> None:
    first = ledger.record_node(P, Z, "n1", "v3-8", "spot")
    ledger.observe(P, Z, "n1", "READY")
    ledger.mark_deleted(P, Z, "n1")
    second = ledger.record_node(P, Z, "n1", "v3-8", "spot")

    assert second.id != first.id
    assert ledger.transitions(P, Z, "n1") == []


def test_a_new_uid_closes_a_vanished_incarnation(ledger: Ledger) -> None:
    ledger.record_node(P, Z, "n1", "v3-8", "spot", uid="1", at=at(0))
    ledger.observe(P, Z, "n1", "READY", at(1))
    ledger.record_node(P, Z, "n1", "v3-8", "spot", uid="2", at=at(7))

    old, new = ledger.nodes()
    assert (old.uid, old.deleted_at) == ("1", at(7))
    assert (new.uid, new.deleted_at) == ("2", None)
    assert [t.state for t in ledger.transitions(P, Z, "n1", uid="1")] == ["READY", DELETED]


def test_nodes_filters(ledger: Ledger) -> None:
    ledger.record_node(P, Z, "a", "v2-8", "spot", run_id="r1", sweep_id="s1")
    ledger.record_node(P, "us-central1-c", "b", "v2-8", "spot", run_id="r2", sweep_id="s1")
    ledger.record_node("other", Z, "c", "v2-8", "on-demand")

    assert [n.name for n in ledger.nodes(P)] == ["a", "b"]
    assert [n.name for n in ledger.nodes(P, Z)] == ["a"]
    assert [n.name for n in ledger.nodes(sweep_id="s1")] == ["a", "b"]
    assert [n.name for n in ledger.nodes(run_id="r2")] == ["b"]
    assert [n.name for n in ledger.nodes()] == ["a", "b", "c"]


def test_concurrent_observations_of_one_state_add_one_row(ledger: Ledger) -> None:
    ledger.record_node(P, Z, "n1", "v2-8", "spot")
    start = threading.Barrier(4)
    results: list[bool] = []

    def observe() -> None:
        start.wait()
        results.append(ledger.observe(P, Z, "n1", "READY"))

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results) == [False, False, False, True]
    assert [t.state for t in ledger.transitions(P, Z, "n1")] == ["READY"]


WRITER = """
import sys
from pathlib import Path
from tpuops.billing.ledger import Ledger

path, prefix, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
ledger = Ledger(path)
for i in range(count):
    name = f"{prefix}-{i}"
    ledger.record_node("proj", "us-central1-b", name, "v2-8", "spot")
    ledger.record_node("proj", "us-central1-b", "shared", "v2-8", "spot")
    for state in ("CREATING", "READY", "READY"):
        ledger.observe("proj", "us-central1-b", name, state)
    ledger.observe("proj", "us-central1-b", "shared", "READY")
"""


def test_two_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    path, count = tmp_path / "ledger.sqlite", 60
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), prefix, str(count)],
                                stderr=subprocess.PIPE, text=True) for prefix in ("a", "b")]
    errors = [writer.communicate(timeout=120)[1] for writer in writers]

    assert [writer.returncode for writer in writers] == [0, 0], errors
    ledger = Ledger(path)
    names = [n.name for n in ledger.nodes(P, Z)]
    assert len(names) == 2 * count + 1
    assert names.count("shared") == 1
    for prefix in ("a", "b"):
        for i in range(count):
            assert [t.state for t in ledger.transitions(P, Z, f"{prefix}-{i}")] == ["CREATING", "READY"]
    assert [t.state for t in ledger.transitions(P, Z, "shared")] == ["READY"]
