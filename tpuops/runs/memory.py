"""What the controller remembers of a run: ``runs/<run>/memory.json``.

It holds the counters and evidence that decisions need across passes (attempts, preemptions,
crashes, consecutive passes without a node, the last step progress, a create in flight, zones
blocked by a stockout) and the run's event log (``tpuops events``). It is written with a
compare-and-swap on its generation, by the lease holder (and by ``reopen``), so it never loses an
update. ``phase`` FINISHED is the controller's word that the run is over: whatever the agent's
status says, such a run is not active.

The memory owns its transitions: ``finish`` (the controller's decisions and a sweep's stops),
``switch`` (a capacity move chosen by ``tpuops.billing.deadline``: the deadline policy, the fallback, a
sweep's endgame through ``promote``) and ``reopen`` (``train --resume``). Each is written once, here,
and says in its event why; callers decide *whether*, never *how*.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

from tpuops.core.create_result import CreateResult
from tpuops.core.kinds import Capacity, Choice
from tpuops.core.notices import Notice
from tpuops.runs.models import RunPhase
from tpuops.runs.outcome import Outcome

MAX_EVENTS = 500


class Event(TypedDict):
    """One decision of the controller: when (epoch seconds), what, and why."""

    at: float
    kind: str
    message: str


class PendingCreate(BaseModel):
    """A create the controller asked for and has not seen the result of yet."""

    model_config = ConfigDict(extra="ignore")

    zone: str
    at: float
    operation: str | None = None  # the long-running operation, once the request was accepted
    error: CreateResult | None = None  # the request itself was refused: how
    message: str = ""
    replacing: str | None = None  # uid of the node this create replaces (deleted in the same pass)


class Memory(BaseModel):
    """The controller's memory of one run (see the module docstring)."""

    model_config = ConfigDict(extra="ignore")

    phase: RunPhase = RunPhase.ACTIVE
    outcome: Outcome | None = None
    reason: str | None = None
    attempts: int = 0
    preemptions: int = 0
    crashes: int = 0
    hangs: int = 0
    zone: str | None = None
    pending_create: PendingCreate | None = None
    blocked_zones: dict[str, float] = Field(default_factory=dict)
    handled_agent_attempt: int = 0
    progress_attempt: int = 0  # progress is (agent attempt, step): a new attempt may resume below the old step
    progress_step: int = -1
    progress_at: float = 0.0
    ready_since: float | None = None
    unhealthy_since: float | None = None
    """When a pass first saw a worker of the run's READY slice unhealthy (None: every worker is well)."""
    missing_passes: int = 0
    # The node is gone or going on purpose (we deleted it, the run finished, or no zone has capacity):
    # when it is missing, create the next one at once and count no preemption.
    deleting: bool = False
    capacity: Capacity | None = None
    """Set by a capacity move (``switch``): the run's nodes are created with this capacity, not the record's."""
    speed: float | None = None
    """Steps per second of READY wall time, as the passes saw the current attempt progress (saves included)."""
    speed_from: tuple[int, int, float] | None = None
    """(attempt, step, at) of the first progress a pass saw in the current attempt: where ``speed`` is measured from."""
    size: int = 0
    """An elastic run's size its nodes are created at: an index into ``RunRecord.sizes`` (0, the largest)."""
    size_wait_since: float | None = None
    """When a pass first found the largest size out of capacity in every zone (``elastic_wait_s`` runs from then)."""
    probe: PendingCreate | None = None
    """A probe create of a larger size in flight (``tpuops.controller.probes``: how a run learns it returned)."""
    probe_size: int = 0
    """The size ``probe`` asks for."""
    probed_at: float | None = None
    """When the last probe was asked for."""
    size_move: str | None = None
    """What an elastic run with a deadline does while its largest size is stocked out (``tpuops.billing.elastic.Move``:
    wait, smaller, on-demand); None while it is not, or without a deadline. On-demand, once chosen, stays."""
    moves: int = 0
    """Moves to a larger size through a checkpoint: counted apart from preemptions and restarts."""
    events: list[Event] = Field(default_factory=list)
    notices: list[Notice] = Field(default_factory=list)
    """Messages decided for the run and where each delivery stands (``tpuops.notify``: written before sending)."""

    @property
    def finished(self) -> bool:
        return self.phase == RunPhase.FINISHED

    def finish(self, now: float, outcome: Outcome, reason: str) -> None:
        """End the run: its node goes (a run reopened later, ``train --resume``, gets a new one at once)."""
        self.phase, self.outcome, self.reason = RunPhase.FINISHED, outcome, reason
        self.pending_create = None
        self.deleting = True
        self.event(now, "finished", f"{outcome}: {reason}")

    def switch(self, now: float, choice: Choice, declared: Capacity, kind: str = "capacity") -> bool:
        """Create the run's nodes on ``choice.capacity`` from now on (the record declared ``declared``).

        The controller moves a READY node of the other capacity through a checkpoint (``decide``).
        False (and nothing changes) when the run is finished or already there.
        """
        was = self.capacity or declared
        if self.finished or choice.capacity is was:
            return False
        self.capacity = choice.capacity
        self.event(now, kind, f"{choice.reason}: moving from {was.value} to {choice.capacity.value} "
                              "at the next checkpoint")
        return True

    def promote(self, now: float, choice: Choice, was: Capacity) -> bool:
        """A sweep's endgame (``tpuops.billing.deadline.endgame``): ``switch`` once, and the node goes on purpose (the
        sweep pass deletes it). False (and nothing changes) when the run is finished or was promoted already.
        """
        if self.capacity is not None or not self.switch(now, choice, was, kind="promoted"):
            return False
        self.deleting = True
        self.pending_create = None
        return True

    def reopen(self, now: float, reason: str) -> bool:
        """Make a finished run active again, its restarts counted afresh; False if it was not finished."""
        if not self.finished:
            return False
        self.phase, self.outcome, self.reason, self.crashes = RunPhase.ACTIVE, None, None, 0
        self.event(now, "reopened", reason)
        return True

    def event(self, now: float, kind: str, message: str) -> None:
        self.events.append(Event(at=now, kind=kind, message=message))
        del self.events[:-MAX_EVENTS]

    def to_bytes(self) -> bytes:
        return (self.model_dump_json(indent=1) + "\n").encode()
