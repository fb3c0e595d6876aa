"""A node that deletes itself when its job ends: the ledger ends its READY time at the self-delete.

The dead-man's switch deletes the node from inside the VM; the delete operation it asked for dates
it (the provider lists the operations on a node, ``ListsOperations``), and ``Fleet`` keeps that moment
within the two sightings that framed the disappearance. The run's end is no evidence (issue 38,
defect 1: a run that ends while the API fails leaves its node READY and billed). Without evidence the
end is within the gap, which for jobs of one length is off the same way every time.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tpuops import runs
from tpuops.billing.ledger import DELETED, Ledger
from tpuops.config import Settings, load_settings
from tpuops.core import guards
from tpuops.core.clock import UTC, VirtualClock
from tpuops.core.errors import TransientError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MANAGED_BY_KEY, MANAGED_BY_VALUE, RUN_KEY
from tpuops.fleet import Fleet
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_model import CloudModel
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.nodes import NodeInfo, NodeRequest, NodeState, Operation
from tpuops.providers.simulated import Billed, SimulatedCloud
from tpuops.runs import AgentStatus, ExitClass, Phase
from tpuops.sim.model import AgentModel, Segments
from tpuops.sim.world import Agents
from tpuops.store.local import LocalStore

pytestmark = pytest.mark.unit

P, ZONE, RUN = "tpuops-local", "us-central1-b", "r-1"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
PASS_S = 300.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _settings(tmp_path: Path) -> Settings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "tpuops.toml"
    config.write_text("")
    return load_settings(config_path=config, environ={"TPUOPS_HOME": str(tmp_path / "home"), "TPUOPS_ZONES": ZONE})


def _watch_until_gone(tmp_path: Path, *, evidence: bool, steps: int = 1000) -> tuple[datetime, Billed]:
    """A run's on-demand node in the simulated cloud (its job ``steps`` long), listed every pass until it deleted
    itself.

    Returns the end the ledger dated and the READY interval Cloud TPU billed."""
    clock = VirtualClock(T0.timestamp())
    store = LocalStore(tmp_path / "store", durable=False)
    agents = Agents(store, AgentModel(total_steps=steps, steps_per_s=1.3, segments=Segments(setup_s=37.0)), seed=0)
    cloud = SimulatedCloud(P, CloudModel(), clock=clock, seed=3, workload=agents)
    settings = _settings(tmp_path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    fleet = Fleet(cloud, settings, ledger, clock=clock)
    plan = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE, run_id=RUN)
    fleet.create(ZONE, plan.request)
    with contextlib.ExitStack() as stack:
        if not evidence:
            stack.enter_context(guards.off("ledger.evidence_end"))
        for _ in range(100):
            clock.advance_to(clock() + PASS_S)
            listed, _ = fleet.list_zones([ZONE])
            if not listed[ZONE]:
                break
    [billed] = cloud.billing
    assert billed.reason == "job-ended" and billed.end is not None
    [last] = ledger.transitions(P, ZONE, "n")[-1:]
    assert last.state == DELETED
    return last.at, billed


def test_a_self_deleted_node_is_dated_at_its_self_delete(tmp_path: Path) -> None:
    """The delete operation the simulated VM asked for dates the self-delete; the ledger ends READY there, as billed."""
    ended, billed = _watch_until_gone(tmp_path / "evidence", evidence=True)
    assert billed.end is not None and abs(ended.timestamp() - billed.end) < 1e-3
    guessed, _ = _watch_until_gone(tmp_path / "guess", evidence=False)
    assert abs(guessed.timestamp() - billed.end) > 1.0  # the middle of the gap: what the evidence replaces


def test_a_node_that_lived_and_deleted_itself_between_two_passes_is_billed_from_its_create_to_its_self_delete(
        tmp_path: Path) -> None:
    """Created, READY, trained and gone before the first pass looked: the ledger had the node with no READY time,
    so it billed nothing. Its create operation dates READY, its delete operation the self-delete, as Cloud TPU
    billed."""
    _, billed = _watch_until_gone(tmp_path, evidence=True, steps=100)
    [history] = Ledger(tmp_path / "ledger.sqlite").histories(P)
    assert [t.state for t in history.transitions] == ["READY", DELETED]
    ready, ended = (t.at.timestamp() for t in history.transitions)
    assert billed.end is not None and billed.end - T0.timestamp() < PASS_S  # gone before the first pass
    assert abs(ready - billed.start) < 1e-3 and abs(ended - billed.end) < 1e-3


def _node(state: NodeState) -> NodeInfo:
    return NodeInfo(name="n", zone=ZONE, project=P, accelerator="v2-8", runtime="tpu-vm-tf-2.9.3",
                    capacity=Capacity.ON_DEMAND, state=state, health="",
                    labels={MANAGED_BY_KEY: MANAGED_BY_VALUE, RUN_KEY: RUN}, create_time=at(0), uid="7")


def _deleted_at(seconds: float | None) -> Callable[[str, str], list[Operation]]:
    """A provider's operations on node "n": its create, and its self-delete started at ``seconds`` (None: none)."""
    ops = [Operation("c", ZONE, True, target="n", started=at(0), ended=at(50), verb="create")]
    if seconds is not None:
        ops.append(Operation("d", ZONE, True, target="n", started=at(seconds), ended=at(seconds + 5), verb="delete"))
    return lambda zone, name: ops


