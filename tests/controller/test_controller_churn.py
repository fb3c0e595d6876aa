"""The controller under churn, on the emulator: replacements in one pass, and a ledger that bills what Cloud TPU bills.

Four runs under one ``watch``-style loop of real ``Controller`` passes, preempted 0, 1, 3 and 10
times, then told by their agent's status that they succeeded (the controller deletes the node).
Their nodes run a startup script that exits at once: billing needs READY time, not TensorFlow,
so the whole test takes about as long as the READY time of its busiest run (~50 s).

Checked: each preemption is replaced in the pass that notices it (that pass deletes the node and
creates its replacement, with the two events at that pass's time), and the cost ledger dates each
node's READY time as the emulator bills it: the start by the create operation's end and the end of a
deleted node by the delete operation's start, each within one pass (a sighting is stamped when its
listing arrives, and the operation's time is kept after the sighting before it), and the end of a
preempted node within the two passes that frame its preemption (nothing in the API dates one; the
ledger places it between the last sighting as READY and the first as PREEMPTED). The windows are
those of the passes as they ran, so a loaded machine, whose passes are slower, widens them rather
than failing the test; the
ledger's total against billing is printed (docs/benchmarks.md's 2 % is measured on a quiet machine, by
``bench/bench_goodput.py``). And with one delete held
(the emulator's ``hold_deletes``), as slow as a delete on Cloud TPU, another run's replacement
still goes out in the same pass, while that pass waits for the held one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import controller_over, poll, settings_at

from tpuops import runs
from tpuops.billing.cost import catalog_for, node_cost, ready_intervals
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.reconcile import Controller, PassReport
from tpuops.core.clock import UTC
from tpuops.core.kinds import Capacity
from tpuops.fleet import Fleet
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.runs import NodeSpec, RunKind, RunRecord
from tpuops.store import open_store

pytestmark = pytest.mark.emulator


PROJECT, ZONE = "tpuops-local", "us-central1-b"
PASS_S = 0.05  # the loop's pause between passes
ENV = {"zones": ZONE, "poll_interval_s": PASS_S, "operation_timeout_s": 300, "max_run_hours": 0}
HOLD_S = 4.0  # READY time each node accrues before it is preempted or the run ends
SCENARIOS = {"churn-0": 0, "churn-1": 1, "churn-3": 3, "churn-10": 10}  # run -> preemptions
QUICK_SCRIPT = "#!/bin/bash\nexit 0\n"
LIVE = {"command": "train", "attempt": 1, "phase": "training", "step": 10, "total_steps": 1000}


def _accrue(seconds: float) -> None:
    """Let billable READY time pass: the time itself is what is measured, not a synchronisation."""
    time.sleep(seconds)


def _declare(settings: Settings, store: Any, run_id: str) -> None:
    """A train run as ``jobs.declare`` leaves it, its node's startup script swapped for one that exits at once."""
    request = plan_up(settings, run_id, accelerator="v2-8", capacity=Capacity.SPOT, zone=ZONE, run_id=run_id).request
    request = request.model_copy(update={"metadata": {"startup-script": QUICK_SCRIPT}})
    record = RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=NodeSpec.of(request, [ZONE]), experiment="churn")
    store.write_bytes(runs.record_key(run_id), record.model_dump_json().encode())
    store.write_bytes(runs.status_key(run_id), runs.AgentStatus.model_validate({**LIVE, "run_id": run_id})
                      .model_dump_json().encode())
    runs.mark_active(store, run_id)


@dataclass
class Watch:
    """``tpuops watch`` in a thread: passes ``PASS_S`` apart until every run is finished and its node gone."""

    controller: Controller
    reports: list[PassReport] = field(default_factory=list)
    spans: list[tuple[datetime, datetime]] = field(default_factory=list)  # each pass's start and end
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="watch", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.done.is_set():
                started = datetime.now(UTC)
                self.reports.append(self.controller.run_pass())
                self.spans.append((started, datetime.now(UTC)))
                self.done.wait(PASS_S)
        except BaseException as err:
            self.error = err

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=60)
        if self.error is not None:
            raise self.error


