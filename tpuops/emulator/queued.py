"""Queued resources: requests for nodes that the emulator provisions when capacity allows.

States follow the v2 API: ACCEPTED -> (WAITING_FOR_RESOURCES while the zone is stocked out)
-> PROVISIONING (nodes CREATING) -> ACTIVE (all nodes READY) -> SUSPENDED (a node was
preempted or vanished). A queueing policy's ``validAfter*`` delays provisioning and
``validUntil*`` fails a request still waiting when it expires. Deleting needs ``force``
unless the request holds no running nodes (ACCEPTED, WAITING, FAILED, SUSPENDED); deleting
ends its nodes. ``reset`` sends a SUSPENDED or FAILED request back to ACCEPTED.

Progress is made by a tick hook of the state (every ``tick_s``), under the state lock.
"""

from __future__ import annotations

import time
from typing import Any

from tpuops.emulator.apierror import ApiError, invalid, not_found, precondition
from tpuops.emulator.operations import EMPTY_TYPE, QUEUED_RESOURCE_TYPE
from tpuops.emulator.resources import NodeRequest, QueuedResource
from tpuops.emulator.state import EmulatorState, check_zone
from tpuops.emulator.wire import check_resource_id, parse_duration, parse_node_spec, parse_rfc3339

_FIELDS = frozenset({"name", "createTime", "tpu", "spot", "guaranteed", "queueingPolicy", "state", "reservationName"})
_DELETABLE = frozenset({"ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED", "SUSPENDED"})
_RESETTABLE = frozenset({"SUSPENDED", "FAILED"})