def _nowhere(zone: str, name: str) -> NodeInfo | None:
    """The provider's lookup of a node a listing no longer shows: it has none (it deleted itself)."""
    return None


@pytest.mark.parametrize(("said", "dated"), [
    (420.0, 420.0),  # inside the gap between the last READY sighting (300 s) and DELETING (600 s)
    (700.0, 600.0),  # after the sighting that saw it: kept to it
    (100.0, 300.0),  # before the last READY sighting (a kept node deleted later): kept to that
    (-50.0, 600.0),  # before the node's create: another incarnation's, so none of this one: at the sighting
    (None, 600.0),  # no delete found: at the sighting that proved it going, never within the gap (it may have billed)
])
def test_the_self_delete_is_kept_within_the_sightings(tmp_path: Path, said: float | None, dated: float) -> None:
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"))
    fleet.billing.node_operations = _deleted_at(said)
    fleet.billing.observe(_node(NodeState.READY), at=at(0))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    fleet.billing.observe(_node(NodeState.DELETING), at=at(600))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("READY", at(0)), ("DELETING", at(dated))]


def test_the_delete_of_the_node_before_is_no_end_of_its_replacement(tmp_path: Path) -> None:
    """A replacement created as its forerunner's delete returned (both at 0 s, the name free at once): that delete
    started at the replacement's create but was over by then, so it is the forerunner's end, not this node's.
    Taken for this one's, it dated the end at the last READY sighting, a pass early (the swarm's seeds 10, 26,
    107: 210 s of 4236 s billed missing). With no delete of its own found, its end is the sighting DELETING."""
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"))
    ops = [Operation("d0", ZONE, True, target="n", started=at(0), ended=at(0), verb="delete"),
           Operation("c", ZONE, True, target="n", started=at(0), ended=at(50), verb="create")]
    fleet.billing.node_operations = lambda zone, name: ops
    fleet.billing.observe(_node(NodeState.READY), at=at(0))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    fleet.billing.observe(_node(NodeState.DELETING), at=at(600))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("READY", at(0)), ("DELETING", at(600))]


def test_a_node_seen_creating_then_gone_is_billed_from_its_listed_create_to_its_self_delete(tmp_path: Path) -> None:
    """A create whose answer was lost (the observer was never told of it): the node is seen CREATING, becomes READY,
    trains a short job and deletes itself before the next look. The create and the delete the provider lists date
    what Cloud TPU billed; without them the ledger held no READY time at all (the swarm's seed 84: 80 s)."""
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"))
    fleet.billing.node_operations = _deleted_at(200)  # created 0-50 s, deleted itself at 200 s
    fleet.billing.observe(_node(NodeState.CREATING), at=at(30))
    fleet.billing.find_node = _nowhere
    fleet.billing.listed(ZONE, {}, asked=at(330))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("CREATING", at(30)), ("READY", at(50)), (DELETED, at(200))]


def test_a_listing_older_than_a_nodes_end_never_reopens_it(tmp_path: Path) -> None:
    """A listing that lags shows a node READY after the ledger dated its end from a listing without it and its delete
    operation: that incarnation is gone for good, so the stale sighting changes nothing (it re-opened the node READY
    in the ledger, which then billed hours the cloud never did: the swarm's seeds 6, 103, 118)."""
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"))
    fleet.billing.node_operations = _deleted_at(420)
    fleet.billing.observe(_node(NodeState.READY), at=at(0))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    fleet.billing.find_node = _nowhere
    fleet.billing.listed(ZONE, {}, asked=at(600))
    fleet.billing.listed(ZONE, {"n": _node(NodeState.READY)}, asked=at(900))  # what the listing said at 300 s
    fleet.billing.listed(ZONE, {}, asked=at(1200))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("READY", at(0)), (DELETED, at(420))]


