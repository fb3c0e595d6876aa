"""One bad document never blinds anything (issue 30, items 6 and 7).

A garbled ``memory.json``, ``status.json`` or ``run.json`` makes that one run damaged, and a garbled ``sweep.json``
or ``state.json`` that one sweep: listings show it so (``runs``, ``runs --json``, ``status``, the dashboard) and every
other run and node stays visible; ``events`` and ``train --resume`` of it say what is wrong in one line, exit 1 (a
failure of the world, not a usage error). A controller pass goes on with the other runs, retries a garbled status
instead of failing, and deletes a damaged run's node once its agent has exited; ``train --follow`` (``drive``)
survives a status garbled for a moment and the run finishes. ``runs repair`` rebuilds what can be rebuilt and
``runs forget`` removes the rest.

The store is the real local one, the cloud the in-memory provider (``tests/controller/test_controller_pass.py``'s world)
or none at all; ``tests/runs/test_damaged_emulator.py`` does the same over the emulator with the CLI.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import poll
from starlette.testclient import TestClient

from tests.controller.test_controller_pass import DONE, LIVE, ZONE, World, world  # noqa: F401  (world: the fixture)
from tests.runs.test_runs import record
from tests.sweeps.test_sweep_template import BEFORE, Work, work  # noqa: F401  (work: the fixture)
from tpuops import api, runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.damaged import damaged_verdict
from tpuops.controller.decide import Observed, Policy, decide
from tpuops.controller.drive import drive
from tpuops.controller.reconcile import Controller
from tpuops.core.errors import DamagedDocument, UsageError
from tpuops.core.kinds import Capacity, Cloud
from tpuops.dashboard.app import Dashboard
from tpuops.dashboard.auth import COOKIE
from tpuops.dashboard.source import bound_source
from tpuops.providers.nodes import NodeInfo, NodeState
from tpuops.runs import AgentStatus, ExitClass, Outcome
from tpuops.runs.repair import Diagnosis, rebuild_memory
from tpuops.session import store
from tpuops.store.lease import Leases
from tpuops.sweeps.advance import SweepPass, SweepStep
from tpuops.sweeps.models import SweepState
from tpuops.sweeps.ops import ACTIVE, record_key, state_key
from tpuops.sweeps.start import plan_sweep, start_sweep

pytestmark = pytest.mark.unit

GARBLED = b'{"phase": "act'  # a write cut short
WRONG_TYPE = b'{"attempts": "many"}'
TOKEN = "t0ken-for-damage"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(tpu_endpoint=Cloud.GCP, node_provider="memory", project="p", zones=["us-central1-a"],
                    home=tmp_path / "home", store=str(tmp_path / "store"), lease_ttl_s=60.0)


def declare(settings: Settings, *run_ids: str) -> None:
    for run_id in run_ids:
        runs.declare(store(settings), record(run_id), {"version": 1, "run_id": run_id})


def web(settings: Settings) -> TestClient:
    client = TestClient(Dashboard(bound_source(settings), token=TOKEN, read_only=False, refresh_s=0.05).asgi(),
                        base_url="http://127.0.0.1")
    client.cookies.set(COOKIE, TOKEN)
    return client


def test_a_garbled_memory_makes_one_run_damaged_and_every_read_still_works(settings: Settings) -> None:
    declare(settings, "r1", "r2", "r3")
    root = store(settings)
    root.write_bytes(runs.memory_key("r2"), GARBLED)

    listed = {run.run_id: run for run in api.list_runs(settings)}
    assert sorted(listed) == ["r1", "r2", "r3"]
    assert listed["r2"].phase == "damaged" and listed["r1"].phase == listed["r3"].phase == "pending"
    shown = json.loads(json.dumps({"runs": [run.to_json() for run in listed.values()]}, allow_nan=False))
    damaged = {row["run_id"]: row["damaged"] for row in shown["runs"]}
    assert damaged["r1"] is None and "runs/r2/memory.json is damaged" in damaged["r2"]
    assert [run.run_id for run in api.status(settings).runs] == ["r1", "r2", "r3"]

    assert api.events(settings, "r1").events == []
    with pytest.raises(DamagedDocument, match=r"r2/memory.json is damaged.*'tpuops runs repair r2'") as refused:
        api.events(settings, "r2")
    assert refused.value.exit_code == 1
    with pytest.raises(DamagedDocument, match="run r2 is damaged") as resumed:
        api.plan_resume(settings, "r2")
    assert resumed.value.exit_code == 1

    page = web(settings)
    assert page.get("/nodes").status_code == 200
    rows = {row["run_id"]: row for row in page.get("/data/runs?ids=r1,r2,r3").json()}
    assert rows["r2"]["phase"] == "damaged" and "memory.json" in rows["r2"]["damaged"] and rows["r1"]["damaged"] is None
    panel = page.get("/data/runs/r2/panel")
    assert panel.status_code == 200 and panel.json()["row"]["phase"] == "damaged"


def test_every_read_command_works_with_one_damaged_document_of_each_kind_among_200_runs(settings: Settings) -> None:
    """The issue's benchmark: "commands that still work with one damaged run among 200: all"."""
    names = [f"r{index:03d}" for index in range(200)]
    declare(settings, *names)
    root = store(settings)
    broken = {"r010": (runs.record_key, b'{"run_id": 5}'), "r020": (runs.memory_key, WRONG_TYPE),
              "r030": (runs.status_key, b"\xff\xfe binary")}
    for run_id, (key, data) in broken.items():
        root.write_bytes(key(run_id), data)
    for sweep in ("s-record", "s-state"):  # a whole sweep's listing: tests/sweeps/test_sweep_status.py
        root.write_bytes(record_key(sweep), b"{}")
        root.write_bytes(state_key(sweep), GARBLED if sweep == "s-state" else SweepState().to_bytes())
        root.write_bytes(ACTIVE + sweep, b"")

    listed = api.list_runs(settings)
    assert len(listed) == 200
    assert sorted(run.run_id for run in listed if run.damage) == sorted(broken)
    assert json.dumps([run.to_json() for run in listed], allow_nan=False)
    assert len(api.status(settings).runs) == 200
    assert {run_id: len(api.events(settings, run_id).events) for run_id in ("r000", "r030", "r199")} == \
        dict.fromkeys(("r000", "r030", "r199"), 0)
    assert len(web(settings).get("/data/runs?ids=" + ",".join(names)).json()) == 200
    assert web(settings).get("/nodes").status_code == 200

    sweeps = {row["sweep"]: row for row in api.sweep_list(settings)}
    assert sweeps["s-state"]["phase"] == "damaged" and "state.json is damaged" in sweeps["s-state"]["damaged"]
    assert sweeps["s-record"]["phase"] == "damaged" and "sweep.json is damaged" in sweeps["s-record"]["damaged"]
    assert web(settings).get("/data/sweeps").status_code == 200


