"""The Cloud TPU provider: google-cloud-tpu (tpu_v2, REST transport) behind ``NodeProvider``.

This is the only module that touches the SDK, and the only one that speaks Cloud TPU's wire vocabulary: a
``NodeRequest`` becomes the REST body of a CreateNode (``node_body``) or of a CreateQueuedResource
(``queued_body``), capacity becomes ``schedulingConfig`` and back (``_capacity_of``), the v2 states map onto the
neutral ``NodeState`` (``_V2_STATES``). It owns three conversions, each done once:
API nodes become ``NodeInfo`` with the neutral ``NodeState`` enum; google-api-core exceptions
become the taxonomy of ``tpuops.core.errors``; long-running operations become ``Operation``
snapshots (``tpuops.providers.base.wait_for`` waits on any provider's). Every call goes through the
one retry policy, so a 503 storm is retried and a 400 is not. The same code drives real Cloud TPU
(Application Default Credentials) and the emulator (an ``http://`` endpoint with the emulator's
bearer token, given by the caller, or anonymous credentials when there is none: ``--no-auth``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar

from tpuops.core import acting
from tpuops.core.clock import UTC
from tpuops.core.errors import (
    AlreadyExists,
    CapacityError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    QuotaError,
    TpuopsError,
    TransientError,
    Unreachable,
)
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.core.retry import call_with_retry
from tpuops.providers.base import Connection
from tpuops.providers.cloud_tpu.offers import CloudTpuRules
from tpuops.providers.commands import WorkerRan, command_line, run_here
from tpuops.providers.nodes import NodeInfo, NodeRequest, NodeState, Operation, QueuedInfo

CALL_TIMEOUT_S = 30.0
"""The longest one HTTP call may take (the client's own default is none: a server that accepts and never
answers would hold a command forever); the retry policy's deadline (``api_deadline_s``) bounds the retries."""


_V2_STATES: dict[str, NodeState] = {
    "STATE_UNSPECIFIED": NodeState.UNSPECIFIED, "CREATING": NodeState.CREATING, "READY": NodeState.READY,
    "RESTARTING": NodeState.RESTARTING, "REIMAGING": NodeState.RESTARTING, "DELETING": NodeState.DELETING,
    "REPAIRING": NodeState.REPAIRING, "STOPPED": NodeState.STOPPED, "STOPPING": NodeState.STOPPING,
    "STARTING": NodeState.STARTING, "UNHIDING": NodeState.STARTING, "PREEMPTED": NodeState.PREEMPTED,
    "TERMINATED": NodeState.TERMINATED,
}
"""The Cloud TPU v2 node states onto the neutral ones: a reimage restarts the VM, an unhide starts it; any other
(HIDING, HIDDEN, UNKNOWN, one added later) is UNKNOWN, which the controller waits on."""


def node_body(request: NodeRequest) -> dict[str, Any]:
    """Exactly the Cloud TPU REST body of ``request``'s CreateNode (the node id goes in the URL)."""
    # cloud-platform scope: the VM's own account reads the bucket and may delete its node.
    account: dict[str, Any] = {"scope": ["https://www.googleapis.com/auth/cloud-platform"]}
    if request.service_account:
        account["email"] = request.service_account
    scheduling: dict[str, bool] = {}
    if request.capacity is Capacity.SPOT:
        scheduling["spot"] = True
    elif request.capacity is Capacity.PREEMPTIBLE:
        scheduling["preemptible"] = True
    return {
        "description": request.description,
        "acceleratorType": request.accelerator,
        "runtimeVersion": request.runtime,
        "schedulingConfig": scheduling,
        "labels": dict(request.labels),
        "metadata": dict(request.metadata),
        "serviceAccount": account,
    }


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
        state=_V2_STATES.get(node.state.name, NodeState.UNKNOWN), health=node.health.name if node.health else "",
        labels=dict(node.labels), create_time=create_time, uid=str(node.id or ""),
        hosts=max(1, len(node.network_endpoints)),
        unhealthy_workers=tuple(sorted({int(s.worker_id) for s in node.symptoms if s.worker_id.isdigit()})),
    )


