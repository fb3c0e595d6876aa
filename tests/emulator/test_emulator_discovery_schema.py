"""Schema fidelity: every v2 method, called through Google's discovery-based client, answers what Google's schema says.

The client is google-api-python-client built from the ``tpu.v2`` discovery document the package
ships (Google's own description of the API), with its root URL pointed at the emulator. Every
answer (and the Node or QueuedResource inside a done operation) is checked against that
document's schemas: no field the schema lacks, the JSON type of each field (int64 as a string),
and enum values among the schema's. A field the emulator invents, or an enum value the real API
never sends, fails here even if no client of ours reads it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from helpers import poll

pytestmark = [pytest.mark.emulator]

PROJECT = "proj-schema"
ZONE = "europe-west4-a"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
# Operation.response / metadata carry these messages; their schema in the same document.
TYPED = {
    "type.googleapis.com/google.cloud.tpu.v2.Node": "Node",
    "type.googleapis.com/google.cloud.tpu.v2.QueuedResource": "QueuedResource",
    "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata": "OperationMetadata",
    "type.googleapis.com/google.protobuf.Empty": "Empty",
}


def discovery_document(version: str = "v2") -> dict[str, Any]:
    import googleapiclient

    documents = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents")
    path = os.path.join(documents, f"tpu.{version}.json")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def violations(value: Any, schema: dict[str, Any], schemas: dict[str, Any], where: str) -> list[str]:
    """What in ``value`` the discovery ``schema`` does not allow (empty when it conforms)."""
    if "$ref" in schema:
        return violations(value, schemas[schema["$ref"]], schemas, where)
    kind = schema.get("type")
    if kind == "any":
        return []
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, schema says object"]
        problems = []
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        typed = value.get("@type")
        if typed is not None and extra is not None and extra.get("type") == "any":
            if typed not in TYPED:
                return [f"{where}: @type {typed} is not a message of this API"]
            inner = {key: item for key, item in value.items() if key != "@type"}
            return violations(inner, schemas[TYPED[typed]], schemas, f"{where}<{TYPED[typed]}>")
        for key, item in value.items():
            if key in properties:
                problems += violations(item, properties[key], schemas, f"{where}.{key}")
            elif extra is not None:
                problems += violations(item, extra, schemas, f"{where}[{key}]")
            else:
                problems.append(f"{where}.{key}: not a field of {schema.get('id', 'this object')}")
        return problems
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, schema says array"]
        return [p for i, item in enumerate(value) for p in violations(item, schema["items"], schemas, f"{where}[{i}]")]
    if kind == "string":
        if not isinstance(value, str):
            return [f"{where}: {value!r} is not a string ({schema.get('format', 'string')})"]
        if "enum" in schema and value not in schema["enum"]:
            return [f"{where}: {value!r} is not one of {schema['enum']}"]
        return []
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{where}: {value!r} is not an integer"]
    if kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{where}: {value!r} is not a number"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{where}: {value!r} is not a boolean"]
    return [f"{where}: schema type {kind!r} unknown to this check"]


class Checked:
    """The discovery client against one emulator; every answer is checked against the method's response schema."""

    def __init__(self, endpoint: str, token: str) -> None:
        from google.oauth2.credentials import Credentials
        from googleapiclient.discovery import build_from_document

        document = discovery_document()
        document["rootUrl"] = endpoint.rstrip("/") + "/"
        document["baseUrl"] = document["rootUrl"]
        self.schemas = document["schemas"]
        self.service = build_from_document(document, credentials=Credentials(token))
        self.locations = self.service.projects().locations()
        self.called: set[str] = set()
        self.problems: list[str] = []

    def call(self, method: str, request: Any) -> Any:
        """Execute ``request`` (the discovery method ``method``) and check its answer against its schema."""
        answer = request.execute(num_retries=0)
        response_ref = self.response_schema(method)
        self.problems += violations(answer, {"$ref": response_ref}, self.schemas, method)
        self.called.add(method)
        return answer

    def response_schema(self, method: str) -> str:
        resource: dict[str, Any] = discovery_document()
        *path, name = method.split(".")
        for part in path:
            resource = resource["resources"][part]
        return resource["methods"][name]["response"]["$ref"]

    def finish(self, operation: dict[str, Any]) -> dict[str, Any]:
        """Poll ``operations.get`` (each answer checked) until the operation is done."""
        operations = self.locations.operations()
        return poll(
            lambda: (op := self.call("projects.locations.operations.get", operations.get(name=operation["name"])))
            .get("done") and op,
            f"operation {operation['name']}",
            timeout_s=60,
        )


