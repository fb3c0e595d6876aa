"""One reconcile pass, without a server: runs with nothing to do are settled in the pass's thread, the
runs it acts on are acted on concurrently, and the report still reads in index order.

The cloud here is the in-memory provider (``tpuops.providers.memory``, held to the same contract as
the Cloud TPU adapter), whose deletes can be held until the test releases them; the fleet, the store,
the ledger, the leases and the controller are the real ones. ``tests/controller/test_controller_churn.py`` shows
the same on the emulator.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import LIVE, controller_over, declare_run, poll, write_status

from tpuops import runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller import reconcile
from tpuops.controller.reconcile import Controller, PassReport, _inline_or_pooled
from tpuops.core.errors import TransientError
from tpuops.fleet import Fleet
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.nodes import NodeState
from tpuops.store import open_store

pytestmark = pytest.mark.unit

ZONE = "us-central1-b"
WAIT_S = 60.0  # how long a held delete may hold a pass here before its wait fails (never reached when passing)
DONE = {**LIVE, "phase": "done", "exit_class": "succeeded", "step": 1000}


@dataclass
class World:
    settings: Settings
    store: Any
    cloud: MemoryProvider
    controller: Controller

    def declare(self, *run_ids: str) -> None:
        """Train runs as ``jobs.declare`` leaves them, their agents training."""
        for run_id in run_ids:
            declare_run(self.settings, self.store, run_id, ZONE)

    def status(self, run_id: str, fields: dict[str, Any]) -> None:
        write_status(self.store, run_id, fields)

    def running(self, *run_ids: str) -> None:
        """Declared, created and seen READY: from here on a pass has nothing to do for them."""
        self.declare(*run_ids)
        first = self.controller.run_pass()
        assert sorted(first.acted) == [(run_id, "create", ZONE) for run_id in sorted(run_ids)], first
        for run_id in run_ids:
            self.cloud.set_state(ZONE, run_id, NodeState.READY)
        assert not self.controller.run_pass().acted

    def generations(self, *run_ids: str) -> list[int]:
        return [runs.load_memory(self.store, run_id)[1] for run_id in run_ids]

    def pass_calls(self) -> tuple[PassReport, list[tuple[str, str, str]]]:
        """One pass and the cloud calls it made."""
        before = len(self.cloud.calls)
        report = self.controller.run_pass()
        return report, self.cloud.calls[before:]


@pytest.fixture
def world(tmp_path: Path) -> World:
    settings = Settings(zones=[ZONE], home=tmp_path / "home", store=str(tmp_path / "store"), lease_ttl_s=3600.0,
                        operation_timeout_s=WAIT_S, max_run_hours=0)
    store, cloud = open_store(settings.store_root), MemoryProvider(poll_interval_s=0.01)
    controller = controller_over(settings, store, Fleet(cloud, settings, Ledger(settings.ledger_path)), sweeps=None,
                                 holder="test", status_refresh_s=0.0)
    return World(settings, store, cloud, controller)


def test_inline_or_pooled_pools_only_what_inline_leaves_and_keeps_the_order() -> None:
    caller = threading.current_thread().name
    both = threading.Barrier(2, timeout=WAIT_S)  # two workers at once, or it breaks
    running, most = [0], [0]
    lock = threading.Lock()

    def pooled(item: str) -> str:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        both.wait()
        with lock:
            running[0] -= 1
        return f"{item}:{threading.current_thread().name}"

    items = ["a", "b", "c", "d", "e"]
    done = _inline_or_pooled(items, lambda item: f"{item}:{threading.current_thread().name}" if item in "ace" else None,
                             pooled, workers=2)
    assert list(done) == items
    assert [done[item] for item in "ace"] == [f"{item}:{caller}" for item in "ace"]
    assert all(not done[item].endswith(caller) for item in "bd")
    assert most[0] == 2


def test_a_quiet_pass_costs_one_listing_and_writes_nothing(world: World) -> None:
    world.running("run-a", "run-b", "run-c")
    before = world.generations("run-a", "run-b", "run-c")
    report, calls = world.pass_calls()
    assert (report.runs, report.acted, report.errors) == (3, [], {})
    assert [rpc for rpc, _, _ in calls] == ["ListNodes"]
    assert world.generations("run-a", "run-b", "run-c") == before


def test_a_held_delete_does_not_hold_up_another_runs_replacement(world: World) -> None:
    world.running("run-a", "run-b", "run-c")
    for run_id in ("run-a", "run-b"):
        world.cloud.set_state(ZONE, run_id, NodeState.PREEMPTED)
    gate = world.cloud.hold(ZONE, "run-a")
    world.cloud.on_create = lambda name: gate.set() if name == "run-b" else None  # a's delete ends after b's create

    report, calls = world.pass_calls()
    assert report.errors == {}
    assert report.acted == [("run-a", "delete", ZONE), ("run-a", "create", ZONE),
                            ("run-b", "delete", ZONE), ("run-b", "create", ZONE)]  # index order, as before
    acts = [(rpc, name) for rpc, name, _ in calls if rpc != "ListNodes"]
    assert acts.index(("CreateNode", "run-b")) < acts.index(("CreateNode", "run-a"))
    caller = threading.current_thread().name
    assert all(thread != caller for rpc, _, thread in calls if rpc != "ListNodes")  # in the pool
    assert {n.name: n.state for n in world.cloud.nodes.values()} == {
        "run-a": NodeState.CREATING, "run-b": NodeState.CREATING, "run-c": NodeState.READY}
    for run_id in ("run-a", "run-b"):
        kinds = [e["kind"] for e in runs.load_memory(world.store, run_id)[0].events]
        assert kinds[-2:] == ["preempted", "create"], (run_id, kinds)


def test_one_runs_failure_is_its_own(world: World) -> None:
    world.running("run-a", "run-b", "run-c")
    world.status("run-a", DONE)  # a succeeded: its node is deleted, and that delete fails this pass
    world.cloud.faults[("DeleteNode", "run-a")] = TransientError("503 from DeleteNode")
    world.cloud.set_state(ZONE, "run-b", NodeState.PREEMPTED)
    before = world.generations("run-a")

    report, _ = world.pass_calls()
    assert report.runs == 3
    assert report.errors == {"run-a": "503 from DeleteNode"}
    assert report.acted == [("run-a", "delete", ZONE), ("run-b", "delete", ZONE), ("run-b", "create", ZONE)]
    assert report.finished == {}  # its memory was not saved: the next pass decides again
    assert world.generations("run-a") == before

    del world.cloud.faults[("DeleteNode", "run-a")]
    report, _ = world.pass_calls()
    assert (report.errors, report.acted, report.finished) == ({}, [("run-a", "delete", ZONE)],
                                                              {"run-a": "succeeded"})


def test_an_interrupted_pass_starts_no_more_runs_and_stops_waiting(world: World,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (SIGINT) while a replacement waits for its delete: the pass raises at once, the run queued
    behind it is not started, and the waiting run gives up its wait and leaves the create to the next pass."""
    world.running("run-a", "run-b")
    monkeypatch.setattr(reconcile, "MAX_ACTING", 1)  # run-b queues behind run-a
    for run_id in ("run-a", "run-b"):
        world.cloud.set_state(ZONE, run_id, NodeState.PREEMPTED)
    world.cloud.hold(ZONE, "run-a")  # never released

    before = len(world.cloud.calls)

    def press_ctrl_c() -> None:
        poll(lambda: ("GetOperation", "run-a") in [call[:2] for call in world.cloud.calls[before:]],
             "run-a waiting for its delete")
        os.kill(os.getpid(), signal.SIGINT)

    # Ctrl-C as a terminal's program has it: a process started in the background by a non-interactive shell (a
    # CI job's `make test &`, nohup) inherits SIGINT ignored, and Python then leaves it ignored.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    waiting = threading.Thread(target=press_ctrl_c)
    try:
        waiting.start()
        with pytest.raises(KeyboardInterrupt):
            world.controller.run_pass()
        waiting.join()
    finally:
        signal.signal(signal.SIGINT, inherited)
    poll(lambda: "create-failed" in [e["kind"] for e in runs.load_memory(world.store, "run-a")[0].events],
         "run-a's worker to give up its wait and save that")
    # Not held until the wait's timeout (which would say "did not finish within"): the interruption ended it.
    [failed] = [e for e in runs.load_memory(world.store, "run-a")[0].events if e["kind"] == "create-failed"]
    assert "the pass was interrupted" in failed["message"], failed
    assert [rpc for rpc, name, _ in world.cloud.calls[before:] if name == "run-b"] == []  # never started
    assert (ZONE, "run-a") in world.cloud.nodes  # still DELETING: its create waits for the next pass


