"""What the controller remembers of a run: ``runs/<run>/control.json``.

It holds the counters and evidence that decisions need across passes (attempts, preemptions,
crashes, consecutive passes without a node, the last step progress, a create in flight, zones
blocked by a stockout) and the run's event log (``tpuops events``). It is written with a
compare-and-swap on its generation by the lease holder only, so it never loses an update.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from tpuops.errors import NotFound
from tpuops.store import Store

MAX_EVENTS = 500


@dataclass
class Memory:
    phase: str = "active"  # active | finished
    outcome: str | None = None  # succeeded | user-error | crashed | budget-exhausted | cancelled | failed
    reason: str | None = None
    attempts: int = 0
    preemptions: int = 0
    crashes: int = 0
    hangs: int = 0
    zone: str | None = None
    pending_create: dict[str, Any] | None = None
    blocked_zones: dict[str, float] = field(default_factory=dict)
    handled_agent_attempt: int = 0
    progress_attempt: int = 0  # progress is (agent attempt, step): a new attempt may resume below the old step
    progress_step: int = -1
    progress_at: float = 0.0
    ready_since: float | None = None
    missing_passes: int = 0
    # The node is gone or going on purpose (we deleted it, the run finished, or no zone has capacity):
    # when it is missing, create the next one at once and count no preemption.
    deleting: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)

    def event(self, now: float, kind: str, message: str) -> None:
        self.events.append({"at": now, "kind": kind, "message": message})
        del self.events[:-MAX_EVENTS]

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1, sort_keys=True) + "\n").encode()


def key_of(run_id: str) -> str:
    return f"runs/{run_id}/control.json"


def load(store: Store, run_id: str) -> tuple[Memory, int]:
    """The run's memory and its generation (0: none yet)."""
    try:
        data, generation = store.read_versioned(key_of(run_id))
    except NotFound:
        return Memory(), 0
    known = set(Memory.__dataclass_fields__)
    raw = {k: v for k, v in json.loads(data).items() if k in known}
    return Memory(**raw), generation


def save(store: Store, run_id: str, memory: Memory, generation: int) -> int:
    """Write if nobody else did since ``generation``; raises PreconditionFailed otherwise."""
    return store.write_if_generation_match(key_of(run_id), memory.to_bytes(), generation)