def test_repair_rebuilds_the_memory_and_sets_a_status_aside_and_forget_removes_a_run_it_cannot_repair(
        settings: Settings) -> None:
    declare(settings, "mem", "stat", "rec", "done")
    root = store(settings)
    root.write_bytes(runs.memory_key("mem"), GARBLED)
    root.write_bytes(runs.status_key("stat"), GARBLED)
    root.write_bytes(runs.record_key("rec"), b"[]")
    runs.drop_active(root, "done")  # a run that had ended, its memory garbled since
    runs.write_status(root, "done", AgentStatus(run_id="done", attempt=2, exit_class=ExitClass.SUCCEEDED))
    root.write_bytes(runs.memory_key("done"), GARBLED)

    planned = api.repair(settings, "mem", dry_run=True)
    assert planned.done == [] and list(planned.diagnosis.damage) == ["memory.json"]
    assert root.read_bytes(runs.memory_key("mem")) == GARBLED, "a dry run writes nothing"

    assert api.repair(settings, "mem").done == [
        "memory.json rebuilt: active, attempt 0, on a new node at the next pass"]
    assert root.read_bytes(runs.memory_key("mem") + ".damaged") == GARBLED, "the damaged bytes are kept"
    memory = api.events(settings, "mem")
    assert not memory.finished and [event["kind"] for event in memory.events] == ["repaired"]

    assert api.repair(settings, "stat").done == ["status.json set aside as status.json.damaged"]
    assert runs.read_status(root, "stat") is None

    assert api.repair(settings, "done").done == ["memory.json rebuilt: the run had ended (succeeded)"]
    assert api.events(settings, "done").outcome == Outcome.SUCCEEDED

    unrepairable = api.repair(settings, "rec")
    assert not unrepairable.diagnosis.repairable and "cannot be rebuilt" in unrepairable.diagnosis.repairs()[0]
    assert api.forget(settings, "rec", dry_run=True).forgotten is False
    assert "rec" in runs.all_run_ids(root)
    assert api.forget(settings, "rec").forgotten
    assert "rec" not in runs.all_run_ids(root) and "rec" not in runs.active_run_ids(root)
    assert not any(run.damage for run in api.list_runs(settings))
    with pytest.raises(UsageError, match="is not damaged"):
        api.forget(settings, "mem")