def all_methods() -> set[str]:
    found = set()

    def walk(resource: dict[str, Any], prefix: str) -> None:
        for name, child in resource.get("resources", {}).items():
            for method in child.get("methods", {}):
                found.add(f"{prefix}{name}.{method}")
            walk(child, f"{prefix}{name}.")

    walk(discovery_document(), "")
    return found


def test_violations_finds_invented_fields_wrong_types_and_enums() -> None:
    """The checker itself: each kind of mismatch is reported (a check that passes everything proves nothing)."""
    schemas = discovery_document()["schemas"]
    node = {"$ref": "Node"}
    assert violations({"name": "n", "state": "READY", "id": "12"}, node, schemas, "Node") == []
    assert violations({"uniqueThing": 1}, node, schemas, "Node") == ["Node.uniqueThing: not a field of Node"]
    assert violations({"id": 12}, node, schemas, "Node") == ["Node.id: 12 is not a string (int64)"]
    assert violations({"state": "RUNNING"}, node, schemas, "Node")[0].startswith("Node.state: 'RUNNING' is not one")
    assert violations({"networkEndpoints": [{"port": "8470"}]}, node, schemas, "Node") == [
        "Node.networkEndpoints[0].port: '8470' is not an integer"
    ]
    assert violations({"identity": {"email": "e", "uniqueId": "1"}}, {"$ref": "GenerateServiceIdentityResponse"},
                      schemas, "R") == ["R.identity.uniqueId: not a field of ServiceIdentity"]
    op = {"name": "o", "done": True, "response": {"@type": TYPED_NODE, "bogus": 1}}
    assert violations(op, {"$ref": "Operation"}, schemas, "Op") == ["Op.response<Node>.bogus: not a field of Node"]


TYPED_NODE = "type.googleapis.com/google.cloud.tpu.v2.Node"


@pytest.fixture
def checked(emulator: Any) -> Checked:
    return Checked(emulator.endpoint, emulator.token)


