"""The ``NodeProvider`` contract (tpuops/providers/base.py), run against every registered provider.

Each test receives a provider opened through the registry, as ``tpuops`` opens one: the Cloud TPU
adapter over the emulator (the official client over HTTP), the in-memory provider, the simulated
cloud (on wall time at the emulator's pace) and a test-only provider whose vocabulary is not Cloud TPU's
(``provider_jobset``: TPUs on GKE as JobSet manifests, registered by one line). The tests
never ask which one they got. A create's operation may be done at once or later, and a node may be
CREATING or READY once its create is done: the contract promises neither, so no test assumes it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import pytest

from tpuops.billing.pricing import catalog_of
from tpuops.core.clock import UTC
from tpuops.core.create_result import CreateResult
from tpuops.core.errors import AlreadyExists, NotFound, UsageError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import labels_for
from tpuops.providers.base import Connection, NodeProvider, wait_for
from tpuops.providers.nodes import NodeRequest, NodeState
from tpuops.providers.registry import PROVIDERS, offers_of, open_provider

PROJECT = "proj-test"
ZONE, OTHER_ZONE = "us-central1-b", "us-central1-f"  # both offer v3-8
WAIT_S = 30.0


JOBSET = "provider_jobset:JobSetProvider"
"""The test-only provider's registry line (``tests/provider_jobset.py``)."""


@pytest.fixture(params=[pytest.param("memory", marks=pytest.mark.unit),
                        pytest.param("simulated", marks=pytest.mark.unit),
                        pytest.param("jobset", marks=pytest.mark.unit),
                        pytest.param("cloud-tpu", marks=pytest.mark.emulator)])
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> NodeProvider:
    monkeypatch.setitem(PROVIDERS, "jobset", JOBSET)
    connection = Connection(PROJECT, deadline_s=10, poll_interval_s=0.02)
    if request.param == "cloud-tpu":
        emulator = request.getfixturevalue("emulator")
        connection = Connection(PROJECT, endpoint=emulator.endpoint, token=emulator.token, deadline_s=10,
                                poll_interval_s=0.02)
    return open_provider(request.param, connection)


def _request(name: str, capacity: Capacity = Capacity.SPOT) -> NodeRequest:
    return NodeRequest(name=name, accelerator="v3-8", runtime="tpu-vm-tf-2.9.3", capacity=capacity,
                       labels=labels_for(run_id=name, user={"team": "ml"}))


@dataclass
class Made:
    """A node made through the provider, and when we asked for it."""

    name: str
    asked: datetime


def _make(provider: NodeProvider, name: str, zone: str = ZONE, capacity: Capacity = Capacity.SPOT) -> Made:
    asked = datetime.now(UTC)
    wait_for(provider, provider.create_node(zone, _request(name, capacity)), timeout_s=WAIT_S)
    return Made(name, asked)


@pytest.mark.unit
def test_the_registry_names_each_provider_once() -> None:
    assert sorted(PROVIDERS) == ["cloud-tpu", "memory", "simulated"]


def test_a_created_node_is_found_and_listed_as_requested(provider: NodeProvider) -> None:
    _make(provider, "c-1")
    node = provider.find_node(ZONE, "c-1")
    assert node is not None
    assert (node.name, node.zone, node.project) == ("c-1", ZONE, PROJECT)
    assert (node.accelerator, node.runtime, node.capacity) == ("v3-8", "tpu-vm-tf-2.9.3", Capacity.SPOT)
    assert node.managed and node.labels["tpuops-run"] == "c-1" and node.labels["team"] == "ml"
    assert node.state in (NodeState.CREATING, NodeState.READY) and node.uid
    assert [n.name for n in provider.list_nodes(ZONE)] == ["c-1"]
    assert provider.list_nodes(OTHER_ZONE) == []


@pytest.mark.parametrize("capacity", list(Capacity))
def test_every_capacity_comes_back_as_asked(provider: NodeProvider, capacity: Capacity) -> None:
    _make(provider, "cap-1", capacity=capacity)
    node = provider.find_node(ZONE, "cap-1")
    assert node is not None and node.capacity is capacity


def test_a_taken_name_is_refused_and_nothing_more_is_made(provider: NodeProvider) -> None:
    _make(provider, "taken")
    with pytest.raises(AlreadyExists):
        provider.create_node(ZONE, _request("taken", Capacity.ON_DEMAND))
    assert [(n.name, n.capacity) for n in provider.list_nodes(ZONE)] == [("taken", Capacity.SPOT)]


def test_a_name_is_taken_per_zone(provider: NodeProvider) -> None:
    _make(provider, "twin", ZONE)
    _make(provider, "twin", OTHER_ZONE)
    assert [n.zone for n in provider.list_nodes(ZONE)] == [ZONE]
    assert [n.zone for n in provider.list_nodes(OTHER_ZONE)] == [OTHER_ZONE]


