"""The Cloud TPU adapter: google-cloud-tpu (tpu_v2, REST transport) behind typed calls.

This is the only module that touches the SDK. It owns three conversions, each done once:
API nodes become ``NodeInfo`` with our own ``NodeState`` enum; google-api-core exceptions
become the taxonomy of ``tpuops.errors``; long-running operations become a bounded wait.
Every call goes through the one retry policy, so a 503 storm is retried and a 400 is not.
The same code drives real Cloud TPU (Application Default Credentials) and the emulator
(an ``http://`` endpoint with the emulator's bearer token, or anonymous credentials when it
runs with ``--no-auth``).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from tpuops.errors import (
    AlreadyExists,
    CapacityError,
    CreateResult,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    QuotaError,
    Timeout,
    TpuopsError,
    TransientError,
    Unreachable,
)
from tpuops.kinds import Capacity
from tpuops.retry import call_with_retry

UTC = timezone.utc  # datetime.UTC exists from Python 3.11 only

CLOSE_POLL_S = 0.02
"""The shortest pause between two polls of an operation that someone waits on closely (``TpuApi.wait``)."""

MANAGED_LABEL = "managed-by"
MANAGED_VALUE = "tpuops"


class NodeState(str, Enum):
    """Node states of the v2 API, plus GONE for a node that no longer exists."""

    UNSPECIFIED = "STATE_UNSPECIFIED"
    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REIMAGING = "REIMAGING"
    DELETING = "DELETING"
    REPAIRING = "REPAIRING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    UNKNOWN = "UNKNOWN"
    GONE = "GONE"

    @property
    def is_dead(self) -> bool:
        """A node in this state will never run work again: delete and recreate it."""
        return self in (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.GONE)


@dataclass(frozen=True)
class NodeInfo:
    """What we know of one node, independent of the SDK's types."""

    name: str
    zone: str
    project: str
    accelerator: str
    runtime: str
    capacity: Capacity
    state: NodeState
    health: str
    labels: dict[str, str]
    create_time: datetime | None
    uid: str = ""

    @property
    def managed(self) -> bool:
        return self.labels.get(MANAGED_LABEL) == MANAGED_VALUE

    def age_s(self, now: datetime | None = None) -> float | None:
        if self.create_time is None:
            return None
        return ((now or datetime.now(UTC)) - self.create_time).total_seconds()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "zone": self.zone, "project": self.project,
            "accelerator": self.accelerator, "runtime": self.runtime, "capacity": self.capacity.value,
            "state": self.state.value, "health": self.health, "labels": self.labels,
            "create_time": self.create_time.isoformat() if self.create_time else None,
            "managed": self.managed, "uid": self.uid,
        }


@dataclass(frozen=True)
class NodeRequest:
    """A node to create; ``body()`` is exactly the REST body sent to CreateNode."""

    name: str
    accelerator: str
    runtime: str
    capacity: Capacity
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    description: str = "created by tpuops"
    service_account: str | None = None
    """The VM's account email; None leaves the project's default compute account."""

    def body(self) -> dict[str, Any]:
        # cloud-platform scope: the VM's own account reads the bucket and may delete its node.
        account: dict[str, Any] = {"scope": ["https://www.googleapis.com/auth/cloud-platform"]}
        if self.service_account:
            account["email"] = self.service_account
        scheduling: dict[str, bool] = {}
        if self.capacity is Capacity.SPOT:
            scheduling["spot"] = True
        elif self.capacity is Capacity.PREEMPTIBLE:
            scheduling["preemptible"] = True
        return {
            "description": self.description,
            "acceleratorType": self.accelerator,
            "runtimeVersion": self.runtime,
            "schedulingConfig": scheduling,
            "labels": dict(self.labels),
            "metadata": dict(self.metadata),
            "serviceAccount": account,
        }

    def matches(self, node: NodeInfo) -> bool:
        """Whether an existing node is this request already made (so it may be adopted)."""
        return (node.managed and node.accelerator == self.accelerator and node.runtime == self.runtime
                and node.capacity is self.capacity)