def test_every_v2_method_answers_within_googles_schema(checked: Checked, emulator_admin: Any) -> None:
    c = checked
    loc = c.locations
    nodes = loc.nodes()
    c.call("projects.locations.list", loc.list(name=f"projects/{PROJECT}"))
    c.call("projects.locations.get", loc.get(name=PARENT))
    c.call("projects.locations.generateServiceIdentity", loc.generateServiceIdentity(parent=PARENT, body={}))
    c.call("projects.locations.acceleratorTypes.list", loc.acceleratorTypes().list(parent=PARENT))
    c.call("projects.locations.acceleratorTypes.get",
           loc.acceleratorTypes().get(name=f"{PARENT}/acceleratorTypes/v3-8"))
    c.call("projects.locations.runtimeVersions.list", loc.runtimeVersions().list(parent=PARENT))
    c.call("projects.locations.runtimeVersions.get",
           loc.runtimeVersions().get(name=f"{PARENT}/runtimeVersions/tpu-vm-tf-2.9.3"))

    def create(node_id: str, accelerator: str, runtime: str, spot: bool) -> dict[str, Any]:
        body = {
            "acceleratorType": accelerator,
            "runtimeVersion": runtime,
            "schedulingConfig": {"spot": spot},
            "labels": {"team": "schema"},
            "metadata": {"startup-script": "echo booted"},
        }
        return c.finish(c.call("projects.locations.nodes.create", nodes.create(parent=PARENT, nodeId=node_id,
                                                                               body=body)))

    created = create("one", "v3-8", "tpu-vm-tf-2.9.3", spot=False)
    assert created["response"]["state"] == "READY"
    create("slice", "v3-32", "tpu-vm-tf-2.9.3-pod", spot=True)
    one = c.call("projects.locations.nodes.get", nodes.get(name=f"{PARENT}/nodes/one"))
    assert one["health"] == "HEALTHY"
    c.call("projects.locations.nodes.list", nodes.list(parent=PARENT))
    c.finish(c.call("projects.locations.nodes.patch",
                    nodes.patch(name=f"{PARENT}/nodes/one", updateMask="labels", body={"labels": {"a": "b"}})))
    c.call("projects.locations.nodes.getGuestAttributes",
           nodes.getGuestAttributes(name=f"{PARENT}/nodes/slice", body={"queryPath": ""}))
    c.finish(c.call("projects.locations.nodes.stop", nodes.stop(name=f"{PARENT}/nodes/one", body={})))
    c.finish(c.call("projects.locations.nodes.start", nodes.start(name=f"{PARENT}/nodes/one", body={})))
    emulator_admin.preempt(PROJECT, ZONE, "slice", grace_s=0.5)
    poll(lambda: c.call("projects.locations.nodes.get", nodes.get(name=f"{PARENT}/nodes/slice"))["state"]
         == "PREEMPTED", "the slice PREEMPTED")
    c.call("projects.locations.nodes.list", nodes.list(parent=PARENT))

    queued = loc.queuedResources()
    emulator_admin.set_faults(fail_queued_zones=[ZONE])
    qr_body = {
        "tpu": {"nodeSpec": [{"parent": PARENT, "nodeId": "queued-node",
                              "node": {"acceleratorType": "v3-8", "runtimeVersion": "tpu-vm-tf-2.9.3"}}]},
        "spot": {},
    }
    c.finish(c.call("projects.locations.queuedResources.create",
                    queued.create(parent=PARENT, queuedResourceId="qr", body=qr_body)))
    qr_name = f"{PARENT}/queuedResources/qr"
    poll(lambda: c.call("projects.locations.queuedResources.get", queued.get(name=qr_name))["state"]["state"]
         == "FAILED", "the queued resource FAILED")
    c.call("projects.locations.queuedResources.list", queued.list(parent=PARENT))
    emulator_admin.clear_faults()
    c.finish(c.call("projects.locations.queuedResources.reset", queued.reset(name=qr_name, body={})))
    c.finish(c.call("projects.locations.queuedResources.delete", queued.delete(name=qr_name, force=True)))

    operations = loc.operations()
    listed = c.call("projects.locations.operations.list", operations.list(name=PARENT))
    deleting = c.call("projects.locations.nodes.delete", nodes.delete(name=f"{PARENT}/nodes/one"))
    c.call("projects.locations.operations.cancel", operations.cancel(name=deleting["name"]))
    c.finish(deleting)
    c.call("projects.locations.operations.delete", operations.delete(name=listed["operations"][0]["name"]))
    c.finish(c.call("projects.locations.nodes.delete", nodes.delete(name=f"{PARENT}/nodes/slice")))

    assert c.called == all_methods(), f"methods not driven: {sorted(all_methods() - c.called)}"
    assert c.problems == [], "\n".join(c.problems)



def test_the_served_discovery_documents_and_v1_get_of_a_v2_node(checked: Checked, emulator: Any) -> None:
    """What TensorFlow 2.9's TPU client loads and calls: the v1 document from the emulator (public, no token),
    then ``nodes.get`` of a node made through v2, answered within v1's schema."""
    import requests
    from google.oauth2.credentials import Credentials
    from googleapiclient.discovery import build

    for version in ("v1", "v2"):
        served = requests.get(f"{emulator.endpoint}/$discovery/rest", params={"version": version}, timeout=10).json()
        shipped = discovery_document(version)
        assert served["rootUrl"] == emulator.endpoint + "/"
        assert {k: v for k, v in served.items() if not k.endswith("Url")} == {
            k: v for k, v in shipped.items() if not k.endswith("Url")}
    body = {"acceleratorType": "v3-32", "runtimeVersion": "tpu-vm-tf-2.9.3-pod", "schedulingConfig": {"spot": True}}
    checked.finish(checked.locations.nodes().create(parent=PARENT, nodeId="seen-by-v1", body=body).execute())
    v1 = build("tpu", "v1", credentials=Credentials(emulator.token), cache_discovery=False,
               discoveryServiceUrl=f"{emulator.endpoint}/$discovery/rest?version={{apiVersion}}")
    node = v1.projects().locations().nodes().get(name=f"{PARENT}/nodes/seen-by-v1").execute()
    schemas = discovery_document("v1")["schemas"]
    assert violations(node, {"$ref": "Node"}, schemas, "v1.Node") == []
    assert node["state"] == "READY" and node["tensorflowVersion"] == "tpu-vm-tf-2.9.3-pod"
    assert [(e["ipAddress"], e["port"]) for e in node["networkEndpoints"]] == [
        (e["ipAddress"], 8470) for e in checked.service.projects().locations().nodes()
        .get(name=f"{PARENT}/nodes/seen-by-v1").execute()["networkEndpoints"]]
