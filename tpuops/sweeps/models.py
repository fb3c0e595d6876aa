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
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tpuops.core.kinds import ValueEnum
from tpuops.core.naming import MetadataKey
from tpuops.core.notices import Notice
from tpuops.sweeps.spec import SweepSpec
from tpuops.sweeps.template import TrialTemplate

_CONTEXT_LINE = "CONTEXT_JSON="
"""The startup script's line holding the values it was rendered with (``templates/startup.sh.j2``)."""


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

    @model_validator(mode="before")
    @classmethod
    def _from_before_the_template_froze_its_config(cls, data: Any) -> Any:
        """A sweep.json written before ``project`` and ``store_root`` were frozen into the template: read them
        from trial 0's startup script, which was rendered with them (``_CONTEXT_LINE``).

        Anything else (a damaged file) is returned unchanged, so that validation names the missing field.
        """
        template = data.get("template") if isinstance(data, dict) else None
        if not isinstance(template, dict) or "project" in template:
            return data
        try:
            metadata = template.get("record", {}).get("node", {}).get("metadata", {})
            script = metadata.get(MetadataKey.STARTUP_SCRIPT.value, "")
            line = next(line for line in script.splitlines() if line.startswith(_CONTEXT_LINE))
            context = json.loads(shlex.split(line[len(_CONTEXT_LINE):])[0])
            frozen = {"project": context["project"], "store_root": context["store_root"]}
        except (StopIteration, KeyError, AttributeError, IndexError, TypeError, ValueError):
            return data
        return {**data, "template": {**template, **frozen}}

    @property
    def name(self) -> str:
        return self.spec.name

    def to_bytes(self) -> bytes:
        return (json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()