def _capacity_of(scheduling: Any) -> Capacity:
    if getattr(scheduling, "spot", False):
        return Capacity.SPOT
    if getattr(scheduling, "preemptible", False):
        return Capacity.PREEMPTIBLE
    return Capacity.ON_DEMAND


def _node_info(node: Any) -> NodeInfo:
    _, project, _, zone, _, name = node.name.split("/")
    created = node.create_time
    create_time = None
    if created and created.timestamp() > 0:
        create_time = datetime.fromtimestamp(created.timestamp(), UTC)
    return NodeInfo(
        name=name, zone=zone, project=project, accelerator=node.accelerator_type,
        runtime=node.runtime_version, capacity=_capacity_of(node.scheduling_config),
        state=NodeState(node.state.name), health=node.health.name if node.health else "",
        labels=dict(node.labels), create_time=create_time, uid=str(node.id or ""),
    )


# google.rpc.Code values that an operation's error may carry, onto the taxonomy.
_TRANSIENT_CODES = {4, 13, 14}  # DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE
_PERMISSION_CODES = {7, 16}  # PERMISSION_DENIED, UNAUTHENTICATED


def operation_times(operation: Any) -> tuple[datetime | None, datetime | None]:
    """When the API says a long-running operation started and ended (its metadata's createTime and endTime).

    None for a time the operation does not carry (not ended yet, or no metadata at all).
    """
    metadata = getattr(operation, "metadata", None)

    def aware(field_name: str) -> datetime | None:
        value = getattr(metadata, field_name, None) if metadata is not None else None
        if not isinstance(value, datetime) or value.timestamp() <= 0:
            return None
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

    return aware("create_time"), aware("end_time")


def operation_error(code: int, message: str, zone: str | None = None) -> TpuopsError:
    """The taxonomy's class for an error that ended a long-running operation (a google.rpc.Code)."""
    if code == 8:  # RESOURCE_EXHAUSTED inside an operation: a stockout, or a quota
        return QuotaError(message) if "quota" in message.lower() else CapacityError(message, zone=zone)
    if code in _TRANSIENT_CODES:
        return TransientError(message)
    if code in _PERMISSION_CODES:
        return PermissionDenied(message)
    if code == 5:
        return NotFound(message)
    if code == 6:
        return AlreadyExists(message)
    return InvalidRequest(message)


def _emulator_credentials(endpoint: str, token: str | None) -> Any:
    """The local emulator's bearer token as OAuth credentials; anonymous when it needs none."""
    from tpuops.emulator.control import token_for

    token = token or token_for(endpoint)
    if token is None:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    from google.oauth2.credentials import Credentials

    return Credentials(token)


def _unreachable(err: Exception) -> Unreachable:
    """One line naming the endpoint tried and why nothing answered, without the request's URL and query."""
    from urllib.parse import urlsplit

    request = getattr(err, "request", None)
    where = urlsplit(getattr(request, "url", "") or "").netloc or "its endpoint"
    causes: list[BaseException] = []
    cause: Any = err
    while cause is not None and len(causes) < 10:
        causes.append(cause)
        cause = getattr(cause, "reason", None) or cause.__context__
    reason = "nothing answers"
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        reason = "connection refused: nothing listens there"
    elif any(isinstance(c, socket.gaierror) for c in causes):
        reason = "unknown host"
    return Unreachable(f"cannot reach the Cloud TPU API at {where} ({reason}); check tpu_endpoint in tpuops.toml, "
                       "or start the local emulator with 'tpuops emulator start'")