def _replaced(tmp_path: Path) -> Fleet:
    """Node "n" (uid 7) READY from 0 s, deleted by us at 600 s (gone at once) and replaced: our create of its
    successor (uid 8) asked at 600 s and READY at 700 s; the provider lists the three operations."""
    settings = _settings(tmp_path)
    fleet = Fleet(TpuApi(P), settings, Ledger(tmp_path / "ledger.sqlite"))
    ops = {op.name: op for op in (
        Operation("c7", ZONE, True, target="n", started=at(-50), ended=at(0), verb="create"),
        Operation("d7", ZONE, True, target="n", started=at(600), ended=at(600), verb="delete"),
        Operation("c8", ZONE, True, target="n", started=at(600), ended=at(700), verb="create"))}
    fleet.billing.node_operations = lambda zone, name: list(ops.values())
    fleet.billing.operations = lambda zone, name: ops[name]
    fleet.billing.observe(_node(NodeState.READY), at=at(0))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    fleet.billing.deleting(ZONE, "n", ops["d7"], at(600), at(600))
    fleet.billing.gone(ZONE, "n", at(600))
    request = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE, run_id=RUN).request
    fleet.billing.created(ZONE, request, "c8", at(600))
    return fleet


def test_a_listing_that_lags_behind_a_replacement_never_reopens_the_node_it_replaced(tmp_path: Path) -> None:
    """After our delete of node 7 and our create of its replacement, a listing that lags still shows node 7 READY:
    that sighting is older than node 7's end and changes nothing. It re-opened node 7 READY for good (the ledger
    billed hours the cloud never did) and took the replacement's create to date it, so the replacement's READY was
    guessed within the gap instead (the swarm's seeds 615 and 762: 21124 s held against 2080 s billed)."""
    fleet = _replaced(tmp_path)
    fleet.billing.listed(ZONE, {"n": _node(NodeState.READY)}, asked=at(900))  # what the listing said at 300 s
    successor = dataclasses.replace(_node(NodeState.READY), uid="8", create_time=at(600))
    fleet.billing.listed(ZONE, {"n": successor}, asked=at(1200))
    ledger = fleet.billing.ledger
    assert [(t.state, t.at) for t in ledger.transitions(P, ZONE, "n", uid="7")] == [
        ("READY", at(0)), ("DELETING", at(600)), (DELETED, at(600))]
    assert [(t.state, t.at) for t in ledger.transitions(P, ZONE, "n", uid="8")] == [("READY", at(700))]


@pytest.mark.parametrize("told", [True, False], ids=["our create", "a create whose answer was lost"])
def test_a_node_a_lagging_listing_showed_creating_after_its_create_ended_is_ready_where_it_ended(
        tmp_path: Path, told: bool) -> None:
    """The create ended at 130 s, but a listing that lags showed the node CREATING until 240 s: READY is where the
    create ended, not after those sightings (kept after them, READY started when the lag ended and the billed time
    between was missing: the swarm's seed 747, 228 s of 2200 s). Also for a node never told of (its listed create)."""
    settings = _settings(tmp_path)
    fleet = Fleet(TpuApi(P), settings, Ledger(tmp_path / "ledger.sqlite"))
    create = Operation("c", ZONE, True, target="n", started=at(0), ended=at(130), verb="create")
    fleet.billing.node_operations = lambda zone, name: [create]
    fleet.billing.operations = lambda zone, name: create
    if told:
        request = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE,
                          run_id=RUN).request
        fleet.billing.created(ZONE, request, "c", at(0))
    for seen in (60, 180, 240):  # CREATING at 60 s, then the lagging listing's repeats of it
        fleet.billing.observe(_node(NodeState.CREATING), at=at(seen))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("CREATING", at(30 if told else 60)), ("READY", at(130))]


def test_a_create_whose_get_operation_fails_is_ready_where_its_listed_create_ended(tmp_path: Path) -> None:
    """The API fails the one GetOperation of our create as the node is first seen READY: the create the provider lists
    dates READY all the same (guessed within the gap instead, READY was half a pass late: 75 s of 3825 s billed
    missing in the swarm's seed 34, on a branch whose creates went out in a varying order)."""
    settings = _settings(tmp_path)
    fleet = Fleet(TpuApi(P), settings, Ledger(tmp_path / "ledger.sqlite"))
    fleet.billing.node_operations = _deleted_at(None)  # our create: 0-50 s

    def failing(zone: str, name: str) -> Operation:
        raise TransientError("503: the API failed this call")

    fleet.billing.operations = failing
    request = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE, run_id=RUN).request
    fleet.billing.created(ZONE, request, "c", at(0))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [("READY", at(50))]