@pytest.fixture
def watched(emulator: Any, tmp_path: Path) -> Iterator[tuple[Settings, Any, Ledger, Watch]]:
    settings = settings_at(tmp_path, **ENV)
    store = open_store(settings.store_root)
    ledger = Ledger(settings.ledger_path)
    api = TpuApi(PROJECT, endpoint=emulator.endpoint, token=emulator.token, poll_interval_s=PASS_S, deadline_s=20)
    for run_id in SCENARIOS:
        _declare(settings, store, run_id)
    # the status is read every pass: a real agent's end also shows as its node deleting itself
    watch = Watch(controller_over(settings, store, Fleet(api, settings, ledger), sweeps=None, status_refresh_s=PASS_S))
    try:
        yield settings, store, ledger, watch
    finally:
        watch.done.set()


def _ready_uid(admin: Any, run_id: str, not_in: set[str]) -> str | None:
    """The uid of the run's node once it is READY and none of ``not_in``."""
    node = next((n for n in admin.nodes() if n["name"].endswith(f"/nodes/{run_id}")), None)
    if node is None or node["state"] != "READY" or node["preempting"] or node["uid"] in not_in:
        return None
    return str(node["uid"])


def _play(admin: Any, store: Any, run_id: str, preemptions: int, failures: list[BaseException]) -> None:
    """The cloud and the agent of one run: each node accrues ``HOLD_S`` and is preempted, the last one succeeds."""
    try:
        seen: set[str] = set()
        for number in range(preemptions + 1):
            seen.add(poll(lambda: _ready_uid(admin, run_id, seen), f"{run_id}: node {number + 1} READY",
                          interval_s=0.1))
            _accrue(HOLD_S)
            if number < preemptions:
                admin.preempt(PROJECT, ZONE, run_id, grace_s=0.0)
        done = {**LIVE, "run_id": run_id, "phase": "done", "exit_class": "succeeded", "step": 1000}
        store.write_bytes(runs.status_key(run_id), runs.AgentStatus.model_validate(done).model_dump_json().encode())
    except BaseException as err:
        failures.append(err)


def test_churn_is_replaced_in_one_pass_and_billed_as_cloud_tpu_bills(
        watched: tuple[Settings, Any, Ledger, Watch], emulator_admin: Any) -> None:
    settings, store, ledger, watch = watched
    failures: list[BaseException] = []
    players = [threading.Thread(target=_play, args=(emulator_admin, store, run_id, count, failures))
               for run_id, count in SCENARIOS.items()]
    for player in players:
        player.start()
    for player in players:
        player.join(timeout=120)
    assert not failures, failures

    def ended() -> bool:
        memories = [runs.load_memory(store, run_id)[0] for run_id in SCENARIOS]
        gone = not any(n["name"].rsplit("/", 1)[-1] in SCENARIOS for n in emulator_admin.nodes())
        return gone and all(m.finished for m in memories)

    poll(ended, "every run finished and its node gone")
    watch.stop()

    truth = emulator_admin.billing()
    catalog = catalog_for(settings)
    now = datetime.now(UTC)
    longest = max(end - start for start, end in watch.spans)  # the longest pass
    for run_id, preemptions in SCENARIOS.items():
        memory = runs.load_memory(store, run_id)[0]
        kinds = [e["kind"] for e in memory.events if e["kind"] in ("create", "preempted", "vanished", "finished")]
        assert kinds == ["create", *["preempted", "create"] * preemptions, "finished"], (run_id, kinds)
        assert (memory.outcome, memory.preemptions, memory.attempts) == ("succeeded", preemptions, preemptions + 1)
        # the pass that noticed each preemption created the replacement (events at that pass's time)
        noticed = [e["at"] for e in memory.events if e["kind"] == "preempted"]
        created = [e["at"] for e in memory.events if e["kind"] == "create"][1:]
        assert noticed == created, run_id
        replaced = [k for k, r in enumerate(watch.reports) if (run_id, "delete", ZONE) in r.acted
                    and (run_id, "create", ZONE) in r.acted]
        assert len(replaced) == preemptions, run_id

        billed = {i["node_uid"]: i for i in truth if i["node"].endswith(f"/nodes/{run_id}")}
        assert len(billed) == preemptions + 1 and all(i["end"] is not None for i in billed.values())
        histories = ledger.histories(PROJECT, run_id=run_id)
        assert [h.node.uid for h in histories] and set(billed) == {h.node.uid for h in histories}, run_id
        for number, history in enumerate(histories):
            [ours] = ready_intervals(history.transitions, now)
            interval = billed[history.node.uid]
            truth_start, truth_end = _instant(interval["start"]), _instant(interval["end"])
            assert abs(ours.start - truth_start) <= longest, (run_id, number, ours, truth_start, longest)
            if number < preemptions:  # preempted: between the pass before the one that noticed it, and that one
                low, high = watch.spans[replaced[number] - 1][0], watch.spans[replaced[number]][1]
                assert low <= truth_end <= high, (run_id, number, truth_end, low, high)  # the right window
                assert low <= ours.end <= high, (run_id, number, ours.end, low, high)
            else:  # deleted by the controller once the run succeeded: the delete operation dates it
                assert abs(ours.end - truth_end) <= longest, (run_id, number, ours, truth_end, longest)
        truth_s = sum(i["seconds"] for i in billed.values())
        ledger_s = sum(node_cost(h, catalog, now).ready_seconds for h in histories)
        print(f"{run_id}: ledger {ledger_s:.3f} s, billing {truth_s:.3f} s ({ledger_s / truth_s - 1:+.2%})")


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _node(admin: Any, run_id: str) -> dict[str, Any] | None:
    return next((n for n in admin.nodes() if n["name"].endswith(f"/nodes/{run_id}")), None)


