"""``tpuops stop`` without a server: a stop is honoured under the run's lease, by whichever controller holds it.

The cloud is the in-memory provider (``tpuops.providers.memory``); the fleet, the store, the ledger, the leases and
the controllers are the real ones. A second controller plays ``train --follow`` or ``watch`` holding the run's lease:
the stop is never refused because of it, its next pass stops the run, and no pass recreates the node or counts a
preemption (issue 30, item 1). ``tests/controller/test_stop_e2e.py`` does the same with the CLI, the emulator and TF.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import controller_over

from tests.sweeps.test_sweep_template import BEFORE, Work, work  # noqa: F401  (work: the fixture)
from tpuops import api, runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.reconcile import Controller
from tpuops.controller.stop import stop_runs
from tpuops.core.errors import Timeout, UsageError
from tpuops.core.kinds import Capacity
from tpuops.fleet import Fleet
from tpuops.launch.provision import plan_up
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.nodes import NodeState
from tpuops.runs import NodeSpec, Outcome, RunKind, RunRecord
from tpuops.store import open_store

pytestmark = pytest.mark.unit

ZONE = "us-central1-b"
LIVE = {"command": "train", "attempt": 1, "phase": "training", "step": 10, "total_steps": 1000}


class World:
    """One store and one cloud, and controllers over them (each its own lease holder)."""

    def __init__(self, tmp_path: Path) -> None:
        self.settings = Settings(zones=[ZONE], home=tmp_path / "home", store=str(tmp_path / "store"),
                                 lease_ttl_s=3600.0, operation_timeout_s=60.0, max_run_hours=0)
        self.store = open_store(self.settings.store_root)
        self.cloud = MemoryProvider(poll_interval_s=0.01)
        self.ledger = Ledger(self.settings.ledger_path)

    def controller(self, holder: str) -> Controller:
        return controller_over(self.settings, self.store, Fleet(self.cloud, self.settings, self.ledger), sweeps=None,
                               holder=holder, status_refresh_s=0.0)

    def running(self, driver: Controller, run_id: str, sweep: str | None = None) -> None:
        """Declared, its node created by ``driver`` (which keeps its lease) and READY, its agent training."""
        request = plan_up(self.settings, run_id, accelerator="v2-8", capacity=Capacity.SPOT, zone=ZONE,
                          run_id=run_id).request
        record = RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=NodeSpec.of(request, [ZONE]), experiment="x",
                           sweep=sweep)
        runs.declare(self.store, record, {"version": 1, "run_id": run_id})
        self.store.write_bytes(runs.status_key(run_id), runs.AgentStatus.model_validate(
            {**LIVE, "run_id": run_id}).model_dump_json().encode())
        assert driver.run_pass(only=run_id).acted == [(run_id, "create", ZONE)]
        self.cloud.set_state(ZONE, run_id, NodeState.READY)
        driver.run_pass(only=run_id)

    def creates(self, run_id: str) -> int:
        return sum(1 for rpc, name, _ in self.cloud.calls if rpc == "CreateNode" and name == run_id)

    def node(self, run_id: str) -> Any:
        return self.cloud.nodes.get((ZONE, run_id))


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _stop(world: World, *run_ids: str, wait: bool = True, between: Any = None) -> list[Any]:
    return stop_runs(world.controller("stopper"), api.plan_stop(world.settings, list(run_ids)), "tpuops stop",
                     wait=wait, timeout_s=60.0, poll_s=0.0, sleep=between or (lambda _s: None))


def _stopped_for_good(world: World, run_id: str, watch: Controller) -> None:
    """Stopped, no preemption counted, and passes after it make no node again."""
    memory = runs.load_memory(world.store, run_id)[0]
    assert (memory.outcome, memory.preemptions, memory.crashes) == (Outcome.STOPPED, 0, 0)
    assert world.node(run_id) is None
    for _ in range(3):
        watch.run_pass()
    assert world.creates(run_id) == 1 and world.node(run_id) is None
    assert runs.load_memory(world.store, run_id)[0].preemptions == 0
    assert run_id not in runs.active_run_ids(world.store)


def test_a_stop_with_nobody_driving_the_run_stops_it_and_deletes_its_node(world: World) -> None:
    driver = world.controller("train")
    world.running(driver, "r1")
    driver.release()
    [done] = _stop(world, "r1")
    assert (done.outcome, done.already, done.node_gone) == (Outcome.STOPPED, False, True)
    _stopped_for_good(world, "r1", world.controller("watch"))


def test_a_stop_is_not_refused_while_another_controller_holds_the_lease_which_stops_the_run(world: World) -> None:
    """``train --follow`` holds the run's lease: the stop is asked for, and the holder's next pass honours it."""
    driver = world.controller("train")
    world.running(driver, "r1")
    [asked] = _stop(world, "r1", wait=False)
    assert asked.outcome is None and "stop requested" in asked.text
    assert world.node("r1") is not None  # only the holder acts on the run
    driver.run_pass(only="r1")
    _stopped_for_good(world, "r1", driver)


def test_a_waiting_stop_waits_for_the_holder_to_honour_it(world: World) -> None:
    watch = world.controller("watch")
    world.running(watch, "r1")
    watch.run_pass()  # a full pass: it caches the run under its lease, as 'tpuops watch' does
    [done] = _stop(world, "r1", between=lambda _s: watch.run_pass())
    assert (done.outcome, done.node_gone) == (Outcome.STOPPED, True)
    _stopped_for_good(world, "r1", watch)


def test_a_stop_the_holder_never_honours_times_out_saying_so_and_the_request_stays(world: World) -> None:
    driver = world.controller("train")
    world.running(driver, "r1")
    with pytest.raises(Timeout, match="r1"):
        stop_runs(world.controller("stopper"), api.plan_stop(world.settings, ["r1"]), "tpuops stop", wait=True,
                  timeout_s=0.0, poll_s=0.0)
    assert runs.read_stop(world.store, "r1") is not None and not runs.load_memory(world.store, "r1")[0].finished
    driver.run_pass(only="r1")
    _stopped_for_good(world, "r1", driver)


def test_a_garbled_stop_request_still_stops_the_run(world: World) -> None:
    driver = world.controller("train")
    world.running(driver, "r1")
    world.store.write_bytes(runs.layout.stop_key("r1"), b"{not json")
    runs.mark_active(world.store, "r1")
    driver.run_pass(only="r1")
    _stopped_for_good(world, "r1", driver)


def test_a_stopped_run_resumed_gets_a_node_again_and_its_request_is_gone(world: World) -> None:
    driver = world.controller("train")
    world.running(driver, "r1")
    driver.release()
    _stop(world, "r1")
    assert runs.reopen(world.store, "r1", "tpuops train --resume")
    assert runs.read_stop(world.store, "r1") is None
    assert driver.run_pass(only="r1").acted == [("r1", "create", ZONE)]
    assert world.creates("r1") == 2


def test_stopping_a_run_that_ended_says_so_and_an_unknown_one_is_refused_before_anything(world: World) -> None:
    driver = world.controller("train")
    world.running(driver, "r1")
    driver.release()
    _stop(world, "r1")
    [again] = _stop(world, "r1")
    assert again.already and again.outcome is Outcome.STOPPED and "ended already" in again.text
    world.running(driver, "r2")
    with pytest.raises(UsageError, match="nope"):
        api.plan_stop(world.settings, ["r2", "nope"])
    with pytest.raises(UsageError, match="--sweep"):
        api.plan_stop(world.settings, [])
    assert runs.read_stop(world.store, "r2") is None


def test_an_unknown_sweep_is_refused_before_anything(world: World) -> None:
    driver = world.controller("train")
    world.running(driver, "s1-t0000", sweep="s1")
    with pytest.raises(UsageError, match="no sweep 's1'"):
        api.plan_stop(world.settings, [], sweep="s1")
    assert runs.read_stop(world.store, "s1-t0000") is None


def test_stop_of_a_sweep_stops_its_trials_still_going_and_the_sweep_launches_no_more(
        work: Work) -> None:  # noqa: F811  (the imported fixture)
    from tpuops.store.lease import Leases
    from tpuops.sweeps.advance import SweepPass
    from tpuops.sweeps.models import SweepOutcome, SweepPhase
    from tpuops.sweeps.ops import load_state

    settings, root = work.started(BEFORE + 'node_provider = "memory"\n')

    def sweep_pass() -> None:
        SweepPass(settings, root, Ledger(settings.ledger_path), Leases(root, "sweeper", ttl_s=60), held=set(),
                  progress=lambda _: None).run()

    sweep_pass()
    trials = ["frozen-t0000", "frozen-t0001"]
    assert [run.run_id for run in api.plan_stop(settings, [], sweep="frozen")] == trials
    assert all(runs.read_stop(root, run_id) is None for run_id in trials)  # the dry run wrote nothing
    done = api.stop(settings, [], sweep="frozen")
    assert [(s.run_id, s.outcome) for s in done] == [(run_id, Outcome.STOPPED) for run_id in trials]
    assert load_state(root, "frozen")[0].phase is SweepPhase.STOPPING
    sweep_pass()
    state = load_state(root, "frozen")[0]
    assert (state.phase, state.outcome) == (SweepPhase.FINISHED, SweepOutcome.STOPPED)
    assert sorted(runs.all_run_ids(root)) == trials  # no trial launched after the stop


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_down_stops_runs_with_yes_asks_on_a_terminal_and_refuses_off_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tpuops.cli.nodes import _stopping

    assert _stopping(True)(["r1"]) is True  # type: ignore[misc]
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert _stopping(False) is None  # a script: no prompt, the api refuses naming 'tpuops stop'
    for answer, stops in (("y\n", True), ("n\n", False), ("", False)):
        monkeypatch.setattr(sys, "stdin", _Terminal(answer))
        ask = _stopping(False)
        assert ask is not None and ask(["r1", "r2"]) is stops
        assert "r1, r2 still going: stop" in capsys.readouterr().err


@pytest.mark.parametrize("wait", [False, True])
def test_a_stop_while_the_api_fails_is_recorded_says_when_it_takes_effect_and_never_fails(
        world: World, wait: bool) -> None:
    """Issue 38, defect 3: every Cloud TPU call fails. The stop is recorded (the memory says stopped, the request
    stays), the result says what is left and when it happens, and nothing raises; the next pass that reaches the
    API deletes the node."""
    from tpuops.core.errors import TransientError

    driver = world.controller("train")
    world.running(driver, "r1")
    driver.release()
    down = TransientError("503 UNAVAILABLE")
    world.cloud.faults.update({("ListNodes", ""): down, ("GetNode", "r1"): down, ("DeleteNode", "r1"): down})
    [done] = stop_runs(world.controller("stopper"), api.plan_stop(world.settings, ["r1"]), "tpuops stop", wait=wait,
                       timeout_s=0.0, poll_s=0.0)
    assert done.trouble is not None and "503 UNAVAILABLE" in done.trouble and not done.node_gone
    assert "stop recorded" in done.text and "within a heartbeat" in done.text and done.to_json()["trouble"]
    assert runs.load_memory(world.store, "r1")[0].outcome == Outcome.STOPPED
    assert world.node("r1") is not None  # nothing could delete it
    world.cloud.faults.clear()
    watch = world.controller("watch")
    watch.run_pass()  # the first pass that reaches the API deletes the node of the stopped run
    _stopped_for_good(world, "r1", watch)


def test_an_active_run_with_a_damaged_memory_is_stopped_and_told_how_to_repair_it(world: World) -> None:
    """Issue 38: a garbled memory.json made ``stop`` fail with no hint. The request is written (the agent reads it
    from the store, saves and ends), and the one line names the repair."""
    driver = world.controller("train")
    world.running(driver, "r1")
    driver.release()
    world.store.write_bytes(runs.layout.memory_key("r1"), b"{garbled")
    [done] = _stop(world, "r1", wait=False)
    assert runs.read_stop(world.store, "r1") is not None
    assert done.outcome is None and "'tpuops runs repair r1'" in done.text, done.text


def test_the_agent_reads_the_stop_request_where_stop_writes_it_and_ends_stopped_not_preempted() -> None:
    from tpuops.agent.paths import RunPaths
    from tpuops.agent.preemption import PreemptionNotice
    from tpuops.contract.exits import ExitClass, StoppedExit, interrupted

    assert RunPaths("/store", "r1").stop == "/store/" + runs.layout.stop_key("r1")
    notice = PreemptionNotice()
    notice.stop("tpuops stop")
    exit_ = interrupted(notice.stopped, notice.reason, "at step 40; last checkpoint at step 40")
    assert isinstance(exit_, StoppedExit)
    assert str(exit_) == "stopped (tpuops stop) at step 40; last checkpoint at step 40"
    preempted = PreemptionNotice()
    preempted.trigger("signal SIGTERM")
    preempted.stop("tpuops stop")  # a stop after a preemption's notice: the notice stays the preemption's
    assert not preempted.stopped and not isinstance(interrupted(preempted.stopped, preempted.reason, ""), StoppedExit)
    assert ExitClass.STOPPED.final and Outcome.of_exit(ExitClass.STOPPED) is Outcome.STOPPED
    deleted = PreemptionNotice()  # the SIGTERM of the node's delete that a controller honouring the stop asked for
    deleted.stop_asked = lambda: True
    deleted.trigger("signal SIGTERM")
    assert deleted.stopped and deleted.reason == "tpuops stop, its node deleted: signal SIGTERM"
    unreadable = PreemptionNotice()

    def fails() -> bool:
        raise OSError("store out of reach")

    unreadable.stop_asked = fails
    unreadable.trigger("signal SIGTERM")
    assert not unreadable.stopped  # recovered as a preemption, as before


def test_train_reports_a_stopped_run_as_its_own_outcome_exit_3_not_an_error(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38: ``train`` exited 1 with "error: run ended stopped" for a stop the user asked for."""
    import typer

    from tpuops.cli.jobs import STOPPED_EXIT, _report
    from tpuops.controller.drive import Finished

    driver = world.controller("train")
    world.running(driver, "r1")
    driver.release()
    _stop(world, "r1")
    run = api.plan_stop(world.settings, ["r1"])[0]
    memory = runs.load_memory(world.store, "r1")[0]
    status = runs.read_status(world.store, "r1")
    assert status is not None
    finished = Finished("r1", Outcome.STOPPED, "tpuops stop", status, memory, 12.0, run.record)
    with pytest.raises(typer.Exit) as code:
        _report(finished, as_json=False)
    assert code.value.exit_code == STOPPED_EXIT == 3
    err = capsys.readouterr().err
    assert "stopped on request (tpuops stop)" in err and "error" not in err and "--resume r1" in err


