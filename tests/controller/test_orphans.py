"""The orphan reaper (``tpuops.controller.orphans``) against the in-memory provider and a local store: a probe is
its run's (reaped only when the run's memory no longer claims it, and only under the run's lease), and a node of a
run another controller holds is never touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuops import runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller import orphans
from tpuops.controller.decide import Action, ActionKind
from tpuops.controller.probes import apply_probe, probe_node_name
from tpuops.core.kinds import Capacity
from tpuops.core.naming import RUN_KEY, MetadataKey
from tpuops.fleet import Fleet
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.nodes import NodeRequest
from tpuops.runs import Memory, NodeSpec, PendingCreate, RunKind, RunRecord
from tpuops.store import LocalStore, Store
from tpuops.store.lease import Leases

pytestmark = pytest.mark.unit

A = "us-central1-a"
RUN = "elastic"
PROBE = probe_node_name(RUN)


def _spec(accelerator: str) -> NodeSpec:
    return NodeSpec(name=RUN, accelerator=accelerator, runtime="tpu-vm-tf-2.9.1-pod", capacity=Capacity.SPOT,
                    labels={"managed-by": "tpuops", RUN_KEY: RUN},
                    metadata={MetadataKey.STARTUP_SCRIPT.value: "#!/bin/sh\nexec job\n"}, zones=[A])


RECORD = RunRecord(run_id=RUN, kind=RunKind.TRAIN, node=_spec("v2-32"), smaller=[_spec("v2-8")])


@pytest.fixture
def world(tmp_path: Path) -> tuple[MemoryProvider, Fleet, Store]:
    settings = Settings(zones=[A], home=tmp_path / "home", store=str(tmp_path / "store"))
    cloud = MemoryProvider(poll_interval_s=0.01)
    store = LocalStore(tmp_path / "store")
    store.write_bytes(runs.record_key(RUN), RECORD.model_dump_json().encode())
    return cloud, Fleet(cloud, settings, Ledger(settings.ledger_path)), store


def _reap(fleet: Fleet, store: Store, leases: Leases, held: set[str]) -> list[str]:
    listed, _ = fleet.list_zones([A])
    return orphans.reap(fleet, store, leases, held, listed, {RUN}, 0.0, lambda _line: None)


def test_a_probe_is_reaped_only_once_its_run_forgets_it_and_only_under_its_runs_lease(
    world: tuple[MemoryProvider, Fleet, Store],
) -> None:
    cloud, fleet, store = world
    memory = Memory(size=1)
    memory.probe = PendingCreate(zone=A, at=0.0)
    apply_probe(fleet, RECORD, memory, Action(ActionKind.PROBE, A), 1.0)
    generation = runs.save_memory(store, RUN, memory, 0)
    cron, watch, held = Leases(store, "cron", ttl_s=600), Leases(store, "watch", ttl_s=600), set[str]()
    assert _reap(fleet, store, cron, held) == [] and (A, PROBE) in cloud.nodes  # its run's memory claims it

    memory.probe = None  # the memory write after the create was lost: no decision will delete the probe
    runs.save_memory(store, RUN, memory, generation)
    cron.release(RUN)  # the cron exits; the watch takes the run
    assert watch.acquire(RUN)
    assert _reap(fleet, store, cron, held) == [] and (A, PROBE) in cloud.nodes  # the watch holds the run

    watch.release(RUN)
    assert _reap(fleet, store, cron, held) == [PROBE] and (A, PROBE) not in cloud.nodes
    assert held == {RUN} and json.loads(store.read_bytes(f"leases/{RUN}"))["holder"] == "cron"


def test_a_node_of_a_run_the_store_does_not_know_is_reaped_unless_another_controller_holds_its_lease(
    world: tuple[MemoryProvider, Fleet, Store],
) -> None:
    cloud, fleet, store = world
    for name in ("lost-1", "lost-2"):
        fleet.create(A, NodeRequest(name=name, accelerator="v2-8", runtime="tpu-vm-tf-2.9.1-pod",
                                    capacity=Capacity.SPOT, labels={"managed-by": "tpuops", RUN_KEY: name}))
    assert Leases(store, "watch", ttl_s=600).acquire("lost-2")  # being declared by another controller right now
    assert _reap(fleet, store, Leases(store, "cron", ttl_s=600), set()) == ["lost-1"]
    assert (A, "lost-2") in cloud.nodes
