"""The Cloud TPU adapter against the emulator: typed results, the taxonomy, pagination, LROs."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tpuops.core import acting
from tpuops.core.errors import AlreadyExists, CapacityError, InvalidRequest, LeaseLost, NotFound, TransientError
from tpuops.core.kinds import Capacity
from tpuops.providers.base import wait_for
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.providers.nodes import NodeRequest, NodeState

pytestmark = pytest.mark.emulator

ZONE = "us-central1-a"


def _request(name: str, capacity: Capacity = Capacity.SPOT, accelerator: str = "v3-8") -> NodeRequest:
    return NodeRequest(name=name, accelerator=accelerator, runtime="tpu-vm-tf-2.9.3", capacity=capacity,
                       labels={"managed-by": "tpuops", "team": "ml"})


@pytest.fixture
def api(emulator: Any) -> Iterator[TpuApi]:
    yield TpuApi("proj-test", endpoint=emulator.endpoint, token=emulator.token, poll_interval_s=0.05, deadline_s=10)


def test_create_get_list_delete_round_trip(api: TpuApi) -> None:
    result = wait_for(api, api.create_node(ZONE, _request("n-1", Capacity.PREEMPTIBLE)), timeout_s=30)
    assert result.target.endswith("/nodes/n-1")
    node = api.get_node(ZONE, "n-1")
    assert (node.state, node.capacity, node.accelerator, node.health) == (NodeState.READY, Capacity.PREEMPTIBLE,
                                                                          "v3-8", "HEALTHY")
    assert node.managed and node.labels["team"] == "ml" and node.uid
    assert [n.name for n in api.list_nodes(ZONE)] == ["n-1"]
    operation = api.delete_node(ZONE, "n-1")
    assert operation is not None
    wait_for(api, operation, timeout_s=30)
    assert api.find_node(ZONE, "n-1") is None
    assert api.delete_node(ZONE, "n-1") is None


def test_stop_and_start(api: TpuApi) -> None:
    wait_for(api, api.create_node(ZONE, _request("n-2", Capacity.ON_DEMAND)), timeout_s=30)
    wait_for(api, api.stop_node(ZONE, "n-2"), timeout_s=30)
    assert api.get_node(ZONE, "n-2").state is NodeState.STOPPED
    wait_for(api, api.start_node(ZONE, "n-2"), timeout_s=30)
    assert api.get_node(ZONE, "n-2").state is NodeState.READY


def test_errors_map_onto_the_taxonomy(api: TpuApi, emulator_admin: Any) -> None:
    with pytest.raises(NotFound):
        api.get_node(ZONE, "missing")
    wait_for(api, api.create_node(ZONE, _request("n-3")), timeout_s=30)
    with pytest.raises(AlreadyExists):
        api.create_node(ZONE, _request("n-3"))
    with pytest.raises(InvalidRequest, match="v2-8"):
        api.create_node("us-central2-b", _request("n-4", accelerator="v2-8"))
    emulator_admin.set_faults(stockout_zones=[ZONE])
    with pytest.raises(CapacityError) as stockout:
        wait_for(api, api.create_node(ZONE, _request("n-5")), timeout_s=30)
    assert stockout.value.zone == ZONE and "no more capacity" in str(stockout.value)
    assert api.find_node(ZONE, "n-5") is None
    emulator_admin.clear_faults()
    emulator_admin.set_faults(error_rate=1.0, error_code=503)
    short = TpuApi("proj-test", endpoint=api.endpoint, token=api.token, poll_interval_s=0.05, deadline_s=1)
    with pytest.raises(TransientError):
        short.get_node(ZONE, "n-3")
    emulator_admin.clear_faults()


def test_rate_limit_is_retried(api: TpuApi, emulator_admin: Any) -> None:
    wait_for(api, api.create_node(ZONE, _request("n-6")), timeout_s=30)
    emulator_admin.set_faults(error_burst=3, error_code=429)
    assert api.get_node(ZONE, "n-6").state is NodeState.READY
    assert api.calls.counts["GetNode"] == 4


def test_250_nodes_are_listed_across_pages(api: TpuApi) -> None:
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda i: api.create_node(ZONE, _request(f"p-{i:03d}")), range(250)))
    small_pages = TpuApi("proj-test", endpoint=api.endpoint, token=api.token, page_size=100)
    names = [n.name for n in small_pages.list_nodes(ZONE)]
    assert sorted(names) == [f"p-{i:03d}" for i in range(250)]
    assert small_pages.calls.counts["ListNodes"] == 3
    assert len(api.list_nodes(ZONE)) == 250
    assert api.calls.counts["ListNodes"] == 1


def test_catalog_lists(api: TpuApi) -> None:
    assert "v3-8" in api.list_accelerator_types(ZONE)
    versions = api.list_runtime_versions(ZONE)
    assert {"tpu-vm-tf-2.9.3", "tpu-vm-tf-2.9.3-pod", "tpu-vm-tf-2.9.3-pod-v4"} <= set(versions)


def test_queued_resources(api: TpuApi) -> None:
    body = api.queued_body(api.project, ZONE, _request("q-node"), valid_until_s=3600)
    assert body["spot"] == {} and body["queueingPolicy"] == {"validUntilDuration": "3600s"}
    wait_for(api, api.create_queued_resource(ZONE, "qr-1", _request("q-node"), valid_until_s=3600), timeout_s=30)
    queued = api.get_queued_resource(ZONE, "qr-1")
    assert queued.node_ids == ["q-node"] and queued.spot
    assert [q.name for q in api.list_queued_resources(ZONE)] == ["qr-1"]
    operation = api.delete_queued_resource(ZONE, "qr-1", force=True)
    assert operation is not None
    wait_for(api, operation, timeout_s=30)
    assert api.list_queued_resources(ZONE) == []
    assert api.delete_queued_resource(ZONE, "qr-1") is None


def test_errors_say_what_went_wrong_not_which_url_was_asked(api: TpuApi) -> None:
    with pytest.raises(NotFound) as caught:
        api.get_node("us-central1-a", "missing-node")
    assert "$alt=json" not in str(caught.value) and "http" not in str(caught.value)
    assert "missing-node" in str(caught.value)


def test_a_call_that_changes_the_cloud_goes_out_only_under_the_lease_it_was_decided_under(api: TpuApi) -> None:
    """tpuops.core.acting: the lease is renewed as each such call goes; one another controller took meanwhile (this
    process stalled past it) sends nothing, retried or not; reads still go out."""
    wait_for(api, api.create_node(ZONE, _request("n-9")), timeout_s=30)
    renewals: list[str] = []

    def lost() -> float:
        renewals.append("lost")
        raise LeaseLost("the lease on run-9 is not ours any more")

    with acting.under(lost, lambda: 100.0, "run-9"):
        with pytest.raises(LeaseLost):
            api.delete_node(ZONE, "n-9")
        with pytest.raises(LeaseLost):
            api.create_node(ZONE, _request("n-10"))
        assert api.get_node(ZONE, "n-9").state is NodeState.READY
    assert renewals == ["lost", "lost"]  # asked once each, never retried at once
    assert api.find_node(ZONE, "n-10") is None
    with acting.under(lambda: 150.0, lambda: 100.0, "run-9"):
        assert api.delete_node(ZONE, "n-9") is not None


def test_a_server_that_accepts_and_never_answers_is_one_transient_error_not_a_hang() -> None:
    """Every call has its own deadline (the client's default is none): silence is retried, then refused."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_hold() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except TimeoutError:
                continue

    holder = threading.Thread(target=accept_and_hold, daemon=True)
    holder.start()
    api = TpuApi("proj-silent", endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}", token="t", deadline_s=1.0)
    try:
        # the result() bound only catches a hang; it is no speed claim
        with ThreadPoolExecutor(1) as pool, pytest.raises(TransientError, match="connection to the Cloud TPU API"):
            pool.submit(api.list_nodes, "us-central1-a").result(timeout=120)
        assert api.call_timeout_s == 1.0
        assert held, "the call never reached the silent server"
    finally:
        stop.set()
        holder.join()
        for connection in held:
            connection.close()
        listener.close()