@pytest.mark.parametrize("told", [True, False], ids=["our create", "a create whose answer was lost"])
def test_a_ready_no_call_dates_starts_at_the_create_on_the_safe_side(tmp_path: Path, told: bool) -> None:
    """Neither the GetOperation of the create nor the ListOperations answers (the API fails both): the node first
    seen READY at 300 s is READY from its create (our ask at 0 s; else its createTime), never later than it was,
    so the ledger never misses what it billed (in the middle of the gap, 150 s, READY was up to half a pass late:
    the swarm's seeds 78, 282, 426, 568, 594)."""
    settings = _settings(tmp_path)
    fleet = Fleet(TpuApi(P), settings, Ledger(tmp_path / "ledger.sqlite"))

    def failing(zone: str, name: str) -> Operation:
        raise TransientError("503: the API failed this call")

    fleet.billing.operations = failing
    fleet.billing.node_operations = failing  # type: ignore[assignment]
    if told:
        request = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE,
                          run_id=RUN).request
        fleet.billing.created(ZONE, request, "c", at(0))
    fleet.billing.observe(dataclasses.replace(_node(NodeState.READY), create_time=at(2)), at=at(300))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("READY", at(0 if told else 2))]


def test_a_node_a_lagging_listing_hid_until_it_was_preempted_is_billed_from_its_create(tmp_path: Path) -> None:
    """Our create at 0 s (READY at 50 s), then a listing that lags shows the zone without the node (what it said
    before the create), which closes the record; the next listing finds the node preempted. Its READY, dated by the
    create the provider lists, belongs to its own incarnation, not to the closed record the lag left. Its preemption
    is dated at the sighting, on the safe side: one gap between listings is no pace (the swarm's seed 7090)."""
    settings = _settings(tmp_path)
    clock = VirtualClock(at(30).timestamp())
    fleet = Fleet(TpuApi(P), settings, Ledger(tmp_path / "ledger.sqlite"), clock=clock)
    fleet.billing.node_operations = _deleted_at(None)  # our create: 0-50 s
    fleet.billing.operations = lambda zone, name: _deleted_at(None)(zone, name)[0]
    request = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE, run_id=RUN).request
    fleet.billing.created(ZONE, request, "c", at(0))
    fleet.billing.find_node = None  # the listing's word taken: its lag closes the record (BillingObserver.gone)
    fleet.billing.listed(ZONE, {}, asked=at(30))  # the lag: the zone as it was before the create
    clock.advance_to(at(300).timestamp())
    fleet.billing.listed(ZONE, {"n": _node(NodeState.PREEMPTED)}, asked=at(300))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n", uid="7")] == [
        ("READY", at(50)), ("PREEMPTED", at(300))]


def test_a_node_a_lagging_listing_no_longer_shows_is_looked_up_before_it_is_dated_gone(tmp_path: Path) -> None:
    """A listing that lags shows the zone as it was before our create: the node is looked up (GetNode) and found
    READY, so its record stays open, and it ends where it deleted itself (1000 s). Taken for gone on the listing's
    word, it ended at the first look and the 870 s it billed after were missing (the swarm's seeds 956, 1445,
    2204); a lookup that fails is no evidence either way."""
    settings = _settings(tmp_path)
    clock = VirtualClock(at(300).timestamp())
    fleet = Fleet(TpuApi(P), settings, Ledger(tmp_path / "ledger.sqlite"), clock=clock)
    def operations(zone: str, name: str) -> list[Operation]:  # created 0-50 s, deleted itself at 1000 s
        return _deleted_at(1000 if clock() >= at(1000).timestamp() else None)(zone, name)

    fleet.billing.node_operations = operations
    fleet.billing.operations = lambda zone, name: _deleted_at(None)(zone, name)[0]
    request = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE, run_id=RUN).request
    fleet.billing.created(ZONE, request, "c", at(0))
    for lookup in (lambda zone, name: _node(NodeState.READY), _unanswered):
        fleet.billing.find_node = lookup
        fleet.billing.listed(ZONE, {}, asked=datetime.fromtimestamp(clock(), UTC))  # the lag: as before the create
        clock.advance_to(clock() + 300)
    clock.advance_to(at(1200).timestamp())
    fleet.billing.find_node = _nowhere
    fleet.billing.listed(ZONE, {}, asked=at(1200))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("READY", at(50)), (DELETED, at(1000))]


def _unanswered(zone: str, name: str) -> NodeInfo | None:
    raise TransientError("503: the API failed this call")