def _events(store: Any, run_id: str) -> list[str]:
    return [e["kind"] for e in runs.load_memory(store, run_id)[0].events]


def test_a_slow_delete_does_not_hold_up_another_runs_replacement(emulator: Any, emulator_admin: Any,
                                                                 tmp_path: Path) -> None:
    """Two runs preempted at once, the delete of the first in the index held: the second's replacement
    goes out while the pass still waits for that delete; released, the first is replaced in the same pass."""
    settings = settings_at(tmp_path, **ENV)
    store = open_store(settings.store_root)
    api = TpuApi(PROJECT, endpoint=emulator.endpoint, token=emulator.token, poll_interval_s=PASS_S, deadline_s=20)
    controller = controller_over(settings, store, Fleet(api, settings, Ledger(settings.ledger_path)), sweeps=None,
                                 status_refresh_s=0.0)
    slow, quick = "held-1", "quick-1"  # the index lists the held one first
    for run_id in (slow, quick):
        _declare(settings, store, run_id)
    poll(lambda: controller.run_pass() and all("ready" in _events(store, r) for r in (slow, quick)),
         "both runs' nodes READY", interval_s=0.1)
    first = {run_id: _node(emulator_admin, run_id)["uid"] for run_id in (slow, quick)}  # type: ignore[index]

    emulator_admin.set_faults(hold_deletes=[slow])
    for run_id in (slow, quick):
        emulator_admin.preempt(PROJECT, ZONE, run_id, grace_s=0.0)
    poll(lambda: all(_node(emulator_admin, r)["state"] == "PREEMPTED" for r in (slow, quick)),  # type: ignore[index]
         "both nodes PREEMPTED")
    reports: list[PassReport] = []
    passing = threading.Thread(target=lambda: reports.append(controller.run_pass()), name="pass")
    passing.start()
    try:
        # the pass waits for the held delete until it is released below (or 300 s), so a replacement seen
        # while it is alive is its own, however slowly a loaded machine runs it
        replaced = poll(lambda: (node := _node(emulator_admin, quick)) is not None and node["uid"] != first[quick],
                        "the quick run's replacement created", timeout_s=120)
        assert replaced and passing.is_alive(), "the replacement was created by a later pass"
        assert _node(emulator_admin, slow)["state"] == "DELETING"  # type: ignore[index]
    finally:
        emulator_admin.set_faults(hold_deletes=[])
        passing.join(timeout=60)
    assert not passing.is_alive() and len(reports) == 1
    report = reports[0]
    assert report.errors == {}
    assert report.acted == [(slow, "delete", ZONE), (slow, "create", ZONE), (quick, "delete", ZONE),
                            (quick, "create", ZONE)]
    for run_id in (slow, quick):
        poll(lambda run_id=run_id: _ready_uid(emulator_admin, run_id, {first[run_id]}), f"{run_id}: READY again",
             interval_s=0.1)
        poll(lambda run_id=run_id: controller.run_pass() is not None and _events(store, run_id)[-1] == "ready",
             f"{run_id}: seen READY again", interval_s=0.1)
        assert _events(store, run_id) == ["create", "ready", "preempted", "create", "ready"]
    controller.release()
