"""The Cloud TPU REST surface (v2, v2alpha1, v1 catalogue): routes, request parsing and response JSON.

Paths and verbs are those of ``google/cloud/tpu/v2/cloud_tpu.proto`` as the google-cloud-tpu
REST transport calls them (``/v2/projects/{p}/locations/{zone}/nodes/{n}:stop`` ...), plus
the location and ``google.longrunning`` mixins. ``/v2alpha1`` serves the same resources (and
its extra RPCs: reservations, maintenance) with v2alpha1 ``@type`` URLs, as ``gcloud alpha``
and the v2alpha1 clients expect; ``/v1`` serves the catalogue routes gcloud still uses
(locations, acceleratorTypes, tensorflowVersions) and a node by name in the v1 schema (TensorFlow
2.9's TPU client asks for it), and answers the other v1 node RPCs with the TPU Node deprecation
error. The catalogue comes from ``tpuops.providers.cloud_tpu.catalog``. A few ``/v1`` project routes stand in for
Service Usage, Resource Manager and IAM (``services``) for ``tpuops doctor``.

``RestApi.handle`` is independent of sockets: it takes a parsed request and returns a status
and a JSON body, so the server module owns HTTP and this module owns the API.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tpuops.emulator.api.services import ProjectServices
from tpuops.emulator.apierror import ApiError, invalid, not_found, precondition
from tpuops.emulator.cloud.catalog import check_zone, project_number
from tpuops.emulator.cloud.queued import QueuedResources
from tpuops.emulator.cloud.state import EmulatorState
from tpuops.emulator.cloud.wire import (
    Request,
    page_size_of,
    paginate,
    parse_node_fields,
    parse_update_mask,
    require_object,
)
from tpuops.emulator.faults import Faults
from tpuops.emulator.stats import RpcStats
from tpuops.providers.cloud_tpu.catalog import AcceleratorType, load

_LOCATION = r"projects/(?P<project>[^/:]+)/locations/(?P<zone>[^/:]+)"
_PROJECT = r"projects/(?P<project>[^/:]+)"
V2 = frozenset({"v2", "v2alpha1"})
V1 = frozenset({"v1"})
ALL = V1 | V2
V1_DEPRECATED = (
    "The Cloud TPU v1 API serves TPU Nodes, which are deprecated: TPU Node creation and management through "
    "v1 is no longer supported. Use TPU VMs through the v2 API (gcloud compute tpus tpu-vm)."
)


Handler = Callable[[Request], dict[str, Any]]


def _page(items: list[dict[str, Any]], field: str, query: dict[str, str]) -> dict[str, Any]:
    page, token = paginate(items, lambda item: item["name"], page_size_of(query), query.get("pageToken", ""))
    out: dict[str, Any] = {field: page}
    if token:
        out["nextPageToken"] = token
    return out


def _versioned(value: Any, version: str) -> Any:
    """The answer in the API version the caller used: v2alpha1 clients resolve v2alpha1 ``@type`` URLs."""
    if version == "v2" or version == "v1":
        return value
    if isinstance(value, dict):
        out = {key: _versioned(item, version) for key, item in value.items()}
        if "@type" in out:
            out["@type"] = out["@type"].replace(".tpu.v2.", f".tpu.{version}.")
        if out.get("apiVersion") == "V2":  # Node.ApiVersion of v2alpha1 has no V2
            out["apiVersion"] = "V2_ALPHA1"
        return out
    if isinstance(value, list):
        return [_versioned(item, version) for item in value]
    return value


class RestApi:
    """Dispatch Cloud TPU API requests (v1 catalogue routes, v2, v2alpha1) to the emulator's state.

    ``services`` answers the project-level calls ``tpuops doctor`` makes (serviceusage, IAM,
    resource manager) that the emulator stands in for under provider local.
    """

    # Long: the route table of the Cloud TPU API, one row per RPC (v1 and v2), read as a table.
    def __init__(
        self,
        state: EmulatorState,
        queued: QueuedResources,
        faults: Faults,
        stats: RpcStats,
        services: ProjectServices | None = None,
    ) -> None:
        self._state = state
        self._queued = queued
        self._faults = faults
        self._stats = stats
        self._services = services or ProjectServices(faults)
        node = _LOCATION + r"/nodes/(?P<node>[^/:]+)"
        queued_resource = _LOCATION + r"/queuedResources/(?P<qr>[^/:]+)"
        operation = _LOCATION + r"/operations/(?P<op>[^/:]+)"
        table: list[tuple[frozenset[str], str, str, str, Handler]] = [
            (ALL, "GET", _PROJECT + "/locations", "ListLocations", self.list_locations),
            (ALL, "GET", _LOCATION, "GetLocation", self.get_location),
            (V2, "GET", _LOCATION + "/nodes", "ListNodes", self.list_nodes),
            (V2, "POST", _LOCATION + "/nodes", "CreateNode", self.create_node),
            (V2, "GET", node, "GetNode", self.get_node),
            (V2, "DELETE", node, "DeleteNode", self.delete_node),
            (V2, "PATCH", node, "UpdateNode", self.update_node),
            (V2, "POST", node + ":stop", "StopNode", self.stop_node),
            (V2, "POST", node + ":start", "StartNode", self.start_node),
            (V2, "POST", node + ":getGuestAttributes", "GetGuestAttributes", self.get_guest_attributes),
            (V2, "POST", node + ":simulateMaintenanceEvent", "SimulateMaintenanceEvent", self.node_maintenance),
            (V2, "POST", node + ":performMaintenance", "PerformMaintenance", self.node_maintenance),
            (V2, "POST", _LOCATION + ":generateServiceIdentity", "GenerateServiceIdentity", self.service_identity),
            (V2, "GET", _LOCATION + "/queuedResources", "ListQueuedResources", self.list_queued_resources),
            (V2, "POST", _LOCATION + "/queuedResources", "CreateQueuedResource", self.create_queued_resource),
            (V2, "GET", queued_resource, "GetQueuedResource", self.get_queued_resource),
            (V2, "DELETE", queued_resource, "DeleteQueuedResource", self.delete_queued_resource),
            (V2, "POST", queued_resource + ":reset", "ResetQueuedResource", self.reset_queued_resource),
            (
                V2,
                "POST",
                queued_resource + ":performMaintenanceQueuedResource",
                "PerformMaintenanceQueuedResource",
                self.queued_maintenance,
            ),
            (V2, "GET", _LOCATION + "/reservations", "ListReservations", self.list_reservations),
            (ALL, "GET", _LOCATION + "/acceleratorTypes", "ListAcceleratorTypes", self.list_accelerator_types),
            (
                ALL,
                "GET",
                _LOCATION + r"/acceleratorTypes/(?P<type>[^/:]+)",
                "GetAcceleratorType",
                self.get_accelerator_type,
            ),
            (V2, "GET", _LOCATION + "/runtimeVersions", "ListRuntimeVersions", self.list_runtime_versions),
            (
                V2,
                "GET",
                _LOCATION + r"/runtimeVersions/(?P<version>[^/:]+)",
                "GetRuntimeVersion",
                self.get_runtime_version,
            ),
            (V1, "GET", _LOCATION + "/tensorflowVersions", "ListTensorFlowVersions", self.list_tensorflow_versions),
            (
                V1,
                "GET",
                _LOCATION + r"/tensorflowVersions/(?P<version>[^/:]+)",
                "GetTensorFlowVersion",
                self.get_tensorflow_version,
            ),
            (V1, "GET", node, "GetNode", self.v1_get_node),
            (V1, "GET", _LOCATION + r"/nodes(?:/.*)?", "V1Nodes", self.v1_nodes),
            (V1, "POST", _LOCATION + r"/nodes(?:/.*)?", "V1Nodes", self.v1_nodes),
            (V1, "DELETE", _LOCATION + r"/nodes(?:/.*)?", "V1Nodes", self.v1_nodes),
            (ALL, "GET", _LOCATION + "/operations", "ListOperations", self.list_operations),
            (ALL, "GET", operation, "GetOperation", self.get_operation),
            (ALL, "DELETE", operation, "DeleteOperation", self.delete_operation),
            (ALL, "POST", operation + ":cancel", "CancelOperation", self.cancel_operation),
            (V1, "GET", _PROJECT, "GetProject", self._services.get_project),
            (V1, "GET", _PROJECT + r"/services/(?P<service>[^/:]+)", "GetService", self._services.get_service),
            (V1, "POST", _PROJECT + ":testIamPermissions", "TestIamPermissions", self._services.test_permissions),
            (
                V1,
                "GET",
                _PROJECT + r"/serviceAccounts/(?P<account>[^/:]+)",
                "GetServiceAccount",
                self._services.get_service_account,
            ),
        ]
        self._routes = [
            (versions, method, re.compile(f"^/(?P<api>v1|v2|v2alpha1)/{pattern}$"), rpc, fn)
            for versions, method, pattern, rpc, fn in table
        ]

    def route(self, method: str, path: str) -> tuple[str, Handler, dict[str, str]] | None:
        """The RPC name, handler and path parameters of a request, or None if no RPC matches."""
        for versions, route_method, pattern, rpc, handler in self._routes:
            match = pattern.match(path)
            if match and route_method == method and match["api"] in versions:
                return rpc, handler, match.groupdict()
        return None

    def handle(self, method: str, path: str, query: dict[str, str], raw_body: bytes) -> tuple[int, dict[str, Any]]:
        """Answer one API request: (HTTP status, JSON body). Never raises ApiError."""
        found = self.route(method, path)
        if found is None:
            return 404, ApiError("NOT_FOUND", f"No RPC matches {method} {path}.").http_body()
        rpc, handler, params = found
        version = params.pop("api")
        self._stats.count(rpc)
        try:
            injected = self._faults.injected_error()
            if injected is not None:
                raise injected
            body = handler(Request(method, params, query, parse_body(raw_body), version))
            return 200, _versioned(body, version)
        except ApiError as err:
            return err.http_status, err.http_body()

    # ----- locations, catalogue

    def list_locations(self, req: Request) -> dict[str, Any]:
        project = req.params["project"]
        items = [_location_json(project, zone) for zone in sorted(load().zones)]
        return _page(items, "locations", req.query)

    def get_location(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        return _location_json(req.params["project"], req.params["zone"])

    def list_accelerator_types(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        prefix = f"projects/{req.params['project']}/locations/{req.params['zone']}/acceleratorTypes/"
        items = [_accelerator_json(prefix, spec, req.version) for spec in load().accelerators_in(req.params["zone"])]
        return _page(sorted(items, key=lambda item: item["name"]), "acceleratorTypes", req.query)

    def get_accelerator_type(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        name, zone = req.params["type"], req.params["zone"]
        if not load().offers(zone, name):
            raise not_found(f"Resource 'projects/{req.params['project']}/locations/{zone}/acceleratorTypes/{name}'")
        prefix = f"projects/{req.params['project']}/locations/{zone}/acceleratorTypes/"
        return _accelerator_json(prefix, load().accelerators[name], req.version)

    def list_runtime_versions(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        prefix = f"projects/{req.params['project']}/locations/{req.params['zone']}/runtimeVersions/"
        items = [{"name": prefix + version, "version": version} for version in sorted(load().runtime_versions)]
        return _page(items, "runtimeVersions", req.query)

    def get_runtime_version(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        version = req.params["version"]
        name = f"projects/{req.params['project']}/locations/{req.params['zone']}/runtimeVersions/{version}"
        if version not in load().runtime_versions:
            raise not_found(f"Resource '{name}'")
        return {"name": name, "version": version}

    def list_tensorflow_versions(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        prefix = f"projects/{req.params['project']}/locations/{req.params['zone']}/tensorflowVersions/"
        items = [{"name": prefix + version, "version": version} for version in _tensorflow_versions()]
        return _page(items, "tensorflowVersions", req.query)

    def get_tensorflow_version(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        version = req.params["version"]
        name = f"projects/{req.params['project']}/locations/{req.params['zone']}/tensorflowVersions/{version}"
        if version not in _tensorflow_versions():
            raise not_found(f"Resource '{name}'")
        return {"name": name, "version": version}

    def v1_get_node(self, req: Request) -> dict[str, Any]:
        """A node (made through v2) as v1 shows it: what TensorFlow 2.9's TPU client asks for by name."""
        return v1_node(self._state.get_node(req.params["project"], req.params["zone"], req.params["node"]))

    def v1_nodes(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        raise precondition(V1_DEPRECATED)

    def list_reservations(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        return {"reservations": []}

    def service_identity(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        number = project_number(req.params["project"])
        # Google's ServiceIdentity schema has only ``email``: nothing the real API never sends.
        return {"identity": {"email": f"service-{number}@cloud-tpu.iam.gserviceaccount.com"}}

    # ----- nodes

    def list_nodes(self, req: Request) -> dict[str, Any]:
        return _page(self._state.list_nodes(req.params["project"], req.params["zone"]), "nodes", req.query)

    def get_node(self, req: Request) -> dict[str, Any]:
        return self._state.get_node(req.params["project"], req.params["zone"], req.params["node"])

    def create_node(self, req: Request) -> dict[str, Any]:
        zone = req.params["zone"]
        check_zone(zone)
        spec = parse_node_fields(req.body, zone)
        return self._state.create_node(req.params["project"], zone, req.query.get("nodeId", ""), spec)

    def delete_node(self, req: Request) -> dict[str, Any]:
        return self._state.delete_node(req.params["project"], req.params["zone"], req.params["node"])

    def update_node(self, req: Request) -> dict[str, Any]:
        body = require_object(req.body, "node")
        paths = parse_update_mask(req.query.get("updateMask", ""))
        return self._state.update_node(req.params["project"], req.params["zone"], req.params["node"], paths, body)

    def stop_node(self, req: Request) -> dict[str, Any]:
        return self._state.stop_node(req.params["project"], req.params["zone"], req.params["node"])

    def start_node(self, req: Request) -> dict[str, Any]:
        return self._state.start_node(req.params["project"], req.params["zone"], req.params["node"])

    def get_guest_attributes(self, req: Request) -> dict[str, Any]:
        body = require_object(req.body or {}, "request")
        query_path = str(body.get("queryPath") or "")
        workers = self._state.guest_attributes(req.params["project"], req.params["zone"], req.params["node"])
        wanted = {str(worker) for worker in body.get("workerIds") or []}
        answers = []
        for worker, attributes in enumerate(workers):
            if wanted and str(worker) not in wanted:
                continue
            items = []
            for path, value in sorted(attributes.items()):
                if not query_path or path == query_path or path.startswith(query_path.rstrip("/") + "/"):
                    namespace, key = path.split("/", 1)
                    items.append({"namespace": namespace, "key": key, "value": value})
            answers.append({"queryPath": query_path, "queryValue": {"items": items}})
        return {"guestAttributes": answers}

    def node_maintenance(self, req: Request) -> dict[str, Any]:
        return self._state.maintenance(req.params["project"], req.params["zone"], req.params["node"])

    # ----- queued resources

    def list_queued_resources(self, req: Request) -> dict[str, Any]:
        return _page(self._queued.list(req.params["project"], req.params["zone"]), "queuedResources", req.query)

    def get_queued_resource(self, req: Request) -> dict[str, Any]:
        return self._queued.get(req.params["project"], req.params["zone"], req.params["qr"])

    def create_queued_resource(self, req: Request) -> dict[str, Any]:
        body = require_object(req.body, "queued_resource")
        return self._queued.create(
            req.params["project"], req.params["zone"], req.query.get("queuedResourceId", ""), body
        )

    def delete_queued_resource(self, req: Request) -> dict[str, Any]:
        force = req.query.get("force", "").lower() in ("true", "1")
        return self._queued.delete(req.params["project"], req.params["zone"], req.params["qr"], force)

    def reset_queued_resource(self, req: Request) -> dict[str, Any]:
        return self._queued.reset(req.params["project"], req.params["zone"], req.params["qr"])

    def queued_maintenance(self, req: Request) -> dict[str, Any]:
        return self._queued.maintenance(req.params["project"], req.params["zone"], req.params["qr"])

    # ----- operations

    @staticmethod
    def _operation_name(req: Request) -> str:
        return f"projects/{req.params['project']}/locations/{req.params['zone']}/operations/{req.params['op']}"

    def list_operations(self, req: Request) -> dict[str, Any]:
        return _page(self._state.list_operations(req.params["project"], req.params["zone"]), "operations", req.query)

    def get_operation(self, req: Request) -> dict[str, Any]:
        return self._state.get_operation(self._operation_name(req))

    def delete_operation(self, req: Request) -> dict[str, Any]:
        self._state.delete_operation(self._operation_name(req))
        return {}

    def cancel_operation(self, req: Request) -> dict[str, Any]:
        self._state.cancel_operation(self._operation_name(req))
        return {}


def v1_node(node: dict[str, Any]) -> dict[str, Any]:
    """A v2 Node in the v1 schema: ``tensorflowVersion`` for ``runtimeVersion``, the service account's email,
    the first endpoint's address and port also at the top, ``apiVersion`` V2_ALPHA1 (v1's name for TPU VMs)."""
    endpoints = [{"ipAddress": e["ipAddress"], "port": e["port"]} for e in node.get("networkEndpoints", [])]
    scheduling = node.get("schedulingConfig") or {}
    out: dict[str, Any] = {
        "name": node["name"],
        "acceleratorType": node["acceleratorType"],
        "state": node["state"],
        "tensorflowVersion": node["runtimeVersion"],
        "createTime": node["createTime"],
        "networkEndpoints": endpoints,
        "network": node["networkConfig"].get("network", ""),
        "serviceAccount": node["serviceAccount"].get("email", ""),
        "schedulingConfig": {"preemptible": bool(scheduling.get("preemptible") or scheduling.get("spot")),
                             "reserved": bool(scheduling.get("reserved"))},
        "apiVersion": "V2_ALPHA1",
    }
    if endpoints:
        out["ipAddress"], out["port"] = endpoints[0]["ipAddress"], str(endpoints[0]["port"])
    for key in ("description", "health", "healthDescription", "labels", "symptoms", "cidrBlock"):
        if node.get(key):
            out[key] = node[key]
    return out


def _accelerator_json(prefix: str, spec: AcceleratorType, version: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": prefix + spec.name, "type": spec.name}
    if version != "v1":
        out["acceleratorConfigs"] = [{"type": spec.config_type, "topology": spec.topology}]
    return out


def _location_json(project: str, zone: str) -> dict[str, Any]:
    return {
        "name": f"projects/{project}/locations/{zone}",
        "locationId": zone,
        "displayName": zone,
        "labels": {},
        "metadata": {},
    }


def _tensorflow_versions() -> list[str]:
    """The TensorFlow releases the v1 API lists: the x.y.z of every ``tpu-vm-tf-x.y.z`` image."""
    images = [v.removeprefix("tpu-vm-tf-") for v in load().runtime_versions if v.startswith("tpu-vm-tf-")]
    return sorted({image.split("-")[0] for image in images})


def parse_body(raw: bytes) -> Any:
    """A request body as JSON (None when empty). Raises INVALID_ARGUMENT when malformed."""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as err:
        raise invalid(f"Invalid JSON payload received: {err}.") from err
