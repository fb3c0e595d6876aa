"""Queued resources: requests for nodes that the emulator provisions when capacity allows.

States follow the v2 API: ACCEPTED -> (WAITING_FOR_RESOURCES while the zone is stocked out)
-> PROVISIONING (nodes CREATING) -> ACTIVE (all nodes READY) -> SUSPENDING (a node is being
deleted) -> SUSPENDED (a node was preempted or is gone). A queueing policy's ``validAfter*``
delays provisioning and ``validUntil*`` fails a request still waiting when it expires; the
durations are answered as the absolute ``validAfterTime`` / ``validUntilTime`` the real API
returns. Deleting needs ``force`` unless the request holds no running nodes (ACCEPTED,
WAITING, FAILED, SUSPENDED, or every node gone); deleting ends its nodes. ``reset`` sends a
SUSPENDED or FAILED request back to ACCEPTED. Faults make every state reachable: stockouts
(WAITING_FOR_RESOURCES), ``hold_queued`` (stays ACCEPTED), ``fail_queued_zones`` (FAILED).

A node's change moves its queued resource in the same step (a node listener of the state),
so a request is SUSPENDED the moment its node's delete operation is done; time-driven
moves (provisioning, expiry) are made by a tick hook. Both run under the state lock.
"""

from __future__ import annotations

import time
from typing import Any

from tpuops.emulator.apierror import ApiError, invalid, not_found, precondition
from tpuops.emulator.cloud.nodes import QueuedNodeSpec, QueuedResource
from tpuops.emulator.cloud.operations import EMPTY_TYPE, QUEUED_RESOURCE_TYPE
from tpuops.emulator.cloud.state import EmulatorState, check_zone
from tpuops.emulator.cloud.wire import check_resource_id, parse_duration, parse_node_fields, parse_rfc3339

_FIELDS = frozenset(
    {"name", "createTime", "tpu", "spot", "guaranteed", "bestEffort", "queueingPolicy", "state", "reservationName"}
)
_DELETABLE = frozenset({"ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED", "SUSPENDED"})
_RESETTABLE = frozenset({"SUSPENDED", "FAILED"})


class QueuedResources:
    """Every queued resource of one emulator; shares the state's lock."""

    def __init__(self, state: EmulatorState) -> None:
        self._state = state
        self._items: dict[tuple[str, str, str], QueuedResource] = {}
        state.add_tick_hook(self._tick)
        state.add_node_listener(self._node_changed)

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
            nodes_left = any(key in self._state.nodes for key in item.node_keys)
            if not force and nodes_left and item.state not in _DELETABLE | {"DELETING"}:
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
        tier = {key: body[key] for key in ("spot", "guaranteed", "bestEffort") if key in body}
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
    def _parse_request(project: str, zone: str, raw: dict[str, Any], *, spot: bool) -> QueuedNodeSpec:
        parent = raw.get("parent") or ""
        if parent != f"projects/{project}/locations/{zone}":
            raise invalid(
                f"Node spec parent {parent!r} must be the queued resource's parent projects/{project}/locations/{zone}."
            )
        spec = parse_node_fields(raw.get("node"), zone)
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
        return QueuedNodeSpec(node_ids=node_ids, spec=spec, echo=echo)

    def maintenance(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        """PerformMaintenanceQueuedResource (v2alpha1): an ACTIVE request's nodes stay READY."""
        check_zone(zone)
        with self._state.lock:
            item = self._get(project, zone, qr_id)
            if item.state != "ACTIVE":
                raise precondition(f"Queued resource {item.name} cannot undergo maintenance in state {item.state}.")
            op = self._state.ops.start(project, zone, item.name, "maintenance")
            self._state.ops.succeed(op, QUEUED_RESOURCE_TYPE, item.to_json())
            return op.to_json()

    def _node_changed(self, key: tuple[str, str, str]) -> None:
        owner = self._owner(key)
        if owner is not None:
            self._evaluate(owner)

    def _tick(self) -> None:
        with self._state.lock:
            for item in list(self._items.values()):
                self._evaluate(item)

    def _evaluate(self, item: QueuedResource) -> None:
        """Move ``item`` to the state its nodes and policy call for (caller holds the lock)."""
        state = self._state
        nodes = [state.nodes.get(node_key) for node_key in item.node_keys]
        if item.state == "DELETING":
            if not any(nodes):
                del self._items[(item.project, item.zone, item.qr_id)]
                for op in item.delete_ops:
                    state.ops.succeed(op, EMPTY_TYPE)
        elif item.state in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
            self._try_provision(item, any(nodes))
        elif item.state == "PROVISIONING":
            if all(node is not None and node.state == "READY" for node in nodes):
                item.state = "ACTIVE"
            elif not all(nodes):
                self._fail(item, "A node of the queued resource disappeared while it was provisioned.")
        elif item.state in ("ACTIVE", "SUSPENDING"):
            if any(node is None or node.state == "PREEMPTED" for node in nodes) and not any(
                node is not None and node.state == "DELETING" for node in nodes
            ):
                item.state, item.state_initiator = "SUSPENDED", "SERVICE"
            elif any(node is not None and node.state == "DELETING" for node in nodes):
                item.state, item.state_initiator = "SUSPENDING", "SERVICE"

    def _try_provision(self, item: QueuedResource, leftovers: bool) -> None:
        now = time.time()
        outcome = self._state.faults.queued_outcome(item.zone)
        if item.valid_until is not None and now > item.valid_until:
            self._fail(item, "The queued resource's validity window expired before capacity was found.")
        elif leftovers or outcome == "hold" or (item.valid_after is not None and now < item.valid_after):
            return
        elif outcome == "fail":
            self._fail(item, f"Cloud TPU could not provision the queued resource in zone {item.zone}.")
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