# google.rpc.Code values that an operation's error may carry, onto the taxonomy.
_TRANSIENT_CODES = {4, 13, 14}  # DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE
_PERMISSION_CODES = {7, 16}  # PERMISSION_DENIED, UNAUTHENTICATED


def _aware(value: Any) -> datetime | None:
    """A timestamp of the API as an aware datetime; None when unset (the epoch) or missing."""
    if not isinstance(value, datetime) or value.timestamp() <= 0:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _metadata(raw: Any) -> Any:
    """An operation's ``OperationMetadata`` (createTime, endTime) unpacked from its Any; None if it has none."""
    from google.api_core import protobuf_helpers
    from google.cloud import tpu_v2

    if not raw.HasField("metadata") or not raw.metadata.type_url.endswith("OperationMetadata"):
        return None
    return protobuf_helpers.from_any_pb(tpu_v2.OperationMetadata, raw.metadata)


def _operation(raw: Any, zone: str, metadata: Any = None) -> Operation:
    """A ``google.longrunning.Operation`` as our snapshot; ``metadata`` when the caller has it unpacked."""
    meta = metadata if metadata is not None else _metadata(raw)
    error = None
    if raw.done and raw.HasField("error") and raw.error.code != 0:
        error = operation_error(raw.error.code, raw.error.message, zone)
    return Operation(name=raw.name, zone=zone, done=raw.done, target=getattr(meta, "target", ""),
                     started=_aware(getattr(meta, "create_time", None)), ended=_aware(getattr(meta, "end_time", None)),
                     error=error, verb=getattr(meta, "verb", ""))


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


def _emulator_credentials(token: str | None) -> Any:
    """The local emulator's bearer token as OAuth credentials; anonymous when it needs none."""
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