def test_a_pass_goes_on_past_a_damaged_run_and_deletes_its_node_once_its_agent_exited(
        world: World) -> None:  # noqa: F811  (the imported fixture)
    world.running("run-a", "run-b", "run-c")
    world.store.write_bytes(runs.status_key("run-b"), GARBLED)
    world.store.write_bytes(runs.memory_key("run-c"), GARBLED)
    world.controller.release()
    cron = Controller(world.settings, world.store, world.controller.nodes, billing=world.controller.billing,
                      sweeps=SweepStep(), holder="cron", status_refresh_s=0.0)
    report = cron.run_pass()  # a one-shot pass (reconcile from cron): it reads every run afresh
    assert report.acted == [], "a garbled status is no news, a damaged memory no reason to act while its agent works"
    assert list(report.errors) == ["run-c"] and "memory.json is damaged" in report.errors["run-c"]
    assert {node.name for node in world.cloud.list_nodes(ZONE)} == {"run-a", "run-b", "run-c"}

    world.status("run-b", {**LIVE, "step": 20})  # the agent rewrote it: the run goes on
    world.status("run-c", DONE)  # the damaged run's agent ended: its node must not bill on
    report = cron.run_pass()
    assert report.acted == [("run-c", "delete", ZONE)]
    assert list(report.errors) == ["run-c"]
    assert not runs.load_memory(world.store, "run-b")[0].finished


def test_a_garbled_status_during_drive_is_read_again_and_the_run_finishes(
        world: World) -> None:  # noqa: F811  (the imported fixture)
    """``train --follow`` exited 2 and left the run without a controller when its status was garbled for 3 s."""
    world.running("run-f")
    said: list[str] = []
    world.controller.progress = said.append
    done: list[Any] = []
    failed: list[BaseException] = []

    def follow() -> None:
        try:
            done.append(drive(world.controller, "run-f", poll_s=0.01, on_status=lambda _status: None))
        except BaseException as err:
            failed.append(err)

    driver = threading.Thread(target=follow)
    driver.start()
    world.store.write_bytes(runs.status_key("run-f"), GARBLED)
    poll(lambda: failed or any("status.json is damaged" in line for line in said), "a pass to read the garbled status")
    world.status("run-f", DONE)
    driver.join(timeout=60)
    assert not failed, failed
    assert done and done[0].outcome is Outcome.SUCCEEDED
    assert world.cloud.list_nodes(ZONE) == []


def test_the_verdict_on_a_damaged_runs_node_leaves_a_working_agent_and_ends_a_silent_or_finished_one() -> None:
    policy = Policy(zones=(ZONE,), hang_after_s=100.0, boot_timeout_s=50.0)
    now = 10_000.0
    beat = "1970-01-01T02:45:00+00:00"  # 9900: 100 s before now
    working = AgentStatus(attempt=1, heartbeat="1970-01-01T02:46:00+00:00")
    assert damaged_verdict(NodeState.READY, working, 500.0, now, policy) is None
    # a hung step beats on: its node goes once the caller has seen the step stand still as long as a hang takes
    assert damaged_verdict(NodeState.READY, working, 500.0, now, policy, stuck_s=100.0) is None
    assert damaged_verdict(NodeState.READY, working, 500.0, now, policy, stuck_s=101.0) == "no step progress for 101 s"
    assert damaged_verdict(NodeState.READY, AgentStatus(attempt=1, heartbeat=beat), 500.0, now + 1, policy) == \
        "no heartbeat for 101 s"
    ended = AgentStatus(attempt=1, exit_class=ExitClass.SUCCEEDED)
    assert damaged_verdict(NodeState.READY, ended, 500.0, now, policy) == "its agent exited (succeeded)"
    assert damaged_verdict(NodeState.READY, ended, 500.0, now, Policy(zones=(ZONE,), keep_node=True)) is None
    assert damaged_verdict(NodeState.READY, None, 149.0, now, policy) is None
    assert damaged_verdict(NodeState.READY, None, 151.0, now, policy) == \
        "no readable agent status on a node READY for 151 s"



