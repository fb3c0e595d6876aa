"""The swarm's later fault kinds (``tpuops.sim.swarm.extra``) each do what they say: a slow call takes virtual time, a
node that never boots stays unhealthy, a dying worker hangs its slice's job, a maintenance event restarts or
terminates the VM, a late notice costs the save, the operations listings fail or lag, an overrun pass has the next
ones run beside it; and they leave every seed's first draws as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuops import runs
from tpuops.core.errors import TransientError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import RUN_KEY
from tpuops.providers.cloud_model import CloudModel, Latency
from tpuops.providers.nodes import NodeRequest, NodeState
from tpuops.sim.agent import SimulatedAgent
from tpuops.sim.engine import START
from tpuops.sim.model import AgentModel, Segments
from tpuops.sim.swarm import extra
from tpuops.sim.swarm import faults as f
from tpuops.sim.swarm.draw import RunPlan, Scenario, draw
from tpuops.sim.swarm.runner import _Play
from tpuops.sim.world import SimWorld
from tpuops.store import LocalStore

pytestmark = pytest.mark.unit

ZONE = "us-central1-a"
JOB = AgentModel(total_steps=36_000, steps_per_s=10,
                 segments=Segments(setup_s=60, checkpoint_every_s=600, save_s=10, restore_s=10))


def _world(tmp_path: Path) -> SimWorld:
    return SimWorld("p", CloudModel(default_ready=Latency(90, 0), spot_hazard_per_hour=0.0), JOB,
                    LocalStore(tmp_path / "store"), start=START)


def _create(world: SimWorld, accelerator: str = "v2-32", capacity: Capacity = Capacity.ON_DEMAND) -> str:
    request = NodeRequest(name="r", accelerator=accelerator, runtime="tpu-vm-tf-2.9.3-pod", capacity=capacity,
                          labels={RUN_KEY: "r"})
    return world.provider.create_node(ZONE, request).name


def _scenario(*faults: f.Fault, cron_s: float = 60.0) -> Scenario:
    return Scenario(seed=7, cron_s=cron_s, total_steps=36_000, steps_per_s=10.0, checkpoint_every_s=600.0,
                    runs=(RunPlan("run-0", "v3-8", False),), commands=(), faults=faults)


def test_the_later_kinds_leave_every_seeds_first_draws_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs, commands, pass interval and first faults come from the seed's first stream alone: the later faults
    are appended from a stream of their own (the regression seeds replay by number)."""
    full = [draw(seed) for seed in range(40)]
    monkeypatch.setattr(extra, "draw", lambda seed, runs, hours: [])
    for seed, scenario in enumerate(full):
        first = draw(seed)
        assert scenario.faults[:len(first.faults)] == first.faults and scenario.runs == first.runs
        assert (scenario.commands, scenario.cron_s, scenario.total_steps) == (first.commands, first.cron_s,
                                                                              first.total_steps)
        assert all(x.kind not in f.FIRST_KINDS or x.kind in extra.EXTRA_CHANCES
                   for x in scenario.faults[len(first.faults):])
    monkeypatch.undo()
    assert {x.kind for seed in range(300) for x in draw(seed).faults} == set(f.KINDS)
    assert json.dumps(draw(11).to_json()) == json.dumps(draw(11).to_json())


def test_a_slow_api_call_advances_the_virtual_clock_and_past_the_call_timeout_fails_there(tmp_path: Path) -> None:
    play = _Play(_scenario(f.Fault(f.API_SLOW, 0.0, 3600.0, rate=1.0, count=20)), tmp_path)
    clock = play.sim.world.clock
    before = clock()
    play.cloud.list_nodes(ZONE)
    assert before < clock() <= before + 20 and play.injected.counts[f.API_SLOW] == 1
    (tmp_path / "timeout").mkdir()
    play = _Play(_scenario(f.Fault(f.API_SLOW, 0.0, 3600.0, rate=1.0, count=10**9)), tmp_path / "timeout")
    clock = play.sim.world.clock
    before = clock()
    with pytest.raises(TransientError, match="within 30 s"):
        play.cloud.find_node(ZONE, "run-0")
    assert clock() == before + 30.0


def test_a_slow_store_call_advances_the_virtual_clock(tmp_path: Path) -> None:
    play = _Play(_scenario(f.Fault(f.STORE_SLOW, 0.0, 3600.0, rate=1.0, count=45)), tmp_path)
    clock = play.sim.world.clock
    before = clock()
    play.store.list("runs/")
    play.store.write_bytes("x", b"{}")
    assert before < clock() <= before + 90 and play.injected.counts[f.STORE_SLOW] == 2


def test_an_overrun_pass_has_the_passes_due_meanwhile_run_beside_it(tmp_path: Path) -> None:
    play = _Play(_scenario(f.Fault(f.CONTROLLER_OVERRUN, 0.0, 0.0, rate=2.5, count=1)), tmp_path)
    beside: list[float] = []
    play.more.beside = beside.append
    play.more.passing(START)
    play.cloud.list_nodes(ZONE)  # the first API call of the pass stalls 2.5 passes
    assert beside == [START + 60, START + 120]
    assert play.sim.world.clock() == START + 150 and play.injected.counts[f.CONTROLLER_OVERRUN] == 1
    play.cloud.list_nodes(ZONE)  # once
    assert play.sim.world.clock() == START + 150