def test_a_create_operation_over_before_the_node_was_created_does_not_date_its_ready(tmp_path: Path) -> None:
    """The create operation a run's memory still names (the write of the new one's was lost) made the node's
    forerunner: it ended before this incarnation was created, so the create the provider lists for this one dates
    its READY (the old one dated a replacement READY hours early: the swarm's seed 44)."""
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"))
    fleet.billing.node_operations = _deleted_at(None)  # this incarnation's create: 0-50 s
    fleet.billing.operations = lambda zone, name: Operation(name, ZONE, True, target="n", started=at(-2000),
                                                             ended=at(-1900), verb="create")
    fleet.billing.expect(ZONE, "n", "old")
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [("READY", at(50))]


@pytest.mark.parametrize("asked", [0.0, -40.0])  # asked for as the node was created; while its name was still deleting
def test_a_node_seen_creating_whose_create_answer_was_lost_is_ready_where_its_listed_create_ended(
        tmp_path: Path, asked: float) -> None:
    """Never told of the create (its answer was lost), the observer sees the node CREATING, then READY: the create the
    provider lists dates READY (it was dated within the gap, 115 s late here; the swarm's seed 58), also when it was
    asked for before the node's createTime (the name was free only once its forerunner's delete was over)."""
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"))
    ops = [Operation("c", ZONE, True, target="n", started=at(asked), ended=at(50), verb="create")]
    fleet.billing.node_operations = lambda zone, name: ops
    fleet.billing.observe(_node(NodeState.CREATING), at=at(30))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("CREATING", at(30)), ("READY", at(50))]


def test_a_run_that_ended_while_the_api_failed_is_billed_until_its_delete_got_through(tmp_path: Path) -> None:
    """Issue 38, defect 1: the agent ended at 320 s, the API refused every call until 900 s, and the self-delete
    went through at 910 s. The node was billed until then, so the ledger ends it there, not at the run's end; with
    the guard off the end is only guessed within the gap, short of what was billed."""
    store = LocalStore(tmp_path / "store", durable=False)
    runs.write_status(store, RUN, AgentStatus(run_id=RUN, phase=Phase.DONE, exit_class=ExitClass.SUCCEEDED,
                                              ended=at(320).isoformat()))
    for guard_on in (True, False):
        fleet = Fleet(TpuApi(P), _settings(tmp_path / str(guard_on)), Ledger(tmp_path / f"{guard_on}.sqlite"))
        fleet.billing.node_operations = _deleted_at(910)
        with contextlib.ExitStack() as stack:
            if not guard_on:
                stack.enter_context(guards.off("ledger.evidence_end"))
            fleet.billing.observe(_node(NodeState.READY), at=at(0))
            fleet.billing.observe(_node(NodeState.READY), at=at(300))  # the last look before the outage
            fleet.billing.find_node = _nowhere
            fleet.billing.listed(ZONE, {}, asked=at(930))  # the first look after it: gone
        [*_, last] = fleet.billing.ledger.transitions(P, ZONE, "n")
        assert last.state == DELETED
        assert (last.at == at(910)) is guard_on


def _vanished(tmp_path: Path, ended: datetime | None) -> Settings:
    """A run's node READY in the ledger since 60 s, gone from the cloud (the in-memory provider holds none), and its
    run's last status saying when the agent ended (None: no status)."""
    from tpuops.core.kinds import Cloud
    from tpuops.session import open_ledger, store

    settings = Settings(tpu_endpoint=Cloud.GCP, node_provider="memory", project=P, zones=[ZONE],
                        home=tmp_path / "home", store=str(tmp_path / "store"))
    ledger = open_ledger(settings)
    ledger.record_node(P, ZONE, "n", "v2-8", "on-demand", run_id=RUN, uid="7", at=at(0))
    ledger.observe(P, ZONE, "n", NodeState.READY, at(60), uid="7")
    if ended is not None:
        runs.write_status(store(settings), RUN, AgentStatus(run_id=RUN, phase=Phase.DONE,
                                                            exit_class=ExitClass.SUCCEEDED, ended=ended.isoformat()))
    return settings


def _status(settings: Settings) -> None:
    from tpuops import api

    api.status(settings)


def _down_all(settings: Settings) -> None:
    from tpuops import api

    api.down(settings, None)


def _dashboard_nodes(settings: Settings) -> None:
    from tpuops.api.pages import nodes

    nodes(settings)


