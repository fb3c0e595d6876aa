"""The emulator speaks the Cloud TPU v2 REST API the way the official client expects.

Every RPC tpuops uses goes through google-cloud-tpu's REST transport, which parses
operation JSON with unknown fields rejected: a call that succeeds here is a call whose
response shape is right. Failures must surface as the google-api-core classes tpuops
catches (REST flavour: 409 Conflict, 429 TooManyRequests, 400 BadRequest).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2

from tpuops.emulator import control
from tpuops.providers.cloud_tpu.catalog import load

pytestmark = pytest.mark.emulator

PROJECT = "proj-test"
ZONE = "us-central1-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"


def _node(**overrides):
    fields = {"accelerator_type": "v2-8", "runtime_version": "tpu-vm-tf-2.9.3"}
    fields.update(overrides)
    return tpu_v2.Node(**fields)


def test_create_get_list_delete_node(tpu_client, finish):
    operation = tpu_client.create_node(
        parent=PARENT,
        node_id="alpha",
        node=_node(
            labels={"managed-by": "tpuops", "run": "r1"},
            metadata={"store-root": "/tmp/store"},
            description="first node",
            scheduling_config=tpu_v2.SchedulingConfig(spot=True),
        ),
    )
    assert operation.metadata.verb == "create"
    assert operation.metadata.target == f"{PARENT}/nodes/alpha"

    created = finish(operation)
    assert created.name == f"{PARENT}/nodes/alpha"
    assert created.state == tpu_v2.Node.State.READY
    assert created.health == tpu_v2.Node.Health.HEALTHY
    assert created.api_version == tpu_v2.Node.ApiVersion.V2
    assert created.scheduling_config.spot is True
    assert created.labels == {"managed-by": "tpuops", "run": "r1"}
    assert created.metadata["store-root"] == "/tmp/store"
    assert created.description == "first node"
    assert created.id > 0
    assert created.create_time.timestamp() > 0
    assert created.network_endpoints[0].ip_address == "127.0.0.1"
    assert created.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V2
    assert created.accelerator_config.topology == "2x2"
    assert operation.metadata.end_time.timestamp() >= operation.metadata.create_time.timestamp()

    fetched = tpu_client.get_node(name=f"{PARENT}/nodes/alpha")
    assert fetched.id == created.id
    assert [node.name for node in tpu_client.list_nodes(parent=PARENT)] == [created.name]
    assert list(tpu_client.list_nodes(parent=f"projects/{PROJECT}/locations/us-central1-c")) == []

    deletion = tpu_client.delete_node(name=created.name)
    assert deletion.metadata.verb == "delete"
    finish(deletion)
    with pytest.raises(exceptions.NotFound):
        tpu_client.get_node(name=created.name)
    assert list(tpu_client.list_nodes(parent=PARENT)) == []


def test_node_errors_map_to_api_core_classes(tpu_client, finish):
    finish(tpu_client.create_node(parent=PARENT, node_id="dup", node=_node()))
    with pytest.raises(exceptions.Conflict) as conflict:
        tpu_client.create_node(parent=PARENT, node_id="dup", node=_node())
    assert "already exists" in conflict.value.message

    with pytest.raises(exceptions.NotFound):
        tpu_client.get_node(name=f"{PARENT}/nodes/missing")
    with pytest.raises(exceptions.NotFound):
        tpu_client.delete_node(name=f"{PARENT}/nodes/missing")

    for bad_id in ("Upper", "1starts-with-digit", "trailing-", "x" * 64, "under_score"):
        with pytest.raises(exceptions.BadRequest):
            tpu_client.create_node(parent=PARENT, node_id=bad_id, node=_node())

    with pytest.raises(exceptions.BadRequest) as no_runtime:
        tpu_client.create_node(parent=PARENT, node_id="no-runtime", node=tpu_v2.Node(accelerator_type="v2-8"))
    assert "runtime_version" in no_runtime.value.message

    with pytest.raises(exceptions.BadRequest) as wrong_zone:
        tpu_client.create_node(parent=PARENT, node_id="v4-here", node=_node(accelerator_type="v4-8"))
    assert "Accelerator type v4-8" in wrong_zone.value.message
    assert f"is not available in zone {ZONE}" in wrong_zone.value.message

    with pytest.raises(exceptions.BadRequest):
        tpu_client.create_node(parent=PARENT, node_id="bogus", node=_node(accelerator_type="v9-8"))
    with pytest.raises(exceptions.BadRequest):
        tpu_client.list_nodes(parent=f"projects/{PROJECT}/locations/mars-north1-a")


def test_update_labels_metadata_description(tpu_client, finish):
    finish(tpu_client.create_node(parent=PARENT, node_id="upd", node=_node(labels={"a": "1"})))
    name = f"{PARENT}/nodes/upd"

    updated = finish(
        tpu_client.update_node(
            node=tpu_v2.Node(name=name, labels={"a": "2", "b": "3"}, metadata={"k": "v"}, description="changed"),
            update_mask={"paths": ["labels", "metadata", "description"]},
        )
    )
    assert updated.labels == {"a": "2", "b": "3"}
    assert updated.metadata == {"k": "v"}
    assert tpu_client.get_node(name=name).description == "changed"

    # Fields outside the mask are left alone.
    finish(tpu_client.update_node(node=tpu_v2.Node(name=name, labels={}), update_mask={"paths": ["description"]}))
    assert tpu_client.get_node(name=name).labels == {"a": "2", "b": "3"}

    with pytest.raises(exceptions.BadRequest):
        tpu_client.update_node(
            node=tpu_v2.Node(name=name, runtime_version="x"), update_mask={"paths": ["runtime_version"]}
        )
    with pytest.raises(exceptions.NotFound):
        tpu_client.update_node(node=tpu_v2.Node(name=f"{PARENT}/nodes/nope"), update_mask={"paths": ["labels"]})


def test_stop_and_start(tpu_client, finish):
    finish(tpu_client.create_node(parent=PARENT, node_id="stopper", node=_node()))
    name = f"{PARENT}/nodes/stopper"

    stopped = finish(tpu_client.stop_node(request={"name": name}))
    assert stopped.state == tpu_v2.Node.State.STOPPED
    assert tpu_client.get_node(name=name).state == tpu_v2.Node.State.STOPPED
    with pytest.raises(exceptions.BadRequest):
        tpu_client.stop_node(request={"name": name})

    started = finish(tpu_client.start_node(request={"name": name}))
    assert started.state == tpu_v2.Node.State.READY
    with pytest.raises(exceptions.BadRequest):
        tpu_client.start_node(request={"name": name})


def test_stop_refuses_multi_host_nodes(tpu_client, finish):
    pods = f"projects/{PROJECT}/locations/us-central1-a"  # v2 slices are offered there, not in us-central1-b
    finish(tpu_client.create_node(parent=pods, node_id="pod", node=_node(accelerator_type="v2-32")))
    node = tpu_client.get_node(name=f"{pods}/nodes/pod")
    assert len(node.network_endpoints) == 4
    with pytest.raises(exceptions.BadRequest) as refused:
        tpu_client.stop_node(request={"name": node.name})
    assert "single-host" in refused.value.message


def test_accelerator_types_and_runtime_versions(tpu_client):
    types = {item.type_: item for item in tpu_client.list_accelerator_types(parent=PARENT)}
    assert {"v2-8", "v3-8", "v6e-8", "v6e-256"} <= set(types)
    assert not any(name.startswith(("v4-", "v5p-")) or name in ("v2-32", "v3-32") for name in types)
    assert types["v6e-16"].accelerator_configs[0].topology == "4x4"
    assert tpu_client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v2-8").type_ == "v2-8"
    with pytest.raises(exceptions.NotFound):
        tpu_client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v4-8")
    v4_zone = f"projects/{PROJECT}/locations/us-central2-b"
    assert "v4-4096" in {item.type_ for item in tpu_client.list_accelerator_types(parent=v4_zone)}

    versions = {item.version for item in tpu_client.list_runtime_versions(parent=PARENT)}
    for patch in ("2.9.1", "2.9.2", "2.9.3"):
        for suffix in ("", "-pod", "-v4", "-pod-v4"):
            assert f"tpu-vm-tf-{patch}{suffix}" in versions
    assert {"tpu-vm-base", "tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite", "v2-alpha-tpuv6e"} <= versions
    got = tpu_client.get_runtime_version(name=f"{PARENT}/runtimeVersions/tpu-vm-tf-2.9.3-pod")
    assert got.version == "tpu-vm-tf-2.9.3-pod"


def test_catalogue_sizes():
    known = load()
    assert known.accelerators["v2-512"].hosts == 64
    assert known.accelerators["v4-4096"].topology == "8x16x16"
    assert known.accelerators["v5litepod-8"].single_host
    assert not known.accelerators["v5litepod-16"].single_host
    assert known.offers("us-east5-a", "v5p-8")
    assert not known.offers("us-central1-c", "v5p-8")


def test_queued_resources(tpu_client, finish, wait_until):
    request = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id="qnode", node=_node())]
        ),
        spot=tpu_v2.QueuedResource.Spot(),
    )
    accepted = finish(
        tpu_client.create_queued_resource(parent=PARENT, queued_resource_id="qr1", queued_resource=request)
    )
    assert accepted.name == f"{PARENT}/queuedResources/qr1"
    assert accepted.tpu.node_spec[0].node_id == "qnode"

    with pytest.raises(exceptions.Conflict):
        tpu_client.create_queued_resource(parent=PARENT, queued_resource_id="qr1", queued_resource=request)

    def active():
        qr = tpu_client.get_queued_resource(name=accepted.name)
        return qr.state.state == tpu_v2.QueuedResourceState.State.ACTIVE

    wait_until(active)
    node = tpu_client.get_node(name=f"{PARENT}/nodes/qnode")
    assert node.state == tpu_v2.Node.State.READY
    assert node.queued_resource == accepted.name
    assert node.scheduling_config.spot is True
    assert [qr.name for qr in tpu_client.list_queued_resources(parent=PARENT)] == [accepted.name]

    with pytest.raises(exceptions.BadRequest):
        tpu_client.delete_queued_resource(name=accepted.name)
    finish(tpu_client.delete_queued_resource(request={"name": accepted.name, "force": True}))
    with pytest.raises(exceptions.NotFound):
        tpu_client.get_queued_resource(name=accepted.name)
    with pytest.raises(exceptions.NotFound):
        tpu_client.get_node(name=f"{PARENT}/nodes/qnode")


def test_queued_resource_waits_out_a_stockout(tpu_client, emulator_admin, finish, wait_until):
    emulator_admin.set_faults(stockout_zones=[ZONE])
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id="waiter", node=_node())
    qr = finish(
        tpu_client.create_queued_resource(
            parent=PARENT,
            queued_resource_id="qr-wait",
            queued_resource=tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec])),
        )
    )
    waiting = tpu_v2.QueuedResourceState.State.WAITING_FOR_RESOURCES
    wait_until(lambda: tpu_client.get_queued_resource(name=qr.name).state.state == waiting)
    assert list(tpu_client.list_nodes(parent=PARENT)) == []
    emulator_admin.clear_faults()
    wait_until(
        lambda: tpu_client.get_queued_resource(name=qr.name).state.state == tpu_v2.QueuedResourceState.State.ACTIVE
    )


def test_operations_mixin(tpu_client, finish):
    operation = tpu_client.create_node(parent=PARENT, node_id="opnode", node=_node())
    finish(operation)
    name = operation.operation.name
    fetched = tpu_client.get_operation(request={"name": name})
    assert fetched.done
    listed = tpu_client.list_operations(request={"name": PARENT})
    assert name in [op.name for op in listed.operations]
    tpu_client.cancel_operation(request={"name": name})
    tpu_client.delete_operation(request={"name": name})
    with pytest.raises(exceptions.NotFound):
        tpu_client.get_operation(request={"name": name})


def test_locations(tpu_client):
    listed = tpu_client.list_locations(request={"name": f"projects/{PROJECT}"})
    assert {location.location_id for location in listed.locations} >= {
        "us-central1-a",
        "us-central2-b",
        "europe-west4-a",
    }
    assert tpu_client.get_location(request={"name": PARENT}).location_id == ZONE


def test_pagination_over_250_nodes(tpu_client, emulator_admin):
    for index in range(250):
        tpu_client.create_node(parent=PARENT, node_id=f"n{index:03d}", node=_node())
    emulator_admin.reset_stats()

    pager = tpu_client.list_nodes(request={"parent": PARENT, "page_size": 100})
    pages = list(pager.pages)
    assert [len(page.nodes) for page in pages] == [100, 100, 50]
    names = [node.name for page in pages for node in page.nodes]
    assert names == sorted(names)
    assert len(set(names)) == 250
    assert emulator_admin.stats() == {"ListNodes": 3}

    # The default page size is 50; the pager follows nextPageToken to the end.
    assert len(list(tpu_client.list_nodes(parent=PARENT))) == 250
    assert emulator_admin.stats()["ListNodes"] == 3 + 5


def test_stockout_fails_the_create_operation_and_leaves_no_node(tpu_client, emulator_admin, finish):
    emulator_admin.set_faults(stockout_zones=["us-central1-c"])
    zone_c = f"projects/{PROJECT}/locations/us-central1-c"
    operation = tpu_client.create_node(parent=zone_c, node_id="starved", node=_node())
    with pytest.raises(exceptions.ResourceExhausted) as stockout:
        finish(operation)
    assert 'There is no more capacity in the zone "us-central1-c"' in stockout.value.message
    assert "[EID: 0x" in stockout.value.message
    assert list(tpu_client.list_nodes(parent=zone_c)) == []
    # Other zones are unaffected.
    assert finish(tpu_client.create_node(parent=PARENT, node_id="fed", node=_node())).state == tpu_v2.Node.State.READY


def test_injected_errors(tpu_client, emulator_admin):
    emulator_admin.set_faults(error_burst=2)
    for _ in range(2):
        with pytest.raises(exceptions.ServiceUnavailable):
            tpu_client.list_nodes(parent=PARENT)
    assert list(tpu_client.list_nodes(parent=PARENT)) == []

    emulator_admin.set_faults(error_burst=1, error_code=429)
    with pytest.raises(exceptions.TooManyRequests):
        tpu_client.get_node(name=f"{PARENT}/nodes/any")

    emulator_admin.set_faults(error_rate=1.0, error_code=503, seed=7)
    with pytest.raises(exceptions.ServiceUnavailable):
        tpu_client.list_accelerator_types(parent=PARENT)
    assert emulator_admin.health()["status"] == "ok"  # admin calls are never failed
    emulator_admin.clear_faults()
    assert list(tpu_client.list_nodes(parent=PARENT)) == []


def test_seeded_error_rate_is_reproducible(tpu_client, emulator_admin):
    def outcomes():
        emulator_admin.set_faults(error_rate=0.5, seed=42)
        results = []
        for _ in range(20):
            try:
                tpu_client.list_nodes(parent=PARENT)
                results.append(True)
            except exceptions.ServiceUnavailable:
                results.append(False)
        return results

    first, second = outcomes(), outcomes()
    assert first == second
    assert True in first and False in first


def test_stats_count_rpcs_and_reset(tpu_client, emulator_admin, finish):
    emulator_admin.reset_stats()
    operation = tpu_client.create_node(parent=PARENT, node_id="counted", node=_node())
    finish(operation)
    tpu_client.get_node(name=f"{PARENT}/nodes/counted")
    counts = emulator_admin.stats()
    assert counts["CreateNode"] == 1
    assert counts["GetNode"] == 1
    assert counts["GetOperation"] >= 1
    emulator_admin.reset_stats()
    assert emulator_admin.stats() == {}


def _raw(endpoint, method, path, body=None):
    request = urllib.request.Request(
        endpoint + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {control.token_for(endpoint)}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_raw_json_enums_by_name_and_errors(emulator):
    body = {
        "acceleratorConfig": {"type": "V3", "topology": "2x2"},
        "runtimeVersion": "tpu-vm-tf-2.9.1",
        "dataDisks": [{"sourceDisk": "projects/p/zones/z/disks/d", "mode": 2}],
    }
    status, operation = _raw(
        emulator.endpoint, "POST", f"/v2/{PARENT}/nodes?nodeId=raw&$alt=json;enum-encoding=int", body
    )
    assert status == 200
    assert operation["metadata"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
    assert operation["done"] is False

    status, node = _raw(emulator.endpoint, "GET", f"/v2/{PARENT}/nodes/raw")
    assert node["acceleratorType"] == "v3-8"
    assert node["dataDisks"][0]["mode"] == "READ_ONLY"
    assert isinstance(node["id"], str)

    status, error = _raw(emulator.endpoint, "POST", f"/v2/{PARENT}/nodes?nodeId=typo", {**body, "runtimeVersoin": "x"})
    assert status == 400
    assert error["error"]["status"] == "INVALID_ARGUMENT"
    status, error = _raw(emulator.endpoint, "GET", f"/v2/{PARENT}/nodes/none")
    assert (status, error["error"]["status"], error["error"]["code"]) == (404, "NOT_FOUND", 404)