def _translate(err: Exception, *, in_operation: bool = False, zone: str | None = None) -> TpuopsError:
    """Map an SDK or transport error onto the taxonomy; parents, never transport-specific leaves."""
    from google.api_core import exceptions as gexc
    from requests import exceptions as rexc

    # google-api-core's REST errors begin "GET https://...?$alt=json;enum-encoding=int: ": the request, not the news.
    message = re.sub(r"^[A-Z]+ \S+://\S+: ", "", getattr(err, "message", None) or str(err))
    from google.auth import exceptions as aexc

    if isinstance(err, rexc.ConnectionError) and not isinstance(err, rexc.Timeout):
        return _unreachable(err)
    if isinstance(err, rexc.RequestException):
        return TransientError(f"the connection to the Cloud TPU API failed: {type(err).__name__}")
    if isinstance(err, aexc.GoogleAuthError):
        return PermissionDenied(f"the Cloud TPU API refused the credentials (HTTP 401): {err}")
    if isinstance(err, gexc.TooManyRequests):
        if not in_operation:
            return TransientError(f"the Cloud TPU API is rate limiting requests: {message}")
        if "quota" in message.lower():
            return QuotaError(message)
        return CapacityError(message, zone=zone)
    if isinstance(err, gexc.Conflict):
        return AlreadyExists(message)
    if isinstance(err, gexc.NotFound):
        return NotFound(message)
    if isinstance(err, gexc.Forbidden | gexc.Unauthorized):
        return PermissionDenied(message)
    if isinstance(err, gexc.ClientError):
        return InvalidRequest(message)
    if isinstance(err, gexc.ServerError | gexc.RetryError):
        return TransientError(f"the Cloud TPU API failed: {message}")
    if isinstance(err, TpuopsError):
        return err
    raise err