class QueuedResources:
    """Every queued resource of one emulator; shares the state's lock."""

    def __init__(self, state: EmulatorState) -> None:
        self._state = state
        self._items: dict[tuple[str, str, str], QueuedResource] = {}
        state.add_tick_hook(self._tick)

    def _get(self, project: str, zone: str, qr_id: str) -> QueuedResource:
        item = self._items.get((project, zone, qr_id))
        if item is None:
            raise not_found(f"Resource 'projects/{project}/locations/{zone}/queuedResources/{qr_id}'")
        return item

    def get(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        check_zone(zone)
        with self._state.lock:
            return self._get(project, zone, qr_id).to_json()

    def list(self, project: str, zone: str) -> list[dict[str, Any]]:
        check_zone(zone, allow_all=True)
        with self._state.lock:
            chosen = [q for q in self._items.values() if q.project == project and zone in ("-", q.zone)]
            return [q.to_json() for q in sorted(chosen, key=lambda q: q.name)]

    def create(self, project: str, zone: str, qr_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Accept a queued resource; the operation is done once it is recorded (ACCEPTED)."""
        check_zone(zone)
        check_resource_id("queued resource", qr_id)
        item = self._parse(project, zone, qr_id, body)
        with self._state.lock:
            if (project, zone, qr_id) in self._items:
                raise ApiError("ALREADY_EXISTS", f"Resource '{item.name}' already exists")
            taken = [key for key in item.node_keys if key in self._state.nodes or self._owner(key)]
            if taken:
                raise ApiError("ALREADY_EXISTS", f"Node '{taken[0][2]}' already exists in zone {zone}")
            self._items[(project, zone, qr_id)] = item
            op = self._state.ops.start(project, zone, item.name, "create")
            self._state.ops.succeed(op, QUEUED_RESOURCE_TYPE, item.to_json())
            return op.to_json()

    def delete(self, project: str, zone: str, qr_id: str, force: bool) -> dict[str, Any]:
        check_zone(zone)
        with self._state.lock:
            item = self._get(project, zone, qr_id)
            if not force and item.state not in _DELETABLE | {"DELETING"}:
                raise precondition(
                    f"Queued resource {item.name} is {item.state} and has nodes; delete them first or use force."
                )
            op = self._state.ops.start(project, zone, item.name, "delete")
            item.delete_ops.append(op)
            item.state = "DELETING"
            self._end_nodes(item)
            return op.to_json()

    def reset(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        check_zone(zone)
        with self._state.lock:
            item = self._get(project, zone, qr_id)
            if item.state not in _RESETTABLE:
                raise precondition(f"Queued resource {item.name} cannot be reset in state {item.state}.")
            self._end_nodes(item)
            item.state, item.state_initiator, item.failure = "ACCEPTED", "USER", None
            op = self._state.ops.start(project, zone, item.name, "reset")
            self._state.ops.succeed(op, QUEUED_RESOURCE_TYPE, item.to_json())
            return op.to_json()

    def _owner(self, key: tuple[str, str, str]) -> QueuedResource | None:
        return next((q for q in self._items.values() if key in q.node_keys), None)

    def _end_nodes(self, item: QueuedResource) -> None:
        for key in item.node_keys:
            node = self._state.nodes.get(key)
            if node is not None:
                self._state.remove_node(node)

    def _parse(self, project: str, zone: str, qr_id: str, body: dict[str, Any]) -> QueuedResource:
        unknown = set(body) - _FIELDS
        if unknown:
            raise invalid(f"Invalid JSON payload received. Unknown name {sorted(unknown)[0]!r} at 'queued_resource'.")
        specs = (body.get("tpu") or {}).get("nodeSpec") or []
        if not specs:
            raise invalid("Field queued_resource.tpu.node_spec is required.")
        tier = {key: body[key] for key in ("spot", "guaranteed") if key in body}
        requests = [self._parse_request(project, zone, raw, spot="spot" in tier) for raw in specs]
        policy = body.get("queueingPolicy") or {}
        now = time.time()
        return QueuedResource(
            project=project,
            zone=zone,
            qr_id=qr_id,
            create_time=now,
            requests=requests,
            tier=tier,
            queueing_policy=policy,
            reservation_name=str(body.get("reservationName") or ""),
            valid_after=_policy_time(policy, "validAfter", "startTime", now),
            valid_until=_policy_time(policy, "validUntil", "endTime", now),
        )

    @staticmethod
    def _parse_request(project: str, zone: str, raw: dict[str, Any], *, spot: bool) -> NodeRequest:
        parent = raw.get("parent") or ""
        if parent != f"projects/{project}/locations/{zone}":
            raise invalid(
                f"Node spec parent {parent!r} must be the queued resource's parent projects/{project}/locations/{zone}."
            )
        spec = parse_node_spec(raw.get("node"), zone)
        if spot:
            spec.scheduling_config = {**spec.scheduling_config, "spot": True}
        multislice = raw.get("multisliceParams")
        if multislice:
            prefix = multislice.get("nodeIdPrefix") or ""
            node_ids = [f"{prefix}-{index}" for index in range(int(multislice.get("nodeCount") or 0))]
            if not node_ids:
                raise invalid("multislice_params.node_count must be positive.")
        else:
            node_ids = [raw.get("nodeId") or ""]
        for node_id in node_ids:
            check_resource_id("node", node_id)
        echo = {key: raw[key] for key in ("parent", "nodeId", "multisliceParams") if key in raw}
        echo["node"] = spec.to_json()
        return NodeRequest(node_ids=node_ids, spec=spec, echo=echo)

    def _tick(self) -> None:
        state = self._state
        with state.lock:
            for key, item in list(self._items.items()):
                nodes = [state.nodes.get(node_key) for node_key in item.node_keys]
                if item.state == "DELETING":
                    if not any(nodes):
                        del self._items[key]
                        for op in item.delete_ops:
                            state.ops.succeed(op, EMPTY_TYPE)
                elif item.state in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
                    self._try_provision(item, any(nodes))
                elif item.state == "PROVISIONING":
                    if all(node is not None and node.state == "READY" for node in nodes):
                        item.state = "ACTIVE"
                    elif not all(nodes):
                        self._fail(item, "A node of the queued resource disappeared while it was provisioned.")
                elif item.state == "ACTIVE" and any(node is None or node.state == "PREEMPTED" for node in nodes):
                    item.state, item.state_initiator = "SUSPENDED", "SERVICE"

    def _try_provision(self, item: QueuedResource, leftovers: bool) -> None:
        now = time.time()
        if item.valid_until is not None and now > item.valid_until:
            self._fail(item, "The queued resource's validity window expired before capacity was found.")
        elif leftovers or (item.valid_after is not None and now < item.valid_after):
            return
        elif self._state.faults.stockout(item.zone):
            item.state = "WAITING_FOR_RESOURCES"
        else:
            for request in item.requests:
                for node_id in request.node_ids:
                    self._state.add_node(
                        item.project, item.zone, node_id, request.spec, queued_resource=item.name, check_capacity=False
                    )
            item.state = "PROVISIONING"

    @staticmethod
    def _fail(item: QueuedResource, message: str) -> None:
        item.state, item.state_initiator = "FAILED", "SERVICE"
        item.failure = ApiError("FAILED_PRECONDITION", message).rpc_status()


def _policy_time(policy: dict[str, Any], prefix: str, interval_field: str, now: float) -> float | None:
    """An absolute time from ``<prefix>Duration``, ``<prefix>Time`` or ``validInterval``."""
    if f"{prefix}Duration" in policy:
        return now + parse_duration(policy[f"{prefix}Duration"])
    if f"{prefix}Time" in policy:
        return parse_rfc3339(policy[f"{prefix}Time"])
    interval = policy.get("validInterval") or {}
    if interval_field in interval:
        return parse_rfc3339(interval[interval_field])
    return None