@pytest.mark.parametrize("command", [_status, _down_all, _dashboard_nodes], ids=["status", "down --all", "dashboard"])
@pytest.mark.parametrize("said", [420.0, None])
def test_status_down_and_the_dashboard_never_date_a_vanished_node_at_its_run_s_end(
    tmp_path: Path, command: Callable[[Settings], None], said: float | None,
) -> None:
    """Any command whose listing finds a run's node gone, with no delete operation to date it (this provider lists
    none), ends it when the listing saw it gone: the run's end (420 s) is no evidence that the node was."""
    from tpuops.session import open_ledger

    settings = _vanished(tmp_path, None if said is None else at(said))
    before = datetime.now(UTC)
    command(settings)
    last = open_ledger(settings).transitions(P, ZONE, "n", uid="7")[-1]
    assert last.state == DELETED and last.at >= before


class _ListsOperations(MemoryProvider):
    """The in-memory cloud, which also lists the operations on a node: a self-delete of "n" at 420 s."""

    def node_operations(self, zone: str, name: str) -> list[Operation]:
        return _deleted_at(420)(zone, name)


@pytest.mark.parametrize("evidence", [True, False])
def test_a_delete_of_a_node_already_gone_closes_its_ledger_entry_reading_only_what_its_evidence_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, evidence: bool) -> None:
    settings = _settings(tmp_path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for name, uid in (("n", "7"), ("m", "8")):  # both open in the zone; only "n" is deleted
        ledger.record_node(P, ZONE, name, "v2-8", "on-demand", run_id=f"run-{name}", uid=uid, at=at(0))
        ledger.observe(P, ZONE, name, NodeState.READY, at(60), uid=uid)
    provider = _ListsOperations(P) if evidence else MemoryProvider(P)
    fleet = Fleet(provider, settings, ledger, clock=VirtualClock(at(900).timestamp()))
    asked: list[dict[str, object]] = []
    real = Ledger.nodes
    monkeypatch.setattr(Ledger, "nodes", lambda self, *args, **kwargs: asked.append(kwargs)
                        or real(self, *args, **kwargs))
    assert fleet.delete(ZONE, "n") is False  # the provider holds no such node: it deleted itself
    monkeypatch.undo()
    assert asked == ([{"name": "n", "open_only": True}] if evidence else [])
    last = ledger.transitions(P, ZONE, "n", uid="7")[-1]
    assert (last.state, last.at) == (DELETED, at(420) if evidence else at(900))


def test_a_node_another_process_created_is_billed_from_its_create_s_end_not_its_first_sighting(
        tmp_path: Path) -> None:
    """Issue 38: a node created by a pass of ``train`` or by ``up --no-wait`` and first seen READY by another process
    (``status``) was dated READY at that sighting, seconds late. The create the provider lists for it dates it (its
    end, 50 s), once: a later process finds the ledger has it READY already and asks nothing."""
    asked: list[str] = []

    def operations(zone: str, name: str) -> list[Operation]:
        asked.append(name)
        return _deleted_at(None)(zone, name)

    for _ in range(2):  # two processes in turn, one ledger
        fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"))
        fleet.billing.node_operations = operations
        fleet.billing.observe(_node(NodeState.READY), at=at(56))
    assert asked == ["n"]
    assert [(t.state, t.at) for t in Ledger(tmp_path / "ledger.sqlite").transitions(P, ZONE, "n")] == [
        ("READY", at(50))]


class _LostAnswer(MemoryProvider):
    """Takes every create, then answers it with a 503 (the answer was lost on the way back)."""

    def create_node(self, zone: str, request: NodeRequest) -> Operation:
        super().create_node(zone, request)
        raise TransientError("503: the answer was lost")


def test_a_create_whose_answer_was_lost_is_in_the_ledger_all_the_same(tmp_path: Path) -> None:
    """The node may exist: it is recorded, so that its zone is listed and what it bills is seen (unrecorded, a node
    in a zone the ledger held nothing in billed unseen: the swarm's seed 178). Not with fleet.write_ahead off."""
    for guard_on in (True, False):
        settings = _settings(tmp_path / str(guard_on))
        fleet = Fleet(_LostAnswer(P), settings, Ledger(tmp_path / f"{guard_on}.sqlite"))
        plan = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE, run_id=RUN)
        with contextlib.ExitStack() as stack:
            if not guard_on:
                stack.enter_context(guards.off("fleet.write_ahead"))
            with pytest.raises(TransientError):
                fleet.create(ZONE, plan.request)
        assert [r.name for r in fleet.billing.ledger.nodes(P, ZONE, open_only=True)] == (["n"] if guard_on else [])