class CallCounter:
    """Counts API calls by RPC name; the benchmark reads it, tests assert on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def add(self, rpc: str) -> None:
        with self._lock:
            self.counts[rpc] = self.counts.get(rpc, 0) + 1


class TpuApi:
    """Typed Cloud TPU calls for one project; safe to share between threads."""

    def __init__(
        self,
        project: str,
        *,
        endpoint: str | None = None,
        deadline_s: float = 120.0,
        poll_interval_s: float = 5.0,
        page_size: int = 1000,
        client: Any = None,
        token: str | None = None,
    ) -> None:
        self.project = project
        self.endpoint = endpoint
        self.token = token
        self.deadline_s = deadline_s
        self.poll_interval_s = poll_interval_s
        self.page_size = page_size
        self.calls = CallCounter()
        self._client = client
        self._client_lock = threading.Lock()
        self._unreachable = False
        """Set when a call found nothing answering, cleared by any answer: later calls try once, not for seconds."""

    @property
    def client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> Any:
        from google.cloud import tpu_v2

        kwargs: dict[str, Any] = {"transport": "rest"}
        if self.endpoint:
            kwargs["client_options"] = {"api_endpoint": self.endpoint}
            if self.endpoint.startswith("http://"):
                kwargs["credentials"] = _emulator_credentials(self.endpoint, self.token)
        try:
            return tpu_v2.TpuClient(**kwargs)
        except Exception as err:  # google.auth raises DefaultCredentialsError when ADC is missing
            if type(err).__name__ == "DefaultCredentialsError":
                raise PermissionDenied("no Google credentials found: run 'gcloud auth application-default "
                                       "login' or set GOOGLE_APPLICATION_CREDENTIALS") from err
            raise

    def _call(self, rpc: str, fn: Callable[[], Any], *, zone: str | None = None) -> Any:
        def attempt() -> Any:
            self.calls.add(rpc)
            try:
                answer = fn()
            except Exception as err:
                translated = _translate(err, zone=zone)
                self._unreachable = isinstance(translated, Unreachable)
                raise translated from err
            self._unreachable = False
            return answer

        return call_with_retry(attempt, deadline_s=0.0 if self._unreachable else self.deadline_s)

    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def node_path(self, zone: str, name: str) -> str:
        return f"{self.parent(zone)}/nodes/{name}"

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        """Every node in ``zone``, all pages; one ListNodes call per page."""
        return list(self._pages("ListNodes", zone, self.client.list_nodes, "nodes", _node_info))

    def _pages(self, rpc: str, zone: str, method: Callable[..., Any], field_name: str,
               convert: Callable[[Any], Any]) -> Iterator[Any]:
        """Walk pages ourselves, so that every page is one counted call under the retry policy."""
        token = ""
        while True:
            request = {"parent": self.parent(zone), "page_token": token, "page_size": self.page_size}

            def one_page(req: dict[str, Any] = request) -> tuple[list[Any], str]:
                pager = method(request=req)  # the pager's attributes are those of the first page
                return list(getattr(pager, field_name)), pager.next_page_token

            items, token = self._call(rpc, one_page, zone=zone)
            yield from (convert(item) for item in items)
            if not token:
                return

    def get_node(self, zone: str, name: str) -> NodeInfo:
        """The node, or ``NotFound``."""
        node = self._call("GetNode", lambda: self.client.get_node(name=self.node_path(zone, name)), zone=zone)
        return _node_info(node)

    def find_node(self, zone: str, name: str) -> NodeInfo | None:
        try:
            return self.get_node(zone, name)
        except NotFound:
            return None

    def create_node(self, zone: str, request: NodeRequest) -> Any:
        """Start creating a node; returns the operation. ``AlreadyExists`` if the id is taken."""
        from google.cloud import tpu_v2

        body = request.body()
        if self.endpoint:
            # The node's dead-man's switch deletes it through this same API (templates/startup.sh.j2).
            body["metadata"]["tpuops-tpu-api"] = self.endpoint
        node = tpu_v2.Node.from_json(json.dumps(body))
        return self._call("CreateNode", lambda: self.client.create_node(
            parent=self.parent(zone), node_id=request.name, node=node), zone=zone)

    def delete_node(self, zone: str, name: str) -> Any | None:
        """Start deleting; returns the operation, or None when the node does not exist (success)."""
        try:
            return self._call("DeleteNode", lambda: self.client.delete_node(name=self.node_path(zone, name)),
                              zone=zone)
        except NotFound:
            return None

    def stop_node(self, zone: str, name: str) -> Any:
        from google.cloud import tpu_v2

        return self._call("StopNode", lambda: self.client.stop_node(
            request=tpu_v2.StopNodeRequest(name=self.node_path(zone, name))), zone=zone)

    def start_node(self, zone: str, name: str) -> Any:
        from google.cloud import tpu_v2

        return self._call("StartNode", lambda: self.client.start_node(
            request=tpu_v2.StartNodeRequest(name=self.node_path(zone, name))), zone=zone)

    def wait(
        self,
        operation: Any,
        *,
        zone: str,
        timeout_s: float,
        on_poll: Callable[[], None] | None = None,
        closely: bool = False,
    ) -> Any:
        """Poll ``operation`` until done; return its response or raise its error, translated.

        ``on_poll`` runs between polls (the CLI uses it to show the node's state). An error
        inside the operation is classified as an operation error: RESOURCE_EXHAUSTED there
        is a stockout (``CapacityError``) or a quota (``QuotaError``), not a rate limit.
        ``closely`` is for a caller with its next request ready (a replacement's create after a
        delete): polls follow each other ``CLOSE_POLL_S`` apart, spaced out to 2 % of the time
        waited so far (at most ``poll_interval_s``), so that the next request goes out within
        about one round trip of the completion without a long operation costing hundreds of polls.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        while not self._call("GetOperation", operation.done, zone=zone):
            now = time.monotonic()
            if now >= deadline:
                raise Timeout(f"operation {operation.operation.name} did not finish within {timeout_s:.0f} s")
            if on_poll is not None:
                on_poll()
            pause = max(CLOSE_POLL_S, (now - started) / 50) if closely else self.poll_interval_s
            time.sleep(min(pause, self.poll_interval_s))
        try:
            return operation.result(timeout=0)
        except Exception as err:
            raise _translate(err, in_operation=True, zone=zone) from err

    def refresh(self, operation: Any, *, zone: str) -> None:
        """Bring ``operation`` up to date (one GetOperation, none once it is done)."""
        self._call("GetOperation", operation.done, zone=zone)

    def operation_result(self, zone: str, name: str) -> tuple[CreateResult, str]:
        """Where a create operation stands, without blocking: its ``CreateResult`` and the error's message.

        The controller keeps the operation's name across passes and asks once per pass, so a
        stockout is noticed without anyone waiting on the operation. An error inside the
        operation is classified like the same error raised by a call: UNAVAILABLE, INTERNAL or
        DEADLINE_EXCEEDED is transient (RETRY), RESOURCE_EXHAUSTED a stockout unless it names a quota.
        """
        operation = self._call("GetOperation", lambda: self.client.get_operation({"name": name}), zone=zone)
        if not operation.done:
            return CreateResult.RUNNING, ""
        if not operation.HasField("error") or operation.error.code == 0:
            return CreateResult.OK, ""
        error = operation_error(operation.error.code, operation.error.message, zone)
        return CreateResult.of(error), operation.error.message

    def list_accelerator_types(self, zone: str) -> list[str]:
        return sorted(self._pages("ListAcceleratorTypes", zone, self.client.list_accelerator_types,
                                  "accelerator_types", lambda item: item.type_))

    def list_runtime_versions(self, zone: str) -> list[str]:
        return sorted(self._pages("ListRuntimeVersions", zone, self.client.list_runtime_versions,
                                  "runtime_versions", lambda item: item.version))

    # -- queued resources ---------------------------------------------------------------------

    def queued_body(self, zone: str, request: NodeRequest, *, valid_until_s: float | None) -> dict[str, Any]:
        """The REST body of a CreateQueuedResource for one node (spot tier when the node is spot)."""
        node = request.body()
        node.pop("schedulingConfig")
        body: dict[str, Any] = {"tpu": {"nodeSpec": [{"parent": self.parent(zone), "nodeId": request.name,
                                                       "node": node}]}}
        if request.capacity is Capacity.SPOT:
            body["spot"] = {}
        if valid_until_s:
            body["queueingPolicy"] = {"validUntilDuration": f"{int(valid_until_s)}s"}
        return body

    def create_queued_resource(self, zone: str, qr_id: str, request: NodeRequest, *,
                               valid_until_s: float | None = None) -> Any:
        """Queue a node; returns the operation (done once the request is accepted)."""
        from google.cloud import tpu_v2

        resource = tpu_v2.QueuedResource.from_json(json.dumps(self.queued_body(zone, request,
                                                                               valid_until_s=valid_until_s)))
        return self._call("CreateQueuedResource", lambda: self.client.create_queued_resource(
            parent=self.parent(zone), queued_resource_id=qr_id, queued_resource=resource), zone=zone)

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedInfo:
        resource = self._call("GetQueuedResource", lambda: self.client.get_queued_resource(
            name=f"{self.parent(zone)}/queuedResources/{qr_id}"), zone=zone)
        return _queued_info(resource)

    def list_queued_resources(self, zone: str) -> list[QueuedInfo]:
        return list(self._pages("ListQueuedResources", zone, self.client.list_queued_resources,
                                "queued_resources", _queued_info))

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool = False) -> Any | None:
        """Start deleting (``force`` also deletes its nodes); None when it does not exist."""
        from google.cloud import tpu_v2

        request = tpu_v2.DeleteQueuedResourceRequest(name=f"{self.parent(zone)}/queuedResources/{qr_id}",
                                                     force=force)
        try:
            return self._call("DeleteQueuedResource",
                              lambda: self.client.delete_queued_resource(request=request), zone=zone)
        except NotFound:
            return None


@dataclass(frozen=True)
class QueuedInfo:
    """A queued resource: its id, zone, state (ACCEPTED, ACTIVE, FAILED, SUSPENDED, ...) and node ids."""

    name: str
    zone: str
    state: str
    node_ids: list[str]
    spot: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "zone": self.zone, "state": self.state, "node_ids": self.node_ids,
                "spot": self.spot}


def _queued_info(resource: Any) -> QueuedInfo:
    parts = resource.name.split("/")
    state = resource.state.state.name if resource.state else "STATE_UNSPECIFIED"
    return QueuedInfo(name=parts[-1], zone=parts[3], state=state,
                      node_ids=[spec.node_id for spec in resource.tpu.node_spec],
                      spot="spot" in resource)