def test_the_verdict_on_a_damaged_runs_node_honours_the_budget_its_record_holds_working_agent_or_not() -> None:
    policy, now = Policy(zones=(ZONE,)), 10_000.0
    working = AgentStatus(attempt=1, heartbeat="1970-01-01T02:46:00+00:00")
    assert damaged_verdict(NodeState.READY, working, 500.0, now, policy, budget=(4.99, 5.0)) is None
    assert damaged_verdict(NodeState.READY, working, 500.0, now, policy, budget=(5.0, 5.0)) == \
        "it spent $5.00 of a $5.00 budget"  # the ledger knows what it spent, memory or not (seeds 2892, 4049)
    assert damaged_verdict(NodeState.CREATING, None, 1.0, now, policy, budget=(9.0, 5.0)) is None  # bills nothing


def test_the_verdict_on_a_damaged_runs_dead_node_deletes_it_at_once_and_waits_on_one_in_transition() -> None:
    policy, kept = Policy(zones=(ZONE,)), Policy(zones=(ZONE,), keep_node=True)
    now = 10_000.0
    for state in (NodeState.PREEMPTED, NodeState.TERMINATED):
        for agent in (None, AgentStatus(attempt=1, heartbeat="1970-01-01T02:46:00+00:00")):
            assert damaged_verdict(state, agent, 1.0, now, policy) == f"its node is {state.value}"
            assert damaged_verdict(state, agent, 1.0, now, kept) == f"its node is {state.value}"
    assert damaged_verdict(NodeState.STOPPED, None, 1.0, now, policy) == "its node is STOPPED"
    assert damaged_verdict(NodeState.STOPPED, None, 1.0, now, kept) is None
    for state in (NodeState.STARTING, NodeState.DELETING, NodeState.REPAIRING):
        assert damaged_verdict(state, None, 10_000.0, now, policy) is None
    assert damaged_verdict(NodeState.CREATING, None, policy.create_timeout_s, now, policy) is None  # booting still
    never = damaged_verdict(NodeState.CREATING, None, policy.create_timeout_s + 1, now, policy)
    assert never is not None and "never booted" in never  # it holds the name and the quota for ever (seed 866)


def test_logs_follow_goes_on_past_a_garbled_status_and_ends_when_the_run_ends(settings: Settings) -> None:
    declare(settings, "r1")
    root = store(settings)
    root.write_bytes(f"{runs.logs_prefix('r1')}000000.log", b"step 10\n")
    ended = AgentStatus(run_id="r1", attempt=1, exit_class=ExitClass.SUCCEEDED)
    script = [lambda: root.write_bytes(runs.status_key("r1"), GARBLED),
              lambda: runs.write_status(root, "r1", ended)]
    polls: list[float] = []

    def next_moment(seconds: float) -> None:  # each poll of the follower moves the run on by one moment
        polls.append(seconds)
        script.pop(0)()

    assert list(runs.follow_logs(root, "r1", follow=True, poll_s=0.0, sleep=next_moment)) == ["step 10"]
    assert script == [] and len(polls) == 2, "the garbled moment was read, and did not end the follow"


