"""Long-running operations (``google.longrunning.Operation``) as the v2 API returns them.

An operation is created by a mutating RPC, finished exactly once by the lifecycle (with a
response snapshot or an error) and then never changes. The metadata is a
``google.cloud.tpu.v2.OperationMetadata``; a done operation carries ``response`` (an Any
with an ``@type`` the client can resolve) or ``error`` (a ``google.rpc.Status``).

Not thread-safe on its own: the emulator's state lock guards every call.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from tpuops.emulator.apierror import ApiError, not_found
from tpuops.emulator.cloud.wire import rfc3339

TYPE_PREFIX = "type.googleapis.com/"
METADATA_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.OperationMetadata"
NODE_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.Node"
QUEUED_RESOURCE_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.QueuedResource"
EMPTY_TYPE = TYPE_PREFIX + "google.protobuf.Empty"


@dataclass
class LongRunningOperation:
    """One operation; ``response`` already carries its ``@type``."""

    name: str
    project: str
    zone: str
    target: str
    verb: str
    create_time: float
    end_time: float | None = None
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    cancel_requested: bool = False

    @property
    def done(self) -> bool:
        return self.end_time is not None

    def to_json(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "@type": METADATA_TYPE,
            "createTime": rfc3339(self.create_time),
            "target": self.target,
            "verb": self.verb,
            "apiVersion": "v2",
        }
        if self.end_time is not None:
            metadata["endTime"] = rfc3339(self.end_time)
        if self.cancel_requested:
            metadata["cancelRequested"] = True
        out: dict[str, Any] = {"name": self.name, "metadata": metadata, "done": self.done}
        if self.response is not None:
            out["response"] = self.response
        if self.error is not None:
            out["error"] = self.error
        return out


class OperationStore:
    """All operations by name, in creation order."""

    def __init__(self) -> None:
        self._ops: dict[str, LongRunningOperation] = {}
        self._counter = itertools.count(1)

    def start(self, project: str, zone: str, target: str, verb: str) -> LongRunningOperation:
        now = time.time()
        op_id = f"operation-{int(now * 1000)}-{next(self._counter):08x}"
        op = LongRunningOperation(
            name=f"projects/{project}/locations/{zone}/operations/{op_id}",
            project=project,
            zone=zone,
            target=target,
            verb=verb,
            create_time=now,
        )
        self._ops[op.name] = op
        return op

    @staticmethod
    def succeed(op: LongRunningOperation, type_url: str, payload: dict[str, Any] | None = None) -> None:
        """Finish ``op`` with a response of ``type_url`` (no-op if already done)."""
        if not op.done:
            op.response = {"@type": type_url, **(payload or {})}
            op.end_time = time.time()

    @staticmethod
    def fail(op: LongRunningOperation, error: ApiError) -> None:
        """Finish ``op`` with ``error`` (no-op if already done)."""
        if not op.done:
            op.error = error.rpc_status()
            op.end_time = time.time()

    def get(self, name: str) -> LongRunningOperation:
        op = self._ops.get(name)
        if op is None:
            raise not_found(f"Operation {name!r}")
        return op

    def list(self, project: str, zone: str) -> list[LongRunningOperation]:
        """Operations of one zone (``-`` for all zones), sorted by name."""
        return sorted(
            (op for op in self._ops.values() if op.project == project and zone in ("-", op.zone)),
            key=lambda op: op.name,
        )

    def delete(self, name: str) -> None:
        self.get(name)
        del self._ops[name]

    def cancel(self, name: str) -> None:
        """Record the request; like most Cloud TPU operations, the work itself is not undone."""
        self.get(name).cancel_requested = True
