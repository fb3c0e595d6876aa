"""JSON wire details of the v2 REST API: timestamps, enums, pagination and request bodies.

The client parses responses with unknown fields rejected, so everything emitted must be a
real proto field in its proto3 JSON form (camelCase, enums as names, int64 as strings,
Timestamps as RFC 3339). Requests come as camelCase JSON with enums as integers; names are
accepted as well. Request bodies are checked against the proto's field names so a typo in
tpuops fails here as it would on GCP, with INVALID_ARGUMENT.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from tpuops.emulator.apierror import invalid
from tpuops.emulator.cloud import catalog
from tpuops.providers.cloud_tpu.catalog import AcceleratorType

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000

RESOURCE_ID = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")

ACCELERATOR_CONFIG_TYPES = {0: "TYPE_UNSPECIFIED", 2: "V2", 4: "V3", 7: "V4", 9: "V5LITE_POD", 10: "V5P", 11: "V6E"}
DISK_MODES = {0: "DISK_MODE_UNSPECIFIED", 1: "READ_WRITE", 2: "READ_ONLY"}

@dataclass
class Request:
    """One REST call as a handler sees it: path parameters, query and parsed JSON body."""

    method: str
    params: dict[str, str]
    query: dict[str, str]
    body: Any
    version: str = "v2"
    """The API version in the path (v2, v2alpha1, ...): answers are given in it."""


# Node fields a caller may send; the output-only ones are accepted and ignored, as on GCP.
_NODE_FIELDS = frozenset(
    {
        "name",
        "description",
        "acceleratorType",
        "state",
        "healthDescription",
        "runtimeVersion",
        "networkConfig",
        "networkConfigs",
        "cidrBlock",
        "serviceAccount",
        "createTime",
        "schedulingConfig",
        "networkEndpoints",
        "health",
        "labels",
        "metadata",
        "tags",
        "id",
        "dataDisks",
        "apiVersion",
        "symptoms",
        "shieldedInstanceConfig",
        "acceleratorConfig",
        "queuedResource",
        "multisliceNode",
        # v2alpha1 only
        "autocheckpointEnabled",
        "bootDiskConfig",
        "upcomingMaintenance",
    }
)
_SCHEDULING_FIELDS = frozenset({"preemptible", "reserved", "spot"})


def rfc3339(epoch_s: float) -> str:
    """A ``google.protobuf.Timestamp`` in JSON form."""
    stamp = datetime.fromtimestamp(epoch_s, tz=timezone.utc).isoformat(timespec="microseconds")
    return stamp.replace("+00:00", "Z")


def parse_rfc3339(text: str) -> float:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError as err:
        raise invalid(f"Invalid timestamp {text!r}.") from err


def parse_duration(text: str) -> float:
    """A ``google.protobuf.Duration`` in JSON form (``"3600s"``, ``"1.5s"``) in seconds."""
    if not isinstance(text, str) or not text.endswith("s"):
        raise invalid(f"Invalid duration {text!r}: expected a number of seconds ending in 's'.")
    try:
        return float(text[:-1])
    except ValueError as err:
        raise invalid(f"Invalid duration {text!r}.") from err


def enum_name(value: Any, names: dict[int, str], what: str) -> str:
    """An enum given as a number or a name, returned as its name."""
    if isinstance(value, bool):
        raise invalid(f"Invalid value for {what}: {value!r}.")
    if isinstance(value, int) and value in names:
        return names[value]
    if isinstance(value, str) and value in names.values():
        return value
    raise invalid(f"Invalid value for {what}: {value!r}.")


def check_resource_id(kind: str, value: str) -> None:
    """GCP's rule for resource ids: a lowercase letter, then [a-z0-9-], at most 63, no trailing dash."""
    if not RESOURCE_ID.match(value or ""):
        raise invalid(
            f"Invalid {kind} id {value!r}: it must be 1-63 characters, start with a lowercase letter, "
            "contain only lowercase letters, digits and dashes, and not end with a dash."
        )


def paginate(items: Sequence[T], key: Callable[[T], str], page_size: int, page_token: str) -> tuple[list[T], str]:
    """One page of ``items`` (already sorted by ``key``) and the token of the next page.

    The token names the last key returned, so pages stay consistent while items are added
    or removed between calls.
    """
    if page_size < 0:
        raise invalid("page_size must not be negative.")
    size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    remaining = list(items)
    if page_token:
        try:
            after = base64.urlsafe_b64decode(page_token.encode()).decode()
        except (binascii.Error, UnicodeDecodeError) as err:
            raise invalid(f"Invalid page token {page_token!r}.") from err
        remaining = [item for item in remaining if key(item) > after]
    page = remaining[:size]
    if len(remaining) <= size:
        return page, ""
    return page, base64.urlsafe_b64encode(key(page[-1]).encode()).decode()


def page_size_of(query: dict[str, str]) -> int:
    try:
        return int(query.get("pageSize", "0") or 0)
    except ValueError as err:
        raise invalid(f"Invalid pageSize {query.get('pageSize')!r}.") from err