def test_a_finished_runs_node_is_deleted_while_another_zones_listing_still_fails(tmp_path: Path) -> None:
    """A run's agent ended, its node READY in one zone, while the API keeps failing another zone's ListNodes (held
    here until released): the node is deleted in that very pass, before the other zone's listing is in, and the
    run finishes with no second delete. Before, the delete waited for every zone's listing (retries included)."""
    other = "us-central1-c"
    settings = Settings(zones=[ZONE, other], home=tmp_path / "home", store=str(tmp_path / "store"),
                        lease_ttl_s=3600.0, operation_timeout_s=WAIT_S, max_run_hours=0)
    store, cloud = open_store(settings.store_root), MemoryProvider(poll_interval_s=0.01)
    world = World(settings, store, cloud, controller_over(settings, store, Fleet(cloud, settings,
                                                                            Ledger(settings.ledger_path)),
                                                          sweeps=None, holder="test", status_refresh_s=0.0))
    world.running("r-1")
    world.status("r-1", {**DONE, "ended": datetime.now(timezone.utc).isoformat()})
    failing = cloud.hold_list(other)
    passed: list[PassReport] = []
    worker = threading.Thread(target=lambda: passed.append(world.controller.run_pass()))
    worker.start()
    try:
        poll(lambda: ("DeleteNode", "r-1") in [call[:2] for call in cloud.calls], timeout_s=WAIT_S,
             what="the finished run's node deleted while the other zone's listing is held")
        assert worker.is_alive() and (ZONE, "r-1") not in cloud.nodes
    finally:
        failing.set()
        worker.join(WAIT_S)
    [report] = passed
    assert report.acted == [("r-1", "delete", ZONE)] and report.finished == {"r-1": "succeeded"}
    assert [call[:2] for call in cloud.calls].count(("DeleteNode", "r-1")) == 1


