"""Conformance: every RPC of the official Python client, with the inputs Google's samples use.

The client is used as a third-party program would use it: ``tpu_v2.TpuClient`` over REST with
anonymous credentials against an emulator started with ``--no-auth``, and the v2alpha1 API
(whose Python client has no REST transport) over REST by path, each answer parsed by the
``tpu_v2alpha1`` message types, which reject unknown fields. The inputs are those of Google's
public Cloud TPU samples: v5litepod-1 in us-south1-a with tpu-vm-tf-2.17.0-pjrt, and a v2 node
named by an AcceleratorConfig (V2, 2x2) in us-central1-b. Steps run in order against one
emulator; ``bench/bench_conformance.py`` counts the passing ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from helpers import poll

pytestmark = [pytest.mark.emulator]

PROJECT = "proj-samples"
V5E = f"projects/{PROJECT}/locations/us-south1-a"
V2 = f"projects/{PROJECT}/locations/us-central1-b"


class World:
    """One no-auth emulator, the official v2 client, a REST session for v2alpha1, and shared results."""

    def __init__(self, endpoint: str) -> None:
        import requests
        from google.api_core.future import polling
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import tpu_v2

        self.endpoint = endpoint
        self.client = tpu_v2.TpuClient(
            credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": endpoint}
        )
        self.http = requests.Session()
        self.polling = polling.DEFAULT_POLLING.with_delay(initial=0.05, maximum=0.2, multiplier=1.5)
        self.seen: dict[str, Any] = {}

    def finish(self, operation: Any) -> Any:
        return operation.result(timeout=30, polling=self.polling)

    def alpha(self, method: str, path: str, message: Any, body: Any = None) -> Any:
        """A v2alpha1 call by path; the answer parsed strictly into ``message`` (a proto-plus type)."""
        response = self.http.request(method, f"{self.endpoint}/v2alpha1/{path}", json=body, timeout=10)
        assert response.status_code == 200, response.text
        return message.from_json(response.text, ignore_unknown_fields=False)


def _wait_alpha_op(world: World, name: str) -> Any:
    """Poll a v2alpha1 operation by path until done; parse it strictly (every ``@type`` must resolve)."""
    from google.cloud.tpu_v2alpha1.types import cloud_tpu  # noqa: F401  (registers the v2alpha1 types)
    from google.longrunning import operations_pb2
    from google.protobuf import json_format

    def done() -> Any:
        raw = world.http.get(f"{world.endpoint}/v2alpha1/{name}", timeout=10).json()
        return raw if raw.get("done") else None

    operation = operations_pb2.Operation()
    json_format.Parse(json.dumps(poll(done, f"operation {name}", timeout_s=30)), operation, ignore_unknown_fields=False)
    return operation


def _steps() -> list[tuple[str, Callable[[World], None]]]:
    from google.cloud import tpu_v2, tpu_v2alpha1

    def list_locations(w: World) -> None:
        ids = {loc.location_id for loc in w.client.list_locations(request={"name": f"projects/{PROJECT}"}).locations}
        assert {"us-south1-a", "us-central1-b", "europe-west4-b"} <= ids

    def get_location(w: World) -> None:
        assert w.client.get_location(request={"name": V5E}).location_id == "us-south1-a"

    def list_accelerator_types(w: World) -> None:
        types = {t.type_ for t in w.client.list_accelerator_types(parent=V5E)}
        assert "v5litepod-1" in types and "v2-8" not in types

    def get_accelerator_type(w: World) -> None:
        found = w.client.get_accelerator_type(name=f"{V2}/acceleratorTypes/v2-8")
        assert found.accelerator_configs[0].topology == "2x2"

    def list_runtime_versions(w: World) -> None:
        versions = {v.version for v in w.client.list_runtime_versions(parent=V5E)}
        assert {"tpu-vm-tf-2.17.0-pjrt", "tpu-vm-tf-2.9.3", "tpu-ubuntu2204-base"} <= versions

    def get_runtime_version(w: World) -> None:
        name = f"{V5E}/runtimeVersions/tpu-vm-tf-2.17.0-pjrt"
        assert w.client.get_runtime_version(name=name).version == "tpu-vm-tf-2.17.0-pjrt"

    def generate_service_identity(w: World) -> None:
        identity = w.client.generate_service_identity(request={"parent": V2}).identity
        assert identity.email.endswith("@cloud-tpu.iam.gserviceaccount.com")

    def create_node(w: World) -> None:
        node = tpu_v2.Node(accelerator_type="v5litepod-1", runtime_version="tpu-vm-tf-2.17.0-pjrt")
        created = w.finish(w.client.create_node(parent=V5E, node_id="sample-v5e", node=node))
        assert created.state == tpu_v2.Node.State.READY

    def create_node_topology(w: World) -> None:
        node = tpu_v2.Node(
            accelerator_config=tpu_v2.AcceleratorConfig(type_=tpu_v2.AcceleratorConfig.Type.V2, topology="2x2"),
            runtime_version="tpu-vm-tf-2.17.0-pjrt",
        )
        created = w.finish(w.client.create_node(request=tpu_v2.CreateNodeRequest(parent=V2, node_id="sample-v2",
                                                                                  node=node)))
        assert created.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V2
        assert created.accelerator_type == "v2-8"

    def get_node(w: World) -> None:
        assert w.client.get_node(name=f"{V5E}/nodes/sample-v5e").state == tpu_v2.Node.State.READY

    def list_nodes(w: World) -> None:
        assert [n.name for n in w.client.list_nodes(parent=V2)] == [f"{V2}/nodes/sample-v2"]

    def update_node(w: World) -> None:
        node = tpu_v2.Node(name=f"{V2}/nodes/sample-v2", labels={"team": "samples"}, description="updated")
        updated = w.finish(w.client.update_node(node=node, update_mask={"paths": ["labels", "description"]}))
        assert updated.labels == {"team": "samples"} and updated.description == "updated"

    def get_guest_attributes(w: World) -> None:
        answer = w.client.get_guest_attributes(request={"name": f"{V2}/nodes/sample-v2", "query_path": "hostkeys/"})
        keys = {item.key for item in answer.guest_attributes[0].query_value.items}
        assert {"ssh-ed25519", "ssh-rsa"} <= keys

    def stop_node(w: World) -> None:
        assert w.finish(w.client.stop_node(request={"name": f"{V2}/nodes/sample-v2"})).state.name == "STOPPED"

    def start_node(w: World) -> None:
        assert w.finish(w.client.start_node(request={"name": f"{V2}/nodes/sample-v2"})).state.name == "READY"

    def delete_node(w: World) -> None:
        w.finish(w.client.delete_node(name=f"{V5E}/nodes/sample-v5e"))
        w.finish(w.client.delete_node(name=f"{V2}/nodes/sample-v2"))
        assert list(w.client.list_nodes(parent=V2)) == []

    def create_queued_resource(w: World) -> None:
        node = tpu_v2.Node(accelerator_type="v2-8", runtime_version="tpu-vm-tf-2.17.0-pjrt")
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=V2, node_id="qr-node", node=node)
        resource = tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
            queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration="90s"),
        )
        created = w.finish(w.client.create_queued_resource(parent=V2, queued_resource_id="sample-qr",
                                                           queued_resource=resource))
        assert created.queueing_policy.valid_until_time.timestamp() > 0

    def get_queued_resource(w: World) -> None:
        name = f"{V2}/queuedResources/sample-qr"
        poll(lambda: w.client.get_queued_resource(name=name).state.state.name == "ACTIVE", "ACTIVE", 30)

    def list_queued_resources(w: World) -> None:
        assert [q.name.rsplit("/", 1)[-1] for q in w.client.list_queued_resources(parent=V2)] == ["sample-qr"]

    def reset_queued_resource(w: World) -> None:
        # The node's delete moves the request to SUSPENDED in the same step: reset and plain delete work at once.
        w.finish(w.client.delete_node(name=f"{V2}/nodes/qr-node"))
        name = f"{V2}/queuedResources/sample-qr"
        assert w.client.get_queued_resource(name=name).state.state.name == "SUSPENDED"
        w.finish(w.client.reset_queued_resource(name=name))

    def delete_queued_resource(w: World) -> None:
        name = f"{V2}/queuedResources/sample-qr"
        poll(lambda: w.client.get_queued_resource(name=name).state.state.name == "ACTIVE", "ACTIVE again", 30)
        w.finish(w.client.delete_node(name=f"{V2}/nodes/qr-node"))
        w.finish(w.client.delete_queued_resource(name=name))
        assert list(w.client.list_queued_resources(parent=V2)) == []

    def operations(w: World) -> None:
        listed = w.client.list_operations(request={"name": V2}).operations
        assert listed
        name = listed[0].name
        assert w.client.get_operation(request={"name": name}).done
        w.client.cancel_operation(request={"name": name})
        w.client.delete_operation(request={"name": name})

    def alpha_nodes(w: World) -> None:
        node = tpu_v2alpha1.Node(accelerator_type="v5litepod-1", runtime_version="v2-alpha-tpuv5-lite")
        raw = w.http.post(f"{w.endpoint}/v2alpha1/{V5E}/nodes?nodeId=alpha-node",
                          data=tpu_v2alpha1.Node.to_json(node), timeout=10).json()
        done = _wait_alpha_op(w, raw["name"])
        assert done.response.type_url == "type.googleapis.com/google.cloud.tpu.v2alpha1.Node"
        got = w.alpha("GET", f"{V5E}/nodes/alpha-node", tpu_v2alpha1.Node)
        assert got.state == tpu_v2alpha1.Node.State.READY
        listed = w.alpha("GET", f"{V5E}/nodes", tpu_v2alpha1.ListNodesResponse)
        assert [n.name for n in listed.nodes] == [f"{V5E}/nodes/alpha-node"]
        raw = w.http.post(f"{w.endpoint}/v2alpha1/{V5E}/nodes/alpha-node:simulateMaintenanceEvent", json={},
                          timeout=10).json()
        assert _wait_alpha_op(w, raw["name"]).response.type_url.endswith("v2alpha1.Node")

    def alpha_queued_resources(w: World) -> None:
        body = {"tpu": {"nodeSpec": [{"parent": V5E, "nodeId": "alpha-qn", "node": {
            "acceleratorType": "v5litepod-4", "runtimeVersion": "v2-tpuv5-litepod"}}]}, "bestEffort": {},
            "queueingPolicy": {"validUntilDuration": "90s"}}
        raw = w.http.post(f"{w.endpoint}/v2alpha1/{V5E}/queuedResources?queuedResourceId=alpha-qr", json=body,
                          timeout=10).json()
        _wait_alpha_op(w, raw["name"])
        got = w.alpha("GET", f"{V5E}/queuedResources/alpha-qr", tpu_v2alpha1.QueuedResource)
        assert got.queueing_policy.valid_until_time.timestamp() > 0
        w.alpha("GET", f"{V5E}/reservations", tpu_v2alpha1.ListReservationsResponse)
        raw = w.http.delete(f"{w.endpoint}/v2alpha1/{V5E}/queuedResources/alpha-qr?force=true", timeout=10).json()
        _wait_alpha_op(w, raw["name"])

    return [(fn.__name__, fn) for fn in (
        list_locations, get_location, list_accelerator_types, get_accelerator_type, list_runtime_versions,
        get_runtime_version, generate_service_identity, create_node, create_node_topology, get_node, list_nodes,
        update_node, get_guest_attributes, stop_node, start_node, delete_node, create_queued_resource,
        get_queued_resource, list_queued_resources, reset_queued_resource, delete_queued_resource, operations,
        alpha_nodes, alpha_queued_resources,
    )]


STEPS = _steps()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    from tpuops.emulator import control

    other = os.environ.get("TPUOPS_CONFORMANCE_ENDPOINT")  # bench/bench_conformance.py: the baseline
    if other:
        yield World(other)
        return
    state_dir = tmp_path_factory.mktemp("samples") / "emulator"
    info = control.start_background(state_dir, boot_delay_s=0.1, grace_s=1.0, auth=False)
    try:
        yield World(info.endpoint)
    finally:
        control.stop(state_dir)


@pytest.mark.parametrize("step", [fn for _, fn in STEPS], ids=[name for name, _ in STEPS])
def test_official_client_rpc(world: World, step: Callable[[World], None]) -> None:
    step(world)