@dataclass
class NodeFields:
    """What a caller chose about a node: the writable fields of ``Node``, validated (not ``runs.NodeSpec``, the
    client's frozen request, nor the API's queued-resource ``NodeSpec``, which ``nodes.QueuedNodeSpec`` mirrors)."""

    accelerator: AcceleratorType
    runtime_version: str
    description: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    scheduling_config: dict[str, bool] = field(default_factory=dict)
    network_config: dict[str, Any] | None = None
    network_configs: list[dict[str, Any]] = field(default_factory=list)
    service_account: dict[str, Any] | None = None
    data_disks: list[dict[str, Any]] = field(default_factory=list)
    shielded_instance_config: dict[str, Any] | None = None
    cidr_block: str = ""

    @property
    def capacity(self) -> str:
        """How the node is bought: ``spot``, ``preemptible`` or ``on-demand``."""
        if self.scheduling_config.get("spot"):
            return "spot"
        if self.scheduling_config.get("preemptible"):
            return "preemptible"
        return "on-demand"

    def to_json(self) -> dict[str, Any]:
        """The writable part of a Node in JSON form (as echoed in queued resource specs)."""
        out: dict[str, Any] = {
            "acceleratorType": self.accelerator.name,
            "runtimeVersion": self.runtime_version,
            "acceleratorConfig": {"type": self.accelerator.config_type, "topology": self.accelerator.topology},
        }
        optional = {
            "description": self.description,
            "labels": self.labels,
            "metadata": self.metadata,
            "tags": self.tags,
            "schedulingConfig": self.scheduling_config,
            "networkConfig": self.network_config,
            "networkConfigs": self.network_configs,
            "serviceAccount": self.service_account,
            "dataDisks": self.data_disks,
            "shieldedInstanceConfig": self.shielded_instance_config,
            "cidrBlock": self.cidr_block,
        }
        out.update({key: value for key, value in optional.items() if value})
        return out


def string_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid(f"Invalid {what}: expected a list of strings.")
    return list(value)


def string_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid(f"Invalid {what}: expected a map of strings.")
    return dict(value)


def _object(value: Any, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"Invalid {what}: expected an object.")
    return dict(value)


def _scheduling(value: Any) -> dict[str, bool]:
    config = _object(value, "schedulingConfig") or {}
    unknown = set(config) - _SCHEDULING_FIELDS
    if unknown:
        raise invalid(
            f"Invalid JSON payload received. Unknown name {sorted(unknown)[0]!r} at 'node.scheduling_config'."
        )
    return {key: bool(flag) for key, flag in config.items() if flag}


def _resolve_accelerator(body: dict[str, Any], zone: str, scheduling: dict[str, bool]) -> AcceleratorType:
    name = body.get("acceleratorType") or ""
    config = _object(body.get("acceleratorConfig"), "acceleratorConfig")
    if not name and config:
        config_type = enum_name(config.get("type", 0), ACCELERATOR_CONFIG_TYPES, "acceleratorConfig.type")
        from_config = catalog.accelerator_from_config(config_type, str(config.get("topology", "")))
        name = from_config.name if from_config else f"{config_type} {config.get('topology', '')}"
    if not name:
        raise invalid("Either accelerator_type or accelerator_config must be set.")
    return catalog.accelerator_for(
        name,
        zone,
        preemptible=bool(scheduling.get("preemptible") or scheduling.get("spot")),
        reserved=bool(scheduling.get("reserved")),
    )


def parse_node_fields(body: Any, zone: str) -> NodeFields:
    """Validate a ``Node`` request body for ``zone``.

    Raises:
        ApiError: INVALID_ARGUMENT for unknown fields, a missing runtime version, or an
            accelerator type the zone does not offer.
    """
    if not isinstance(body, dict):
        raise invalid("Invalid JSON payload received: the node must be an object.")
    unknown = set(body) - _NODE_FIELDS
    if unknown:
        raise invalid(f"Invalid JSON payload received. Unknown name {sorted(unknown)[0]!r} at 'node'.")
    runtime_version = body.get("runtimeVersion") or ""
    if not runtime_version:
        raise invalid("Field runtime_version is required.")
    catalog.check_runtime_version(runtime_version, zone)
    scheduling = _scheduling(body.get("schedulingConfig"))
    disks = []
    for raw_disk in body.get("dataDisks") or []:
        disk = dict(_object(raw_disk, "dataDisks") or {})
        if "mode" in disk:
            disk["mode"] = enum_name(disk["mode"], DISK_MODES, "dataDisks.mode")
        disks.append(disk)
    return NodeFields(
        accelerator=_resolve_accelerator(body, zone, scheduling),
        runtime_version=runtime_version,
        description=str(body.get("description") or ""),
        labels=string_map(body.get("labels"), "labels"),
        metadata=string_map(body.get("metadata"), "metadata"),
        tags=string_list(body.get("tags"), "tags"),
        scheduling_config=scheduling,
        network_config=_object(body.get("networkConfig"), "networkConfig"),
        network_configs=[dict(_object(item, "networkConfigs") or {}) for item in body.get("networkConfigs") or []],
        service_account=_object(body.get("serviceAccount"), "serviceAccount"),
        data_disks=disks,
        shielded_instance_config=_object(body.get("shieldedInstanceConfig"), "shieldedInstanceConfig"),
        cidr_block=str(body.get("cidrBlock") or ""),
    )


def parse_update_mask(mask: str) -> list[str]:
    """Field mask paths in snake_case, whether sent camelCase (JSON form) or snake_case."""
    paths = []
    for raw in mask.split(","):
        path = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), raw.strip())
        if path:
            paths.append(path)
    return paths


def require_object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid(f"Invalid JSON payload received: {what} must be an object.")
    return body
