"""Typed forms of a run's documents: its record (``run.json``) and the agent's status (``status.json``), and of
what its billed time went to (``Goodput``, a value computed above runs and billing: ``tpuops.accounting``).

Both are read leniently and written strictly: a key this version does not know is ignored when
read (a newer agent or control plane may add fields); bytes that are not JSON, or a value of the
wrong type, are a ``DamagedDocument`` naming the file (a failure of the world, exit 1: the store
holds them, not the user's input). Enums are ``str`` enums, so a member equals the string the JSON
holds. The controller's memory (``memory.json``) is in ``tpuops.runs.memory``, how a run ended
(``Outcome``) in ``tpuops.runs.outcome``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tpuops.contract.exits import ExitClass, Phase
from tpuops.contract.timing import DISJOINT
from tpuops.core.errors import DamagedDocument
from tpuops.core.formats import format_seconds
from tpuops.core.kinds import ValueEnum
from tpuops.core.notices import NotifyChoice
from tpuops.providers.nodes import NodeRequest
from tpuops.runs.outcome import Outcome

if TYPE_CHECKING:
    from tpuops.contract.runspec import RunSpec

__all__ = ["AgentStatus", "AttemptTime", "EvalPoint", "ExitClass", "Goodput", "NodeSpec", "Outcome", "Phase",
           "RunKind", "RunPhase", "RunRecord", "StopRequest", "parse", "spec_json"]

_DocT = TypeVar("_DocT", bound=BaseModel)


class RunKind(ValueEnum):
    """What the run's node runs: the agent's command."""

    TRAIN = "train"
    INFER = "infer"


class RunPhase(ValueEnum):
    """The run as the controller sees it: ACTIVE until it decided the run is over."""

    ACTIVE = "active"
    FINISHED = "finished"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class NodeSpec(NodeRequest):
    """The node request frozen into the run when it was declared, and the zones to try: every
    recreate makes exactly this (it is the ``NodeRequest``, not a copy of it).

    ``metadata`` holds the rendered startup script (its inputs: node, project, store root, the
    job's command line, labels) and the limits that the config gave at declare time.
    """

    zones: list[str] = Field(min_length=1)

    @classmethod
    def of(cls, request: NodeRequest, zones: list[str]) -> NodeSpec:
        return cls(**request.model_dump(), zones=list(zones))


class Learned(_Doc):
    """One input of a plan: its value, whether history gave it, and the words that say where it came from
    (``tpuops.launch.planning`` learns them)."""

    value: float
    learned: bool
    source: str

    @classmethod
    def of(cls, value: float, learned: bool, source: str) -> Learned:
        return cls(value=value, learned=learned, source=source)


class SizeInputs(_Doc):
    """One size of an elastic run as its deadline policy weighs it (``tpuops.billing.elastic.SizeTerms``): its pace
    and prices, and its preemption and stockout hazards, each learned from the ledger or assumed."""

    accelerator: str
    slowdown: float
    """Wall seconds per second of the largest size's work: the largest's replicas over this size's (accumulation)."""
    spot_usd_per_hour: float
    on_demand_usd_per_hour: float
    hazard_per_hour: Learned
    stockouts_per_hour: Learned
    spell_s: Learned


class PlanInputs(_Doc):
    """What a run's plan rests on, frozen into its record at launch (``tpuops.launch.planning``): the spot hazard and
    the cost of one recovery the deadline policy weighs, the rate of lost work ``every: auto`` saves against, and
    for an elastic run each size's terms, largest first (empty for a run of one size)."""

    hazard_per_hour: Learned
    recovery_s: Learned
    lost_work_per_hour: Learned
    sizes: list[SizeInputs] = Field(default_factory=list)


class RunRecord(_Doc):
    """``run.json``: what the run is, the node it runs on (frozen) and its limits. Written once."""

    run_id: str
    kind: RunKind
    node: NodeSpec
    experiment: str | None = None
    spec_file: str | None = None
    bundle_sha256: str | None = None
    created: str = ""
    keep: bool = False
    budget_usd: float | None = None
    target: dict[str, Any] | None = None
    sweep: str | None = None
    deadline_at: float | None = None
    """When the run must be done (epoch seconds): its capacity follows ``tpuops.billing.deadline.choose``."""
    expected_s: float | None = None
    """The run's expected length at on-demand speed: its remaining work until a pass has measured its speed."""
    fallback: bool = False
    """Spot until the first preemption, on-demand after (``tpuops.billing.deadline.fallback``: the SkyPilot-like
    baseline)."""
    notify: NotifyChoice | None = None
    """The experiment's ``notify:`` (target names and kinds, never a secret); None: the ``[notify]`` defaults."""
    inputs: PlanInputs | None = None
    """What its deadline rule and ``every: auto`` rest on, learned at launch; None: a record from before them, or
    a run with neither (the settings' assumptions apply)."""
    smaller: list[NodeSpec] = Field(default_factory=list)
    """An elastic run's smaller sizes (``accelerator: [v3-32, v3-8]``), frozen like ``node`` (its largest size),
    largest first: the controller creates one of these while the larger ones are stocked out."""
    elastic_wait_s: float = 0.0
    """How long the run waits for its largest size, stocked out everywhere, before it takes a smaller one."""
    probe_every_s: float = 600.0
    """How often a run on a smaller size asks for a larger one (``tpuops.controller.decide``, probes)."""

    @property
    def node_name(self) -> str:
        return self.node.name

    @property
    def zones(self) -> list[str]:
        """The zones the run's nodes may be in: its node's, then those only a smaller size of an elastic run has."""
        return list(dict.fromkeys(zone for node in self.sizes for zone in node.zones))

    @property
    def sizes(self) -> list[NodeSpec]:
        """The nodes the run may run on, largest first: ``node``, then the smaller sizes of an elastic run."""
        return [self.node, *self.smaller]


class EvalPoint(_Doc):
    """One evaluation the agent made: at which step, with which metrics."""

    step: int
    metrics: dict[str, float] = Field(default_factory=dict)


class AttemptTime(_Doc):
    """Where one attempt's seconds went, as the agent measured them (``tpuops/contract/timing.py``).

    Times are unix seconds on the VM's clock; a killed attempt has no ``ended_at`` and its
    ``seen_at`` (the last status write) is its last sign of life.
    """

    attempt: int
    started_at: float | None = None
    process_at: float | None = None
    """When the agent's process started, before its TensorFlow import; None from an older agent."""
    agent_at: float | None = None
    loaded_at: float | None = None
    first_step_at: float | None = None
    ended_at: float | None = None
    seen_at: float | None = None
    setup_s: float = 0.0
    productive_s: float = 0.0
    recomputed_s: float = 0.0
    checkpoint_s: float = 0.0
    eval_s: float = 0.0
    save_s: float = 0.0
    input_wait_s: float = 0.0

    @property
    def last_alive(self) -> float | None:
        return self.ended_at if self.ended_at is not None else self.seen_at


class AgentStatus(_Doc):
    """``status.json`` as the agent writes it: the control plane's reader of ``tpuops.contract.status`` (field
    meanings there; tests/contract/test_contract.py holds each field here to the contract's ``FIELDS``)."""

    run_id: str = ""
    command: RunKind | None = None
    attempt: int = 0
    phase: Phase | str = Field(Phase.STARTING, union_mode="left_to_right")  # a newer agent may add phases
    step: int = 0
    total_steps: int | None = None
    examples_per_sec: float | None = None
    global_batch: int | None = None
    replicas: int | None = None
    accumulation: int | None = None
    """Micro-batches per optimizer step on the attempt's slice (elastic runs); None before it is known or from an
    older agent."""
    examples_seen: int | None = None
    """Training examples the done steps consumed (the data position); None before the restore or from an older
    agent."""
    device: str | None = None
    deterministic: bool | None = None
    """Whether TF op determinism is on for the attempt; None before the runtime is chosen or from an older agent."""
    resumed_from_step: int | None = None
    recomputed_steps: int = 0
    last_checkpoint_step: int | None = None
    checkpoint_in_flight: int | None = None
    """The step of the checkpoint being written in the background; None from an agent older than that."""
    checkpoint_every_s: float | None = None
    """The periodic checkpoint interval in use (``every: auto`` re-chooses it after each save)."""
    last_save_s: float | None = None
    """The last checkpoint's cost, snapshot to whole in the store; None before one, or from an older agent."""
    metrics: dict[str, Any] = Field(default_factory=dict)
    input_wait_ms: float | None = None
    evals: list[EvalPoint] = Field(default_factory=list)
    attempts: list[AttemptTime] = Field(default_factory=list)
    """Empty from an agent older than the goodput split: its time is then unknown."""
    started: str | None = None
    heartbeat: str | None = None
    exit_class: ExitClass | None = None
    ended: str | None = None
    """When the agent finished; None while it runs or from an older agent. Not when its node stopped costing: that
    is its delete's start (``tpuops.billing.observer``), which an API outage can put long after."""
    exit_code: int | None = None
    message: str | None = None
    traceback: str | None = None

    @property
    def ended_at(self) -> datetime | None:
        """When the agent ended (``ended``); None before it ended, or for a time without a zone (it dates nothing)."""
        try:
            ended = datetime.fromisoformat(self.ended) if self.ended is not None else None
        except ValueError:
            return None
        return ended if ended is not None and ended.tzinfo is not None else None

    @property
    def final(self) -> bool:
        """The agent ended the run for good (succeeded, user-error or diverged): nothing will restart it."""
        return self.exit_class is not None and self.exit_class.final

    @property
    def work_done(self) -> bool:
        """Nothing is left for the run's nodes to do: the agent ended the run for good, or trained every step and is
        only writing its last save. Moving such a run (a sweep's endgame) costs a node's boot and speeds up nothing."""
        return self.final or (self.total_steps is not None and self.step >= self.total_steps)

    def eval_metric(self, name: str) -> float | None:
        value = self.metrics.get("eval", {}).get(name)
        return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class Goodput:
    """A run's billed seconds, split by what they went to; the parts (``PARTS``) sum to ``billed_s``.

    ``tpuops.accounting.goodput`` computes it from the ledger's billed READY intervals and the agent's attempt
    clocks (``AttemptTime``): boot (READY to the startup script's start), the agent's own segments
    (``tpuops.contract.timing.DISJOINT``), idle after the end (until billing stopped) and unaccounted (the rest;
    negative when the agent measured more than the ledger billed). ``goodput = productive / billed``.
    """

    billed_s: float
    usd: float
    boot_s: float = 0.0
    setup_s: float = 0.0
    productive_s: float = 0.0
    recomputed_s: float = 0.0
    checkpoint_s: float = 0.0
    eval_s: float = 0.0
    save_s: float = 0.0
    idle_after_end_s: float = 0.0
    unaccounted_s: float = 0.0
    input_wait_s: float = 0.0
    """How long steps waited for input: a share of productive and recomputed, not a part."""
    lost_s: float = 0.0
    """What interruptions cost: recomputed, later attempts' boot and setup, interrupted tails."""
    attempts: int = 0

    PARTS = ("boot_s", *(f"{segment}_s" for segment in DISJOINT), "idle_after_end_s", "unaccounted_s")

    @property
    def goodput(self) -> float | None:
        return self.productive_s / self.billed_s if self.billed_s > 0 else None

    @property
    def lost_usd(self) -> float:
        return self.usd * self.lost_s / self.billed_s if self.billed_s > 0 else 0.0

    def ratio_text(self) -> str:
        """The goodput as a table cell: '0.62' (or '?' before anything was billed)."""
        goodput = self.goodput
        return f"{goodput:.2f}" if goodput is not None else "?"

    def summary(self) -> str:
        """One line: the goodput, then every part of the billed seconds and what interruptions cost."""
        shown = ", ".join(f"{name[:-2].replace('_', ' ')} {format_seconds(getattr(self, name))} s"
                          for name in self.PARTS)
        return (f"goodput {self.ratio_text()}: {format_seconds(self.productive_s)} s productive of "
                f"{format_seconds(self.billed_s)} s billed ({shown}); lost to interruptions "
                f"{format_seconds(self.lost_s)} s, ${format_seconds(self.lost_usd, 4)}")

    def to_json(self) -> dict[str, Any]:
        # + 0.0 turns a -0.0 that rounding leaves (unaccounted a hair below zero) into 0.0
        out: dict[str, Any] = {f.name: round(getattr(self, f.name), 3) + 0.0 for f in fields(self)
                               if isinstance(getattr(self, f.name), float)}
        goodput = self.goodput
        return {**out, "usd": round(self.usd, 6), "attempts": self.attempts,
                "goodput": round(goodput, 4) if goodput is not None else None,
                "lost_usd": round(self.lost_usd, 6)}


class StopRequest(_Doc):
    """``stop.json``: someone asked for the run to stop (``tpuops stop``, ``down`` of its node, the dashboard).

    Anyone may write it; the controller that holds the run's lease honours it at its next pass (the run ends
    ``Outcome.STOPPED``, its node is deleted), so a stop is never refused because another controller drives the run.
    """

    reason: str
    at: float


def parse(model: type[_DocT], data: bytes, where: str) -> _DocT:
    """Parse one stored document; a malformed one is a ``DamagedDocument`` naming it and what is wrong."""
    try:
        return model.model_validate_json(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first.get("loc", ()))
        what = f"{field}: " if field else ""  # no field: the document as a whole (not JSON, not an object)
        raise DamagedDocument(f"{where} is damaged: {what}{first.get('msg', 'invalid value')}", where=where) from None


def spec_json(spec: RunSpec) -> dict[str, Any]:
    """The run spec as JSON, as ``spec.json`` holds it and the agent reads it (the one conversion)."""
    return json.loads(json.dumps(asdict(spec)))
