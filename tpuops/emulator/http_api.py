"""The Cloud TPU v2 REST surface: routes, request parsing and response JSON.

Paths and verbs are those of ``google/cloud/tpu/v2/cloud_tpu.proto`` as the google-cloud-tpu
REST transport calls them (``/v2/projects/{p}/locations/{zone}/nodes/{n}:stop`` ...), plus
the location and ``google.longrunning`` mixins. ``RestApi.handle`` is independent of
sockets: it takes a parsed request and returns a status and a JSON body, so the server
module owns HTTP and this module owns the API.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuops.emulator import catalog
from tpuops.emulator.apierror import ApiError, invalid, not_found
from tpuops.emulator.faults import Faults
from tpuops.emulator.queued import QueuedResources
from tpuops.emulator.state import EmulatorState, check_zone
from tpuops.emulator.stats import RpcStats
from tpuops.emulator.wire import page_size_of, paginate, parse_node_spec, parse_update_mask, require_object

_LOCATION = r"projects/(?P<project>[^/:]+)/locations/(?P<zone>[^/:]+)"


@dataclass
class Request:
    method: str
    params: dict[str, str]
    query: dict[str, str]
    body: Any


Handler = Callable[[Request], dict[str, Any]]


def _page(items: list[dict[str, Any]], field: str, query: dict[str, str]) -> dict[str, Any]:
    page, token = paginate(items, lambda item: item["name"], page_size_of(query), query.get("pageToken", ""))
    out: dict[str, Any] = {field: page}
    if token:
        out["nextPageToken"] = token
    return out


class RestApi:
    """Dispatch v2 API requests to the emulator's state."""

    def __init__(self, state: EmulatorState, queued: QueuedResources, faults: Faults, stats: RpcStats) -> None:
        self._state = state
        self._queued = queued
        self._faults = faults
        self._stats = stats
        node = _LOCATION + r"/nodes/(?P<node>[^/:]+)"
        queued_resource = _LOCATION + r"/queuedResources/(?P<qr>[^/:]+)"
        operation = _LOCATION + r"/operations/(?P<op>[^/:]+)"
        table: list[tuple[str, str, str, Handler]] = [
            ("GET", r"projects/(?P<project>[^/:]+)/locations", "ListLocations", self.list_locations),
            ("GET", _LOCATION, "GetLocation", self.get_location),
            ("GET", _LOCATION + "/nodes", "ListNodes", self.list_nodes),
            ("POST", _LOCATION + "/nodes", "CreateNode", self.create_node),
            ("GET", node, "GetNode", self.get_node),
            ("DELETE", node, "DeleteNode", self.delete_node),
            ("PATCH", node, "UpdateNode", self.update_node),
            ("POST", node + ":stop", "StopNode", self.stop_node),
            ("POST", node + ":start", "StartNode", self.start_node),
            ("POST", node + ":getGuestAttributes", "GetGuestAttributes", self.get_guest_attributes),
            ("GET", _LOCATION + "/queuedResources", "ListQueuedResources", self.list_queued_resources),
            ("POST", _LOCATION + "/queuedResources", "CreateQueuedResource", self.create_queued_resource),
            ("GET", queued_resource, "GetQueuedResource", self.get_queued_resource),
            ("DELETE", queued_resource, "DeleteQueuedResource", self.delete_queued_resource),
            ("POST", queued_resource + ":reset", "ResetQueuedResource", self.reset_queued_resource),
            ("GET", _LOCATION + "/acceleratorTypes", "ListAcceleratorTypes", self.list_accelerator_types),
            ("GET", _LOCATION + r"/acceleratorTypes/(?P<type>[^/:]+)", "GetAcceleratorType", self.get_accelerator_type),
            ("GET", _LOCATION + "/runtimeVersions", "ListRuntimeVersions", self.list_runtime_versions),
            ("GET", _LOCATION + r"/runtimeVersions/(?P<version>[^/:]+)", "GetRuntimeVersion", self.get_runtime_version),
            ("GET", _LOCATION + "/operations", "ListOperations", self.list_operations),
            ("GET", operation, "GetOperation", self.get_operation),
            ("DELETE", operation, "DeleteOperation", self.delete_operation),
            ("POST", operation + ":cancel", "CancelOperation", self.cancel_operation),
        ]
        self._routes = [(method, re.compile(f"^/v2/{pattern}$"), rpc, fn) for method, pattern, rpc, fn in table]

    def route(self, method: str, path: str) -> tuple[str, Handler, dict[str, str]] | None:
        """The RPC name, handler and path parameters of a request, or None if no RPC matches."""
        for route_method, pattern, rpc, handler in self._routes:
            match = pattern.match(path)
            if match and route_method == method:
                return rpc, handler, match.groupdict()
        return None

    def handle(self, method: str, path: str, query: dict[str, str], raw_body: bytes) -> tuple[int, dict[str, Any]]:
        """Answer one API request: (HTTP status, JSON body). Never raises ApiError."""
        found = self.route(method, path)
        if found is None:
            return 404, ApiError("NOT_FOUND", f"No RPC matches {method} {path}.").http_body()
        rpc, handler, params = found
        self._stats.count(rpc)
        try:
            injected = self._faults.injected_error()
            if injected is not None:
                raise injected
            return 200, handler(Request(method, params, query, parse_body(raw_body)))
        except ApiError as err:
            return err.http_status, err.http_body()

    # ----- locations, catalogue

    def list_locations(self, req: Request) -> dict[str, Any]:
        project = req.params["project"]
        items = [
            {"name": f"projects/{project}/locations/{zone}", "locationId": zone}
            for zone in sorted(catalog.ZONE_GENERATIONS)
        ]
        return _page(items, "locations", req.query)

    def get_location(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        return {
            "name": f"projects/{req.params['project']}/locations/{req.params['zone']}",
            "locationId": req.params["zone"],
        }

    def list_accelerator_types(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        prefix = f"projects/{req.params['project']}/locations/{req.params['zone']}/acceleratorTypes/"
        items = [_accelerator_json(prefix, spec) for spec in catalog.accelerators_in_zone(req.params["zone"])]
        return _page(sorted(items, key=lambda item: item["name"]), "acceleratorTypes", req.query)

    def get_accelerator_type(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        spec = catalog.accelerator_in_zone(req.params["type"], req.params["zone"])
        if spec is None:
            raise not_found(f"Accelerator type {req.params['type']!r} in zone {req.params['zone']}")
        return _accelerator_json(
            f"projects/{req.params['project']}/locations/{req.params['zone']}/acceleratorTypes/", spec
        )

    def list_runtime_versions(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        prefix = f"projects/{req.params['project']}/locations/{req.params['zone']}/runtimeVersions/"
        items = [{"name": prefix + version, "version": version} for version in sorted(catalog.RUNTIME_VERSIONS)]
        return _page(items, "runtimeVersions", req.query)

    def get_runtime_version(self, req: Request) -> dict[str, Any]:
        check_zone(req.params["zone"])
        version = req.params["version"]
        if version not in catalog.RUNTIME_VERSIONS:
            raise not_found(f"Runtime version {version!r}")
        return {
            "name": f"projects/{req.params['project']}/locations/{req.params['zone']}/runtimeVersions/{version}",
            "version": version,
        }

    # ----- nodes

    def list_nodes(self, req: Request) -> dict[str, Any]:
        return _page(self._state.list_nodes(req.params["project"], req.params["zone"]), "nodes", req.query)

    def get_node(self, req: Request) -> dict[str, Any]:
        return self._state.get_node(req.params["project"], req.params["zone"], req.params["node"])

    def create_node(self, req: Request) -> dict[str, Any]:
        zone = req.params["zone"]
        check_zone(zone)
        spec = parse_node_spec(req.body, zone)
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
        attributes = self._state.guest_attributes(req.params["project"], req.params["zone"], req.params["node"])
        items = []
        for path, value in sorted(attributes.items()):
            if path == query_path or path.startswith(query_path.rstrip("/") + "/") or not query_path:
                namespace, key = path.split("/", 1)
                items.append({"namespace": namespace, "key": key, "value": value})
        return {"guestAttributes": [{"queryPath": query_path, "queryValue": {"items": items}}]}

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


def _accelerator_json(prefix: str, spec: catalog.AcceleratorSpec) -> dict[str, Any]:
    return {
        "name": prefix + spec.name,
        "type": spec.name,
        "acceleratorConfigs": [{"type": spec.config_type, "topology": spec.topology}],
    }


def parse_body(raw: bytes) -> Any:
    """A request body as JSON (None when empty). Raises INVALID_ARGUMENT when malformed."""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as err:
        raise invalid(f"Invalid JSON payload received: {err}.") from err
