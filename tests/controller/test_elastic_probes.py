"""An elastic run's probes (``tpuops.controller.probes``) against the in-memory provider through the Fleet: what a
probe asks for, how its answer is read, and that a node merely named like a probe is never taken or deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.decide import Action, ActionKind
from tpuops.controller.probes import PROBE_KEY, apply_probe, probe_node_name, probe_observed
from tpuops.core.create_result import CreateResult
from tpuops.core.errors import CapacityError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import RUN_KEY, MetadataKey
from tpuops.fleet import Fleet
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.nodes import NodeRequest, NodeState
from tpuops.runs import Memory, NodeSpec, PendingCreate, RunKind, RunRecord

pytestmark = pytest.mark.unit

A, B = "us-central1-a", "us-central1-b"
RUN = "elastic"


def _spec(accelerator: str, zone: str) -> NodeSpec:
    return NodeSpec(name=RUN, accelerator=accelerator, runtime="tpu-vm-tf-2.9.1-pod", capacity=Capacity.SPOT,
                    labels={"managed-by": "tpuops", RUN_KEY: RUN},
                    metadata={MetadataKey.STARTUP_SCRIPT.value: "#!/bin/sh\nexec job\n"}, zones=[zone])


RECORD = RunRecord(run_id=RUN, kind=RunKind.TRAIN, node=_spec("v2-32", A), smaller=[_spec("v2-8", B)])


@pytest.fixture
def world(tmp_path: Path) -> tuple[MemoryProvider, Fleet]:
    settings = Settings(zones=[A, B], home=tmp_path / "home", store=str(tmp_path / "store"))
    cloud = MemoryProvider(poll_interval_s=0.01)
    return cloud, Fleet(cloud, settings, Ledger(settings.ledger_path))


def _probing(size: int = 0) -> Memory:
    memory = Memory(size=1)
    memory.probe, memory.probe_size = PendingCreate(zone=A, at=0.0), size
    return memory


def test_a_probe_is_a_bare_node_of_the_larger_size_labelled_as_a_probe_and_deleted_after(
    world: tuple[MemoryProvider, Fleet],
) -> None:
    cloud, fleet = world
    memory = _probing()
    apply_probe(fleet, RECORD, memory, Action(ActionKind.PROBE, A), 1.0)
    node = cloud.nodes[(A, probe_node_name(RUN))]
    assert (node.accelerator, node.labels[PROBE_KEY], node.labels[RUN_KEY]) == ("v2-32", RUN, "elastic-up")
    assert memory.probe is not None and memory.probe.operation
    cloud.set_state(A, "elastic-up", NodeState.READY)
    listed, _ = fleet.list_zones([A])
    seen = probe_observed(fleet, RECORD, memory, listed)
    assert seen["probe_ready"] is True and seen["probe_result"] in (CreateResult.OK, CreateResult.RUNNING)
    apply_probe(fleet, RECORD, memory, Action(ActionKind.UNPROBE, A), 2.0)
    assert ("DeleteNode", "elastic-up") in [call[:2] for call in cloud.calls]


def test_a_refused_probe_is_remembered_as_a_stockout(world: tuple[MemoryProvider, Fleet]) -> None:
    cloud, fleet = world
    cloud.faults[("CreateNode", "elastic-up")] = CapacityError("no v2-32 in us-central1-a")
    memory = _probing()
    apply_probe(fleet, RECORD, memory, Action(ActionKind.PROBE, A), 1.0)
    listed, _ = fleet.list_zones([A])
    assert probe_observed(fleet, RECORD, memory, listed)["probe_result"] is CreateResult.CAPACITY


def test_a_node_only_named_like_the_probe_is_neither_evidence_nor_deleted(world: tuple[MemoryProvider, Fleet]) -> None:
    cloud, fleet = world
    other = NodeRequest(name="elastic-up", accelerator="v2-32", runtime="tpu-vm-tf-2.9.1-pod",
                        capacity=Capacity.SPOT, labels={"managed-by": "tpuops", RUN_KEY: "elastic-up"})
    fleet.create(A, other)
    cloud.set_state(A, "elastic-up", NodeState.READY)  # a user's run called elastic-up, training
    memory = _probing()
    apply_probe(fleet, RECORD, memory, Action(ActionKind.PROBE, A), 1.0)  # AlreadyExists: a failed probe
    listed, _ = fleet.list_zones([A])
    seen = probe_observed(fleet, RECORD, memory, listed)
    assert seen["probe_result"] is CreateResult.FAILED and not seen.get("probe_ready")
    apply_probe(fleet, RECORD, memory, Action(ActionKind.UNPROBE, A), 2.0)
    assert (A, "elastic-up") in cloud.nodes and ("DeleteNode", "elastic-up") not in [c[:2] for c in cloud.calls]


def test_a_probe_is_billed_to_its_run_not_to_a_run_of_its_own_name(tmp_path: Path) -> None:
    settings = Settings(zones=[A, B], home=tmp_path / "home", store=str(tmp_path / "store"))
    ledger = Ledger(settings.ledger_path)
    fleet = Fleet(MemoryProvider(poll_interval_s=0.01), settings, ledger)
    apply_probe(fleet, RECORD, _probing(), Action(ActionKind.PROBE, A), 1.0)
    assert [h.node.name for h in ledger.histories(run_id=RUN)] == ["elastic-up"]
    assert ledger.histories(run_id="elastic-up") == []