def test_a_node_only_absent_from_a_listing_stays_open_until_its_delete_is_found(tmp_path: Path) -> None:
    """A listing behind (a cache) that leaves out a live node, or a node whose operations cannot be listed, is no
    evidence of its end: the ledger keeps it open and asks again at the next listing (the swarm's seeds 152, closed on
    a stale listing and 900 s short, and 30, a self-delete dated early when the operations failed); up to
    ``EVIDENCE_WAIT_S`` after the first listing that missed it, then dated at that listing."""
    from tpuops.billing.observer import EVIDENCE_WAIT_S

    clock = VirtualClock(at(0).timestamp())
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"), clock=clock)
    answers: list[Callable[[str, str], list[Operation]]] = [_deleted_at(None)]

    def operations(zone: str, name: str) -> list[Operation]:
        if not answers:
            raise TransientError("503")
        return answers[0](zone, name)

    fleet.billing.node_operations = operations
    fleet.billing.listed(ZONE, {"n": _node(NodeState.READY)}, at(0))
    fleet.billing.listed(ZONE, {"n": _node(NodeState.READY)}, at(300))
    for when, answer in ((600, _deleted_at(None)), (900, None)):  # no delete listed yet; the operations fail
        answers[:] = [answer] if answer else []
        clock.advance_to(at(when).timestamp())
        fleet.billing.listed(ZONE, {}, at(when))
        assert [t.state for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == ["READY"]
    answers[:] = [_deleted_at(420)]
    clock.advance_to(at(1200).timestamp())
    fleet.billing.listed(ZONE, {}, at(1200))
    assert fleet.billing.ledger.transitions(P, ZONE, "n")[-1].at == at(420)
    stale = Fleet(TpuApi(P), _settings(tmp_path / "stale"), Ledger(tmp_path / "stale.sqlite"), clock=clock)
    stale.billing.node_operations = _deleted_at(None)
    stale.billing.listed(ZONE, {"n": _node(NodeState.READY)}, at(1200))
    for when in (1500, 1500 + EVIDENCE_WAIT_S):  # the first listing that misses it, and an hour of them
        clock.advance_to(at(when).timestamp())
        stale.billing.listed(ZONE, {}, at(when))
        assert stale.billing.ledger.transitions(P, ZONE, "n")[-1].state == "READY"
    clock.advance_to(at(1501 + EVIDENCE_WAIT_S).timestamp())
    stale.billing.listed(ZONE, {}, at(1501 + EVIDENCE_WAIT_S))  # waited long enough: dated at the first that missed it
    assert [(t.state, t.at) for t in stale.billing.ledger.transitions(P, ZONE, "n")][-1] == (DELETED, at(1500))


def test_a_listing_behind_our_replacement_does_not_reopen_the_node_we_deleted(tmp_path: Path) -> None:
    """We deleted the node and created its replacement under the same name; a listing that lags still shows the one
    we deleted READY. That incarnation's end is in the ledger: the stale sighting changes nothing (it re-opened it,
    which then took the replacement's READY and billed 3.4 times what the cloud did: the swarm's seed 42)."""
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"),
                  clock=VirtualClock(at(400).timestamp()))
    fleet.billing.node_operations = _deleted_at(None)
    fleet.billing.listed(ZONE, {"n": _node(NodeState.READY)}, at(0))
    fleet.billing.gone(ZONE, "n", at(300))
    request = NodeRequest(name="n", accelerator="v2-8", runtime="tpu-vm-tf-2.9.3", capacity=Capacity.ON_DEMAND,
                          labels={MANAGED_BY_KEY: MANAGED_BY_VALUE, RUN_KEY: RUN})
    fleet.billing.created(ZONE, request, "op-new", at(310))
    fleet.billing.listed(ZONE, {"n": _node(NodeState.READY)}, at(400))  # the deleted incarnation, uid 7
    assert [t.state for t in fleet.billing.ledger.transitions(P, ZONE, "n", uid="7")] == ["READY", DELETED]


def test_a_node_found_gone_with_no_delete_listed_ends_at_that_finding(tmp_path: Path) -> None:
    """A lookup finds the node gone (a delete of ours answered that it was not there), but the operations listing
    lags and shows no delete yet: no evidence says when within the gap it went, so its end is the finding, where it
    had surely stopped. The middle of the gap dated self-deletes early, billing missed (the swarm's seeds 4417 and
    7036: 25 s and 100 s before the self-delete)."""
    clock = VirtualClock(at(600).timestamp())
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"), clock=clock)
    fleet.billing.node_operations = _deleted_at(None)
    fleet.billing.observe(_node(NodeState.READY), at=at(0))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    fleet.billing.gone(ZONE, "n")
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("READY", at(0)), (DELETED, at(600))]