class _Lagging(MemoryProvider):
    """The in-memory cloud, whose listings can lag behind (``behind``: they leave out every node), and which lists the
    operations on a node (none deletes it: it lives)."""

    behind = False

    def list_nodes(self, zone: str) -> list[Any]:
        return [] if self.behind else super().list_nodes(zone)

    def node_operations(self, zone: str, name: str) -> list[Any]:
        return []


def test_a_finished_run_whose_live_node_a_lagging_listing_leaves_out_stays_indexed_until_its_node_goes(
        tmp_path: Path) -> None:
    """A run stopped while the listing lags: its node, which the listing leaves out, is looked up (GetNode) before the
    finished run leaves the index, found, and deleted as any ended run's. Before, the next pass dropped the finished run
    on the listing that left its node out, and nothing deleted the node (the swarm's seed 150: a $1 budget run billed
    $16.40, to its job's own end)."""
    settings = Settings(zones=[ZONE], home=tmp_path / "home", store=str(tmp_path / "store"), lease_ttl_s=3600.0,
                        operation_timeout_s=WAIT_S, max_run_hours=0)
    store, cloud = open_store(settings.store_root), _Lagging(poll_interval_s=0.01)
    world = World(settings, store, cloud, controller_over(settings, store, Fleet(cloud, settings,
                                                                            Ledger(settings.ledger_path)),
                                                          sweeps=None, holder="test", status_refresh_s=0.0))
    world.running("r-1")
    runs.request_stop(store, "r-1", "stop by the user", datetime.now(timezone.utc).timestamp())
    cloud.behind = True
    assert world.controller.run_pass().acted == [] and "r-1" in runs.active_run_ids(store)  # the stop, its node unseen
    assert runs.load_memory(store, "r-1")[0].outcome == "stopped"
    assert world.controller.run_pass().acted == [("r-1", "delete", ZONE)]  # looked up before the run leaves the index
    poll(lambda: (ZONE, "r-1") not in cloud.nodes, "the stopped run's node deleted", timeout_s=WAIT_S)
    cloud.behind = False
    world.controller.run_pass()
    assert "r-1" not in runs.active_run_ids(store)
