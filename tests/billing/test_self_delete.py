"""A node that deletes itself when its job ends: the ledger ends its READY time at the self-delete.

The dead-man's switch deletes the node from inside the VM, which no API call dates; the run's last
status does (``runs.self_deleted_at``), and ``Fleet`` keeps that moment within the two sightings
that framed the disappearance. Without it the end is the middle of the gap, which for jobs of one
length is off the same way every time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tpuops import runs
from tpuops.billing.ledger import DELETED, Ledger
from tpuops.config import Settings, load_settings
from tpuops.controller.reconcile import Controller
from tpuops.core.clock import UTC, VirtualClock
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MANAGED_BY_KEY, MANAGED_BY_VALUE, RUN_KEY
from tpuops.fleet import Fleet
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_model import CloudModel
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.providers.nodes import NodeInfo, NodeState
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
    fleet = Fleet(cloud, settings, ledger, clock=clock,
                  self_deletes=(lambda run_id: runs.self_deleted_at(store, run_id)) if evidence else None)
    plan = plan_up(settings, "n", accelerator="v2-8", capacity=Capacity.ON_DEMAND, zone=ZONE, run_id=RUN)
    fleet.create(ZONE, plan.request)
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
    """The simulated agent's last status dates the self-delete; the ledger ends READY there, as billed."""
    ended, billed = _watch_until_gone(tmp_path / "evidence", evidence=True)
    assert billed.end is not None and abs(ended.timestamp() - billed.end) < 1e-3
    guessed, _ = _watch_until_gone(tmp_path / "guess", evidence=False)
    assert abs(guessed.timestamp() - billed.end) > 1.0  # the middle of the gap: what the evidence replaces


def test_a_node_that_lived_and_deleted_itself_between_two_passes_is_billed_from_its_create_to_its_self_delete(
        tmp_path: Path) -> None:
    """Created, READY, trained and gone before the first pass looked: the ledger had the node with no READY time,
    so it billed nothing. Its create operation dates READY, its run's status the self-delete, as Cloud TPU billed."""
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


@pytest.mark.parametrize(("said", "dated"), [
    (420.0, 420.0),  # inside the gap between the last READY sighting (300 s) and DELETING (600 s)
    (700.0, 600.0),  # after the sighting that saw it: kept to it
    (100.0, 300.0),  # before the last READY sighting (a kept node deleted later): kept to that
    (-50.0, 450.0),  # before the node's create: another incarnation's, so the middle of the gap
    (None, 450.0),  # no evidence: the middle of the gap
])
def test_the_self_delete_is_kept_within_the_sightings(tmp_path: Path, said: float | None, dated: float) -> None:
    fleet = Fleet(TpuApi(P), _settings(tmp_path), Ledger(tmp_path / "ledger.sqlite"),
                  self_deletes=lambda run_id: None if said is None else at(said))
    fleet.billing.observe(_node(NodeState.READY), at=at(0))
    fleet.billing.observe(_node(NodeState.READY), at=at(300))
    fleet.billing.observe(_node(NodeState.DELETING), at=at(600))
    assert [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")] == [
        ("READY", at(0)), ("DELETING", at(dated))]


@pytest.mark.parametrize(("exit_class", "ended", "evidence"), [
    (ExitClass.SUCCEEDED, at(42).isoformat(), at(42)),
    (ExitClass.CRASHED, at(42).isoformat(), at(42)),  # the switch deletes the node whatever the exit
    (ExitClass.PREEMPTED, at(42).isoformat(), None),  # a preempted VM does not delete itself
    (None, None, None),  # still running
    (ExitClass.SUCCEEDED, None, None),  # an agent older than the field
    (ExitClass.SUCCEEDED, "2024-05-01T12:00:42", None),  # no time zone: no evidence
])
def test_the_run_status_says_when_its_node_deleted_itself(
    tmp_path: Path, exit_class: ExitClass | None, ended: str | None, evidence: datetime | None,
) -> None:
    store = LocalStore(tmp_path / "store", durable=False)
    assert runs.self_deleted_at(store, RUN) is None
    runs.write_status(store, RUN, AgentStatus(run_id=RUN, phase=Phase.DONE, exit_class=exit_class, ended=ended))
    assert runs.self_deleted_at(store, RUN) == evidence


def test_the_controller_dates_self_deletes_from_its_store(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    store = LocalStore(tmp_path / "store", durable=False)
    fleet = Fleet(TpuApi(P), settings, Ledger(tmp_path / "ledger.sqlite"))
    Controller(settings, store, fleet, billing=fleet.billing, sweeps=None, holder="test")
    assert fleet.billing.self_deletes is not None and fleet.billing.self_deletes(RUN) is None
    runs.write_status(store, RUN, AgentStatus(run_id=RUN, phase=Phase.DONE, exit_class=ExitClass.SUCCEEDED,
                                              ended=at(42).isoformat()))
    assert fleet.billing.self_deletes(RUN) == at(42)


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
@pytest.mark.parametrize(("said", "dated"), [
    (420.0, 420.0),  # the self-delete its run's status dates
    (30.0, 60.0),  # before the READY the ledger holds: kept to it
    (None, None),  # no evidence: when the listing saw it gone (now)
])
def test_status_down_and_the_dashboard_date_a_self_deleted_node_where_its_run_says(
    tmp_path: Path, command: Callable[[Settings], None], said: float | None, dated: float | None,
) -> None:
    """Not only the controller: any command whose listing finds a run's node gone ends it at its self-delete."""
    from tpuops.session import open_ledger

    settings = _vanished(tmp_path, None if said is None else at(said))
    before = datetime.now(UTC)
    command(settings)
    last = open_ledger(settings).transitions(P, ZONE, "n", uid="7")[-1]
    assert last.state == DELETED
    if dated is None:
        assert last.at >= before
    else:
        assert last.at == at(dated)


@pytest.mark.parametrize("evidence", [True, False])
def test_a_delete_of_a_node_already_gone_closes_its_ledger_entry_reading_only_what_its_evidence_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, evidence: bool) -> None:
    from tpuops.providers.memory import MemoryProvider

    settings = _settings(tmp_path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for name, uid in (("n", "7"), ("m", "8")):  # both open in the zone; only "n" is deleted
        ledger.record_node(P, ZONE, name, "v2-8", "on-demand", run_id=f"run-{name}", uid=uid, at=at(0))
        ledger.observe(P, ZONE, name, NodeState.READY, at(60), uid=uid)
    said = {"run-n": at(420)}
    fleet = Fleet(MemoryProvider(P), settings, ledger, clock=VirtualClock(at(900).timestamp()),
                  self_deletes=said.get if evidence else None)
    asked: list[dict[str, object]] = []
    real = Ledger.nodes
    monkeypatch.setattr(Ledger, "nodes", lambda self, *args, **kwargs: asked.append(kwargs)
                        or real(self, *args, **kwargs))
    assert fleet.delete(ZONE, "n") is False  # the provider holds no such node: it deleted itself
    monkeypatch.undo()
    assert asked == ([{"name": "n", "open_only": True}] if evidence else [])
    last = ledger.transitions(P, ZONE, "n", uid="7")[-1]
    assert (last.state, last.at) == (DELETED, at(420) if evidence else at(900))
    assert [record.name for record in ledger.nodes(P, ZONE, open_only=True)] == ["m"]