def test_a_seed_with_an_overrun_still_ends_its_run_and_keeps_every_invariant() -> None:
    from tpuops.sim.swarm.runner import run_seed

    scenario = _scenario(f.Fault(f.CONTROLLER_OVERRUN, 600.0, 600.0, rate=4.0, count=2),
                         f.Fault(f.API_SLOW, 0.0, 7200.0, rate=0.5, count=60))
    result = run_seed(7, scenario=scenario)
    assert result.ok, result.violations
    assert result.injected[f.CONTROLLER_OVERRUN] == 1 and result.injected[f.API_SLOW] > 10


def test_the_operations_listings_fail_or_lag_in_their_window(tmp_path: Path) -> None:
    play = _Play(_scenario(f.Fault(f.API_OPERATIONS, 100.0, 200.0, rate=1.0, arg="errors"),
                           f.Fault(f.API_OPERATIONS, 300.0, 400.0, rate=1.0, arg="lag")), tmp_path)
    world = play.sim.world
    assert play.cloud.node_operations(ZONE, "run-0") == []
    _create(world, "v3-8")
    world.advance_to(START + 150)
    with pytest.raises(TransientError):
        play.cloud.node_operations(ZONE, "r")
    world.advance_to(START + 250)
    [created] = play.cloud.node_operations(ZONE, "r")
    world.provider.delete_node(ZONE, "r")
    world.advance_to(START + 350)
    assert play.cloud.node_operations(ZONE, "r") == [created]  # what it answered before: no delete yet
    world.advance_to(START + 450)
    assert [op.verb for op in play.cloud.node_operations(ZONE, "r")] == ["create", "delete"]
    assert play.injected.counts[f.API_OPERATIONS] == 2


def test_a_single_host_that_never_boots_stays_creating_and_its_create_never_ends(tmp_path: Path) -> None:
    world = _world(tmp_path)
    world.never_boots(lambda zone, name: True)
    operation = _create(world, "v3-8")
    world.advance_to(START + 48 * 3600)
    node = world.provider.find_node(ZONE, "r")
    assert node is not None and node.state is NodeState.CREATING
    assert not world.provider.operation(ZONE, operation).done and world.ready_intervals() == []


def test_a_slice_with_a_worker_that_never_boots_is_ready_unhealthy_and_its_job_never_steps(tmp_path: Path) -> None:
    world = _world(tmp_path)
    world.never_boots(lambda zone, name: True)
    _create(world)
    world.advance_to(START + 4 * 3600)
    node = world.provider.find_node(ZONE, "r")
    assert node is not None and node.state is NodeState.READY and node.unhealthy_workers == (3,)
    status = runs.read_status(world.agents.store, "r")
    assert status is not None and status.step == 0 and status.exit_class is None
    assert world.next_event() is None  # its job never ends by itself: the node bills until someone deletes it


def test_a_dying_worker_leaves_its_slice_ready_unhealthy_and_hangs_its_job(tmp_path: Path) -> None:
    world = _world(tmp_path)
    _create(world)
    world.advance_to(START + 600)
    assert world.worker_dies(ZONE, "r", 2)
    stepped = runs.read_status(world.agents.store, "r").step  # type: ignore[union-attr]
    world.advance_to(START + 3 * 3600)
    node = world.provider.find_node(ZONE, "r")
    assert node is not None and node.state is NodeState.READY and node.unhealthy_workers == (2,)
    assert runs.read_status(world.agents.store, "r").step == stepped > 0  # type: ignore[union-attr]
    assert world.next_event() is None
    single = _world(tmp_path / "single")
    _create(single, "v3-8")
    single.advance_to(START + 600)
    assert not single.worker_dies(ZONE, "r", 1)  # one host: no worker of a slice to lose


def test_a_maintenance_event_restarts_an_on_demand_vm_and_terminates_a_spot_one(tmp_path: Path) -> None:
    world = _world(tmp_path)
    _create(world, "v3-8")
    world.advance_to(START + 900)
    assert world.maintenance(ZONE, "r", 600.0)
    node = world.provider.find_node(ZONE, "r")
    assert node is not None and (node.state, node.health) == (NodeState.REPAIRING, "UNHEALTHY_MAINTENANCE")
    [interval] = world.billing
    assert (interval.end, interval.reason) == (START + 900, "maintenance")
    agent = world.agents.by_run["r"]
    assert agent.checkpoint == 6000  # killed at once: the periodic save of 600 s of stepping, not the step reached
    world.advance_to(START + 1500)
    node = world.provider.find_node(ZONE, "r")
    assert node is not None and (node.state, node.health) == (NodeState.READY, "") and agent.attempts == 2
    spot = _world(tmp_path / "spot")
    _create(spot, "v3-8", Capacity.SPOT)
    spot.advance_to(START + 900)
    assert spot.maintenance(ZONE, "r", 600.0)
    spot.advance_to(START + 3600)
    node = spot.provider.find_node(ZONE, "r")
    assert node is not None and node.state is NodeState.TERMINATED and spot.billing[0].reason == "terminated"


@pytest.mark.parametrize(("late_s", "kept"), [(0.0, 2000), (25.0, 0), (45.0, 0)])
def test_a_late_notice_misses_the_save_that_fits_in_time(tmp_path: Path, late_s: float, kept: int) -> None:
    job = AgentModel(total_steps=10_000, steps_per_s=10,
                     segments=Segments(setup_s=0, checkpoint_every_s=600, save_s=10, restore_s=0))
    agent = SimulatedAgent(LocalStore(tmp_path), "r", job)
    agent.late = lambda notice_at: late_s
    agent.started(0.0)
    agent.interrupted(200.0, 230.0)  # 30 s of notice: heard 25 s late, 5 s are left; 45 s late, the node is gone
    assert agent.checkpoint == kept