class TpuApi(CloudTpuRules):
    """Typed Cloud TPU calls for one project (a ``NodeProvider``, ``StartsNodes``, ``QueuesNodes``,
    ``ListsOperations`` and ``RunsCommands``); safe to share between threads. ``token``: the emulator's bearer
    token, for an ``http://`` endpoint."""

    talks_to_emulator: ClassVar[bool] = True
    """With provider ``local`` it calls the local Cloud TPU emulator, which is started for it if needed."""

    def __init__(
        self,
        project: str,
        *,
        endpoint: str | None = None,
        deadline_s: float = 120.0,
        poll_interval_s: float = 5.0,
        page_size: int = 1000,
        token: str | None = None,
    ) -> None:
        self.project, self.endpoint, self.token = project, endpoint, token
        self.deadline_s, self.poll_interval_s, self.page_size = deadline_s, poll_interval_s, page_size
        self.call_timeout_s = min(deadline_s, CALL_TIMEOUT_S)
        self.calls = CallCounter()
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._unreachable = False
        """Set when a call found nothing answering, cleared by any answer: later calls try once, not for seconds."""

    @classmethod
    def connect(cls, connection: Connection) -> TpuApi:
        return cls(connection.project, endpoint=connection.endpoint, token=connection.token,
                   deadline_s=connection.deadline_s, poll_interval_s=connection.poll_interval_s)

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
                kwargs["credentials"] = _emulator_credentials(self.token)
        try:
            return tpu_v2.TpuClient(**kwargs)
        except Exception as err:  # google.auth raises DefaultCredentialsError when ADC is missing
            if type(err).__name__ == "DefaultCredentialsError":
                raise PermissionDenied("no Google credentials found: run 'gcloud auth application-default "
                                       "login' or set GOOGLE_APPLICATION_CREDENTIALS") from err
            raise

    def _call(self, rpc: str, fn: Callable[[], Any], *, zone: str | None = None, changes: bool = False) -> Any:
        def attempt() -> Any:
            if changes:  # each try of a call that changes the cloud, as it goes out (tpuops.core.acting)
                acting.check(rpc)
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
        return location(self.project, zone)

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
                pager = method(request=req, timeout=self.call_timeout_s)  # attributes: those of the first page
                return list(getattr(pager, field_name)), pager.next_page_token

            items, token = self._call(rpc, one_page, zone=zone)
            yield from (convert(item) for item in items)
            if not token:
                return

    def get_node(self, zone: str, name: str) -> NodeInfo:
        """The node, or ``NotFound``."""
        node = self._call("GetNode", lambda: self.client.get_node(name=self.node_path(zone, name),
                                                                        timeout=self.call_timeout_s), zone=zone)
        return _node_info(node)

    def find_node(self, zone: str, name: str) -> NodeInfo | None:
        try:
            return self.get_node(zone, name)
        except NotFound:
            return None

    def create_node(self, zone: str, request: NodeRequest) -> Operation:
        """Start creating a node; ``AlreadyExists`` if the id is taken."""
        from google.cloud import tpu_v2

        body = node_body(request)
        if self.endpoint:
            # The node's dead-man's switch deletes it through this same API (templates/startup.sh.j2).
            body["metadata"][MetadataKey.TPU_API.value] = self.endpoint
        node = tpu_v2.Node.from_json(json.dumps(body))
        return self._started("CreateNode", zone, lambda: self.client.create_node(
            parent=self.parent(zone), node_id=request.name, node=node, timeout=self.call_timeout_s))

    def delete_node(self, zone: str, name: str) -> Operation | None:
        """Start deleting; None when the node does not exist (success)."""
        try:
            return self._started("DeleteNode", zone, lambda: self.client.delete_node(
                name=self.node_path(zone, name), timeout=self.call_timeout_s))
        except NotFound:
            return None

    def stop_node(self, zone: str, name: str) -> Operation:
        from google.cloud import tpu_v2

        return self._started("StopNode", zone, lambda: self.client.stop_node(
            request=tpu_v2.StopNodeRequest(name=self.node_path(zone, name)), timeout=self.call_timeout_s))

    def start_node(self, zone: str, name: str) -> Operation:
        from google.cloud import tpu_v2

        return self._started("StartNode", zone, lambda: self.client.start_node(
            request=tpu_v2.StartNodeRequest(name=self.node_path(zone, name)), timeout=self.call_timeout_s))

    def _started(self, rpc: str, zone: str, call: Callable[[], Any]) -> Operation:
        """One call that starts a long-running operation, as our snapshot of the operation it returned."""
        started = self._call(rpc, call, zone=zone, changes=True)
        return _operation(started.operation, zone, started.metadata)

    def operation(self, zone: str, name: str) -> Operation:
        """Where an operation stands (one GetOperation, never blocking).

        The controller keeps a create's operation name across passes and asks once per pass, so
        a stockout is noticed without anyone waiting on it. An error inside the operation is
        classified like the same error raised by a call, except that RESOURCE_EXHAUSTED there is
        a stockout (``CapacityError``) unless it names a quota, not a rate limit.
        """
        answer = self._call("GetOperation", lambda: self.client.get_operation({"name": name},
                                                                             timeout=self.call_timeout_s), zone=zone)
        return _operation(answer, zone)

    def node_operations(self, zone: str, name: str) -> list[Operation]:
        """The operations of ``zone`` that act on the node ``name`` (``ListsOperations``): ListOperations, every
        page, one counted call each. Cloud TPU keeps them whoever asked (the node's own self-delete too)."""
        target = self.node_path(zone, name)
        found: list[Operation] = []
        token = ""
        while True:
            request = {"name": self.parent(zone), "page_token": token, "page_size": self.page_size}

            def one_page(req: dict[str, Any] = request) -> Any:
                return self.client.list_operations(request=req, timeout=self.call_timeout_s)

            answer = self._call("ListOperations", one_page, zone=zone)
            found.extend(op for op in (_operation(raw, zone) for raw in answer.operations) if op.target == target)
            token = answer.next_page_token
            if not token:
                return found

    def list_accelerator_types(self, zone: str) -> list[str]:
        return sorted(self._pages("ListAcceleratorTypes", zone, self.client.list_accelerator_types,
                                  "accelerator_types", lambda item: item.type_))

    def list_runtime_versions(self, zone: str) -> list[str]:
        return sorted(self._pages("ListRuntimeVersions", zone, self.client.list_runtime_versions,
                                  "runtime_versions", lambda item: item.version))

    @classmethod
    def create_body(cls, project: str, zone: str, request: NodeRequest) -> dict[str, Any]:
        """What ``create_node`` sends (the REST body of its CreateNode), with no connection (a dry run)."""
        return node_body(request)

    # -- queued resources ---------------------------------------------------------------------

    @classmethod
    def queued_body(cls, project: str, zone: str, request: NodeRequest, *,
                    valid_until_s: float | None) -> dict[str, Any]:
        """The REST body of a CreateQueuedResource for one node (spot tier when the node is spot).

        A class method: ``up --queued --dry-run`` shows it without an endpoint or credentials.
        """
        node = node_body(request)
        node.pop("schedulingConfig")
        body: dict[str, Any] = {"tpu": {"nodeSpec": [{"parent": location(project, zone), "nodeId": request.name,
                                                       "node": node}]}}
        if request.capacity is Capacity.SPOT:
            body["spot"] = {}
        if valid_until_s:
            body["queueingPolicy"] = {"validUntilDuration": f"{int(valid_until_s)}s"}
        return body

    def create_queued_resource(self, zone: str, qr_id: str, request: NodeRequest, *,
                               valid_until_s: float | None = None) -> Operation:
        """Queue a node; returns the operation (done once the request is accepted)."""
        from google.cloud import tpu_v2

        resource = tpu_v2.QueuedResource.from_json(json.dumps(self.queued_body(self.project, zone, request,
                                                                               valid_until_s=valid_until_s)))
        return self._started("CreateQueuedResource", zone, lambda: self.client.create_queued_resource(
            parent=self.parent(zone), queued_resource_id=qr_id, queued_resource=resource,
            timeout=self.call_timeout_s))

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedInfo:
        resource = self._call("GetQueuedResource", lambda: self.client.get_queued_resource(
            name=f"{self.parent(zone)}/queuedResources/{qr_id}", timeout=self.call_timeout_s), zone=zone)
        return _queued_info(resource)

    def list_queued_resources(self, zone: str) -> list[QueuedInfo]:
        return list(self._pages("ListQueuedResources", zone, self.client.list_queued_resources,
                                "queued_resources", _queued_info))

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool = False) -> Operation | None:
        """Start deleting (``force`` also deletes its nodes); None when it does not exist."""
        from google.cloud import tpu_v2

        request = tpu_v2.DeleteQueuedResourceRequest(name=f"{self.parent(zone)}/queuedResources/{qr_id}",
                                                     force=force)
        try:
            return self._started("DeleteQueuedResource", zone,
                                 lambda: self.client.delete_queued_resource(
                                     request=request, timeout=self.call_timeout_s))
        except NotFound:
            return None

    def run_on_worker(self, zone: str, node: str, worker: int, argv: Sequence[str], *,
                      timeout_s: float) -> WorkerRan:
        """``RunsCommands`` (``tpuops.providers.commands``): ``argv`` on one worker through ``ssh_argv``.

        gcloud answers with the remote command's exit status, or 255 when ssh itself failed.
        """
        env = None
        if self.endpoint:  # gcloud finds the node through the same endpoint as this provider
            env = {**os.environ, "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": self.endpoint.rstrip("/") + "/"}
        return run_here(worker, ssh_argv(self.project, zone, node, worker, argv), env=env, timeout_s=timeout_s)


def ssh_argv(project: str, zone: str, node: str, worker: int, argv: Sequence[str]) -> list[str]:
    """``gcloud compute tpus tpu-vm ssh`` running ``argv`` on one worker: ssh hands ``--command`` to the worker's
    login shell, the one shell that parses it, so the arguments are quoted once for it (``command_line``)."""
    return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", node, f"--zone={zone}", f"--project={project}",
            f"--worker={worker}", f"--command={command_line(argv)}"]


def location(project: str, zone: str) -> str:
    """The resource name of ``zone`` in ``project``: the parent of its nodes and queued resources."""
    return f"projects/{project}/locations/{zone}"


def _queued_info(resource: Any) -> QueuedInfo:
    parts = resource.name.split("/")
    state = resource.state.state.name if resource.state else "STATE_UNSPECIFIED"
    return QueuedInfo(name=parts[-1], zone=parts[3], state=state,
                      node_ids=[spec.node_id for spec in resource.tpu.node_spec],
                      spot="spot" in resource)