def test_delete_is_idempotent(provider: NodeProvider) -> None:
    _make(provider, "d-1")
    operation = provider.delete_node(ZONE, "d-1")
    assert operation is not None
    wait_for(provider, operation, timeout_s=WAIT_S)
    assert provider.find_node(ZONE, "d-1") is None
    assert provider.list_nodes(ZONE) == []
    assert provider.delete_node(ZONE, "d-1") is None


def test_a_missing_node_is_none_not_an_error(provider: NodeProvider) -> None:
    assert provider.find_node(ZONE, "never-made") is None
    assert provider.delete_node(ZONE, "never-made") is None


def test_an_operation_reports_its_node_its_outcome_and_when_it_started(provider: NodeProvider) -> None:
    asked = datetime.now(UTC)
    created = provider.create_node(ZONE, _request("op-1"))
    assert created.zone == ZONE and created.target.endswith("/op-1")  # the node, in the provider's own naming
    done = wait_for(provider, created, timeout_s=WAIT_S)
    again = provider.operation(ZONE, created.name)
    for operation in (done, again):
        assert operation.done and operation.error is None and operation.result is CreateResult.OK
        assert operation.name == created.name and operation.target.endswith("/op-1")
        assert operation.started is not None and operation.ended is not None
        assert operation.started <= operation.ended
    deleted = provider.delete_node(ZONE, "op-1")
    assert deleted is not None and deleted.started is not None
    assert deleted.started >= asked.replace(microsecond=0)  # the provider's clock: to the second


def test_a_provider_that_lists_a_node_s_operations_shows_its_create_and_delete_with_their_times(
        provider: NodeProvider) -> None:
    """``ListsOperations``: the evidence that dates a node's READY and its end when someone else asked for them
    (issue 38: never the run's end). Only the node's own operations, each saying what it did."""
    from tpuops.providers.base import ListsOperations

    if not isinstance(provider, ListsOperations):
        pytest.skip(f"{type(provider).__name__} does not list operations (the observer dates within the gap)")
    created = wait_for(provider, provider.create_node(ZONE, _request("ops-1")), timeout_s=WAIT_S)
    _make(provider, "ops-2")
    deleted = provider.delete_node(ZONE, "ops-1")
    assert deleted is not None
    wait_for(provider, deleted, timeout_s=WAIT_S)
    listed = {op.name: op for op in provider.node_operations(ZONE, "ops-1")}
    assert set(listed) == {created.name, deleted.name}
    assert (listed[created.name].verb, listed[deleted.name].verb) == ("create", "delete")
    assert listed[created.name].ended == created.ended and listed[deleted.name].started == deleted.started


def test_an_unknown_operation_is_not_found(provider: NodeProvider) -> None:
    with pytest.raises(NotFound):
        provider.operation(ZONE, f"projects/{PROJECT}/locations/{ZONE}/operations/operation-never")


def test_calls_from_many_threads_at_once(provider: NodeProvider) -> None:
    names = [f"par-{i:02d}" for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        operations = list(pool.map(lambda name: provider.create_node(ZONE, _request(name)), names))
        list(pool.map(lambda operation: wait_for(provider, operation, timeout_s=WAIT_S), operations))
    assert sorted(n.name for n in provider.list_nodes(ZONE)) == names
    assert len({n.uid for n in provider.list_nodes(ZONE)}) == len(names)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["cloud-tpu", "memory", "simulated", "jobset"])
def test_every_provider_class_says_what_a_node_of_an_accelerator_is(name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Its offers, asked with no connection: the shape, a runtime it accepts back, zones, and a price of its chips."""
    monkeypatch.setitem(PROVIDERS, "jobset", JOBSET)
    offers = offers_of(name)
    shape = offers.shape("v4-16")
    assert (shape.type, shape.generation, shape.chips, shape.hosts, shape.multi_host) == ("v4-16", "v4", 8, 2, True)
    runtime = offers.runtime_version(shape)
    assert offers.runtime_version(shape, runtime) == runtime
    assert offers.zones_offering("v4-16")
    prices = catalog_of(offers)
    chip_hour = prices.chip_hour("v4", "us-central2")
    assert prices.price_per_hour("v4-16", Capacity.ON_DEMAND, "us-central2-b") == pytest.approx(8 * chip_hour.on_demand)
    assert prices.price_per_hour("v4-16", Capacity.SPOT, "us-central2-b") == pytest.approx(8 * chip_hour.spot)
    with pytest.raises(UsageError):
        offers.shape("v9-8")


@pytest.mark.unit
def test_an_unknown_provider_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(UsageError) as raised:
        open_provider("gke", Connection(PROJECT))
    assert str(raised.value) == "unknown node provider 'gke': expected one of cloud-tpu, memory, simulated"