def test_a_damaged_trial_run_holds_its_slot_and_a_damaged_sweep_state_is_repaired(
        work: Work) -> None:  # noqa: F811  (the imported fixture)
    settings = work.settings(BEFORE)
    root = store(settings)
    start_sweep(plan_sweep(settings, work.root / "sweeps" / "frozen.yaml", root, base_dir=work.root), root,
                lambda _: None)

    def sweep_pass() -> dict[str, str]:
        return SweepPass(settings, root, Ledger(settings.ledger_path), Leases(root, "test", ttl_s=60), held=set(),
                         progress=lambda _: None).run().errors

    assert sweep_pass() == {}
    root.write_bytes(runs.memory_key("frozen-t0000"), GARBLED)
    root.write_bytes(runs.record_key("frozen-t0001"), GARBLED)
    assert sweep_pass() == {}, "a damaged trial run is not the sweep's failure"
    assert [row.run_id for row in api.sweep_status(settings, "frozen").trials] == ["frozen-t0000", "frozen-t0001"]

    root.write_bytes(state_key("frozen"), GARBLED)
    assert "state.json is damaged" in sweep_pass()["frozen"]
    assert [(row["phase"], bool(row["damaged"])) for row in api.sweep_list(settings)] == [("damaged", True)]
    assert api.sweep_repair(settings, "frozen", dry_run=True)["done"] == []
    repaired = api.sweep_repair(settings, "frozen")
    assert repaired["done"] == ["state.json rebuilt: active"] and repaired["repairable"]
    assert root.read_bytes(state_key("frozen") + ".damaged") == GARBLED
    assert sweep_pass() == {}
    assert [(row["phase"], row["damaged"]) for row in api.sweep_list(settings)] == [("active", None)]

    root.write_bytes(record_key("frozen"), b"[]")
    retired = api.sweep_repair(settings, "frozen")
    assert not retired["repairable"] and "off the passes' list" in retired["done"][0]
    assert sweep_pass() == {}, "no pass fails on a sweep it cannot read any more"


def test_a_rebuilt_memory_acts_on_the_agents_last_word_and_counts_no_preemption_for_a_missing_node() -> None:
    node = NodeInfo(name="r1", zone=ZONE, project="p", accelerator="v2-8", runtime="tpu-vm-tf-2.9.3",
                    capacity=Capacity.SPOT, state=NodeState.READY, health="", labels={}, create_time=None)
    found = Diagnosis("r1", {"memory.json": "garbled"}, node, active=True)
    on_node = rebuild_memory(found, status_attempt=3, final=None, now=1.0)
    assert (on_node.attempts, on_node.zone, on_node.handled_agent_attempt, on_node.deleting) == (3, ZONE, 2, False)
    crashed = AgentStatus(attempt=3, exit_class=ExitClass.CRASHED)
    decision = decide(on_node, Observed(listed=True, node_state=NodeState.READY, node_zone=ZONE, status=crashed),
                      2.0, Policy(zones=(ZONE,)))
    assert on_node.crashes == 1 and [a.kind for a in decision.actions] == ["delete", "create"], \
        "the crash the agent last reported is handled as the lost memory would have"

    gone = rebuild_memory(Diagnosis("r1", {"memory.json": "garbled"}, None, active=True), 3, None, 1.0)
    decision = decide(gone, Observed(listed=True), 2.0, Policy(zones=(ZONE,)))
    assert gone.preemptions == 0 and [a.kind for a in decision.actions] == ["create"]
    ended = rebuild_memory(Diagnosis("r1", {"memory.json": "garbled"}, None, active=False), 0, None, 1.0)
    assert ended.finished and ended.outcome is Outcome.FAILED


def test_repair_and_forget_of_an_unknown_run_are_usage_errors(settings: Settings) -> None:
    for call in (api.repair, api.forget):
        with pytest.raises(UsageError, match=r"no run 'ghost' in .*'tpuops runs' lists them") as refused:
            call(settings, "ghost")
        assert refused.value.exit_code == 2


def test_watch_goes_on_past_damaged_runs_and_reconcile_says_them(settings: Settings) -> None:
    declare(settings, "r1", "r2", "r3")
    root = store(settings)
    root.write_bytes(runs.memory_key("r2"), GARBLED)
    root.write_bytes(runs.status_key("r3"), GARBLED)
    reports: list[Any] = []
    assert api.watch(settings, interval_s=0.1, passes=2, on_pass=lambda _n, report: reports.append(report),
                     sleep=lambda _s: None, wake=False) == 2
    assert [sorted(report.errors) for report in reports] == [["r2"], ["r2"]]
    assert sorted(run for run, action, _zone in reports[0].acted if action == "create") == ["r1", "r3"]
    assert list(api.reconcile(settings, wake=False).errors) == ["r2"]
