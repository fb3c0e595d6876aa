"""Typed forms of a sweep's documents: its record (``sweep.json``) and its state (``state.json``).

Like a run's documents (``tpuops.runs.models``), they are read leniently (a key this version does
not know is ignored) and written strictly; a malformed one is a ``DamagedDocument`` naming the file.
The enums are ``str`` enums, so a member equals the string the JSON holds.

A "record" is the document that declares a thing, written once: ``RunRecord`` (``run.json``)
declares a run, ``SweepRecord`` (``sweep.json``) a sweep. What changes afterwards is state: a
run's ``Memory`` (``memory.json``), a sweep's ``SweepState`` (``state.json``).
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from tpuops.core.kinds import ValueEnum
from tpuops.core.notices import Notice
from tpuops.sweeps.spec import SweepSpec
from tpuops.sweeps.template import TrialTemplate


class SweepPhase(ValueEnum):
    """Where the sweep stands: ACTIVE launches trials, STOPPING (``sweep stop``) stops them, FINISHED is over."""

    ACTIVE = "active"
    STOPPING = "stopping"
    FINISHED = "finished"


class SweepOutcome(ValueEnum):
    """How a finished sweep ended (a sweep's ending, not a run's: ``tpuops.runs.outcome`` says why)."""

    COMPLETED = "completed"
    STOPPED = "stopped"
    BUDGET_EXHAUSTED = "budget-exhausted"
    FAILED = "failed"


class SweepState(BaseModel):
    """``state.json``: changed by every pass and by ``sweep stop``, with compare-and-swap."""

    model_config = ConfigDict(extra="ignore")

    phase: SweepPhase = SweepPhase.ACTIVE
    passes: int = 0
    last_pass: str | None = None
    waiting: str | None = None
    """Why the last pass launched nothing although trials were left (the budget), if it did."""
    promoted: list[int] = Field(default_factory=list)
    """Trials the endgame moved to on-demand."""
    outcome: SweepOutcome | None = None
    """How it ended, once FINISHED, and why (``reason``)."""
    reason: str | None = None
    notices: list[Notice] = Field(default_factory=list)
    """Messages decided for the sweep and where each delivery stands (``tpuops.notify``: written before sending)."""

    @property
    def finished(self) -> bool:
        return self.phase is SweepPhase.FINISHED

    def finish(self, outcome: SweepOutcome, reason: str) -> None:
        self.phase, self.outcome, self.reason = SweepPhase.FINISHED, outcome, reason

    def to_bytes(self) -> bytes:
        return (json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n").encode()


class SweepRecord(BaseModel):
    """``sweep.json``: the validated spec, the frozen trial template, one trial's projected cost. Written once."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    spec: SweepSpec
    template: TrialTemplate
    projected_usd: float
    """One trial: the node's price per hour times the experiment's ``expected_hours``."""
    experiment: str | None = None
    created: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    def to_bytes(self) -> bytes:
        return (json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()