def test_stop_dry_run_of_a_sweep_prints_what_it_would_stop_also_when_no_run_is_going(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38: ``stop --dry-run --sweep S`` printed nothing."""
    import json

    from tpuops.cli.control import _print_stop_plan

    _print_stop_plan([], "s1", as_json=False)
    out, err = capsys.readouterr()
    assert "sweep s1 would launch no more trials" in out and "sweep s1: no run still going to stop" in err
    _print_stop_plan([], "s1", as_json=True)
    assert json.loads(capsys.readouterr().out) == {"sweep": "s1", "runs": []}


def test_a_run_whose_agent_ended_stopped_resumes_and_is_not_ended_again_by_its_old_exit(world: World) -> None:
    """The agent read the stop and ended ``stopped`` (final: no pass recreates the node), yet ``train --resume``
    goes on: the old exit is the stop's, not news that would end the resumed run at its first pass."""
    from tpuops.launch.jobs import plan_resume

    driver = world.controller("train")
    world.running(driver, "r1")
    driver.release()
    _stop(world, "r1")
    world.store.write_bytes(runs.status_key("r1"), runs.AgentStatus.model_validate(
        {**LIVE, "run_id": "r1", "phase": "done", "exit_class": "stopped"}).model_dump_json().encode())
    assert plan_resume(world.store, "r1").run_id == "r1"  # a stopped run is final, not complete
    assert runs.reopen(world.store, "r1", "tpuops train --resume")
    assert driver.run_pass(only="r1").acted == [("r1", "create", ZONE)]
    assert not runs.load_memory(world.store, "r1")[0].finished