def test_a_record_another_process_closed_meanwhile_closes_nothing_else(tmp_path: Path) -> None:
    """A pass reads the open record of incarnation 7, and its lookup is slow: meanwhile another process dates 7's end
    and sees its successor 8 READY. The lookup then finds 8 under the name, so 7 is gone, but its end stands; closing
    "the name's open incarnation" closed 8, READY for 900 s more in the cloud (the swarm's seed 6143)."""
    clock = VirtualClock(at(0).timestamp())
    ledger = Ledger(tmp_path / "ledger.sqlite")
    slow, other = (Fleet(TpuApi(P), _settings(tmp_path / who), ledger, clock=clock) for who in ("slow", "other"))
    for fleet in (slow, other):
        fleet.billing.node_operations = _deleted_at(None)
    slow.billing.listed(ZONE, {"n": _node(NodeState.READY)}, at(0))
    [record] = ledger.nodes(P, ZONE, open_only=True)
    successor = dataclasses.replace(_node(NodeState.READY), uid="8", create_time=at(400))
    clock.advance_to(at(300).timestamp())
    other.billing.gone(ZONE, "n", at(300))
    other.billing.observe(successor, at=at(500))
    clock.advance_to(at(600).timestamp())
    slow.billing.gone(ZONE, "n", record=record, absent=True)
    assert [t.state for t in ledger.transitions(P, ZONE, "n", uid="7")] == ["READY", DELETED]
    assert [t.state for t in ledger.transitions(P, ZONE, "n", uid="8")] == ["READY"]
    assert [r.uid for r in ledger.nodes(P, ZONE, open_only=True)] == ["8"]


def test_a_process_told_of_an_old_create_never_reopens_a_preempted_node_ready(tmp_path: Path) -> None:
    """A cron pass beside the watch (a fresh process) is told of the run's create (``expect``), which ended at 50 s,
    and first sees the node PREEMPTED at 900 s; the ledger holds it READY from 50 s and PREEMPTED at 450 s already.
    The create is no news: it re-opened the node READY from 50 s at every such pass, to the next sighting PREEMPTED
    (the swarm's seed 8825: 71059 s held against 4351 s billed)."""
    clock = VirtualClock(at(0).timestamp())
    ledger = Ledger(tmp_path / "ledger.sqlite")
    watch = Fleet(TpuApi(P), _settings(tmp_path / "watch"), ledger, clock=clock)
    create = Operation("c", ZONE, True, target="n", started=at(0), ended=at(50), verb="create")
    watch.billing.node_operations = lambda zone, name: [create]
    watch.billing.observe(_node(NodeState.READY), at=at(300))
    watch.billing.observe(_node(NodeState.PREEMPTED), at=at(600))
    held = [(t.state, t.at) for t in ledger.transitions(P, ZONE, "n", uid="7")]
    assert [state for state, _ in held] == ["READY", "PREEMPTED"]
    for when in (900, 1200):
        cron = Fleet(TpuApi(P), _settings(tmp_path / f"cron{when}"), ledger, clock=clock)
        cron.billing.node_operations = lambda zone, name: [create]
        cron.billing.operations = lambda zone, name: create
        cron.billing.expect(ZONE, "n", "c")
        clock.advance_to(at(when).timestamp())
        cron.billing.observe(_node(NodeState.PREEMPTED), at=at(when))
    assert [(t.state, t.at) for t in ledger.transitions(P, ZONE, "n", uid="7")] == held


def test_a_record_read_before_its_replacement_closes_its_own_incarnation_never_the_replacement(
        tmp_path: Path) -> None:
    """A pass reads node 7's open record, then another process sees its replacement (node 8, which closes node 7);
    the pass, finding the name absent, closes the record it read: node 7's own incarnation, never the name's
    latest (closed at node 7's end, node 8's 1507 s billed were missing: the swarm's seed 7560)."""
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"))
    fleet.billing.node_operations = None
    fleet.billing.observe(_node(NodeState.READY), at=at(0))
    [stale] = fleet.billing.ledger.nodes(P, ZONE, name="n", open_only=True)
    other = Fleet(TpuApi(P), _settings(tmp_path), fleet.billing.ledger)
    other.billing.observe(dataclasses.replace(_node(NodeState.READY), uid="8", create_time=at(150)), at=at(200))
    fleet.billing.gone(ZONE, "n", record=stale, absent=True)
    assert [(r.uid, r.deleted_at) for r in fleet.billing.ledger.nodes(P, ZONE, name="n")] == [
        ("7", at(150)), ("8", None)]
