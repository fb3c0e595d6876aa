"""Decisions for one run, as a pure function: memory + observations + time -> actions.

No I/O here, so every rule is tested without servers. The rules (docs/design.md, "Failure taxonomy"):

- the agent said succeeded, user-error or diverged -> finish, delete the node; never retry a user
  error or a divergence (the same spec and seed fail the same way);
- the agent said crashed -> restart from the checkpoint (replace the node), at most
  ``max_crashes`` times, then finish as crashed;
- the node is PREEMPTED or TERMINATED -> count a preemption and replace it;
- the node is missing although we made one -> only after ``evidence_passes`` passes in a row
  (a listing can lag, as the provider contract says, and a flaky pass must not destroy a healthy run)
  recreate it, counted as a crash (bounded by ``max_crashes``), never as a preemption: a preempted node stays listed
  PREEMPTED, so a vanished one was deleted (by itself after its agent failed, or outside tpuops);
  a zone whose listing failed is no evidence at all;
- a READY slice with an unhealthy worker (its TPU runtime stopped answering, or it never booted: the
  provider's ``unhealthy_workers``) -> after ``unhealthy_grace_s`` of the same verdict (a runtime that
  restarts, or a health probe that missed once, is no reason to pay a recreate) a restart from the
  checkpoint naming the worker, counted like a crash (bounded by ``max_crashes``), never a preemption:
  a slice whose worker cannot compute is not left billing while worker 0 waits on it;
- a node still CREATING ``create_timeout_s`` (the settings' ``operation_timeout_s``) after its create was asked never
  booted (a VM that never comes up leaves its node CREATING and its create operation running for ever) -> a restart
  naming it, counted like a crash (bounded by ``max_crashes``), never a preemption; nothing was billed for it; so
  does a create still running that long with no node listed (its unbooted node deleted, the memory of that lost);
- READY but no step progress for ``hang_after_s`` (or no agent status for ``boot_timeout_s``)
  -> a hang: restart, counted like a crash; a few missed heartbeats are not a hang; a status that
  cannot be read (damaged) is no news: no progress, and no "no agent" either, so a status garbled
  for a moment changes nothing and one that stays garbled is a hang after ``hang_after_s``;
- a create that failed for capacity blocks that zone for ``stockout_backoff_s`` and moves to
  the next configured zone; same zone first when it is not blocked; with every zone blocked
  the run waits (one event) and no pass of that wait counts as a preemption;
- a create request refused for quota, permission or validity finishes the run as failed (no
  retry); one that failed transiently is tried again on the next pass;
- spending at or over the run's budget -> finish as budget-exhausted and delete the node
  (deletion sends the preemption notice, so the agent checkpoints); an agent that ended the run for
  good first (its final exit read in the pass that finds the budget spent) keeps its own ending, as
  with a stop: the budget stops work still going, never relabels work done;
- a stop request (``tpuops stop``, ``down`` of the run's node, the dashboard) -> finish as stopped
  and delete the node, the same way, kept node or not; never a preemption (the memory is finished
  before the node goes). An agent that ended the run for good first keeps its own ending;
- an elastic run (``accelerator: [v3-32, v3-8]``, ``Policy.sizes``) creates the largest size that has a zone not
  blocked by a stockout (a stockout blocks that size in that zone, never the others); when the largest is blocked
  everywhere (and the run's ``elastic_wait_s`` is over) it creates the next, an event saying so. While READY on a
  smaller size it probes a larger one every ``probe_every_s`` (``tpuops.controller.probes``: a create of a bare
  node of that size, which a stocked-out zone refuses and which, when it gets capacity, is deleted at once);
  the run then moves up through a checkpoint as a capacity move does (its delete makes the agent save
  on the notice), counted in ``Memory.moves``, never a preemption or a restart. A finished run (a stop,
  ``down``) never moves: the checks above end the pass first, and a probe still in flight is deleted;
- an elastic run with a deadline whose largest size is stocked out (spot) everywhere follows its deadline policy
  instead of ``elastic_wait_s`` (``tpuops.billing.elastic``: wait, the smaller size now, or the largest on on-demand,
  which then stays to the end); a stockout blocks a size in a zone for spot or for on-demand, never both;
- a run with a capacity rule (a deadline, or the fallback: ``tpuops.billing.deadline``) is steered every
  pass it is listed: a change of the wanted capacity is an event with its reason
  (``Memory.switch``), a READY node of the other capacity is replaced through a checkpoint (its
  delete makes the agent save on the notice), and every create asks for the wanted capacity.

Replacing a node is one pass: the decision holds the DELETE of the dead node followed by the
CREATE of its replacement, and ``reconcile`` waits for the delete to complete before it creates
(same name), instead of leaving the create to the next pass. The create remembers the uid of the
node it replaces, so a listing that still shows that node (taken before the delete completed) is
told apart from a preemption of the replacement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpuops.billing.deadline import Rule
from tpuops.billing.elastic import Move, SizeTerms
from tpuops.config import Settings
from tpuops.controller.preemptions import NOTICE_CAUSES, adopt, ahead, left_on_notice, notice_cause, recount
from tpuops.core.create_result import CreateResult
from tpuops.core.formats import format_usd
from tpuops.core.guards import Guard
from tpuops.core.kinds import Capacity, Choice, ValueEnum
from tpuops.providers.nodes import NodeState
from tpuops.runs import AgentStatus, ExitClass, Memory, Outcome, PendingCreate, RunRecord
from tpuops.runs.models import PlanInputs

_WAITING = {NodeState.CREATING, NodeState.STARTING, NodeState.RESTARTING, NodeState.REPAIRING,
            NodeState.DELETING, NodeState.STOPPING}


DEAD_NODE = frozenset({NodeState.PREEMPTED, NodeState.TERMINATED})
"""States of a node no agent runs on and that only a delete ends."""

ENDED_STAYS_ENDED = Guard("decide.ended_stays_ended", "nothing is created for a run that has ended")
ENDED_NODE_GOES = Guard("decide.ended_node_goes", "an ended run's node is deleted at every pass until it is gone")
BUDGET_STOP = Guard("decide.budget_stop", "a run stops once it has spent its budget")
STOP_REQUEST = Guard("decide.stop_request", "a user's stop or down is honoured at the next pass that reads it")
USER_ERROR_FINAL = Guard("decide.user_error_final", "a user error or a divergence is never retried")
AGENT_ENDING_WINS = Guard("decide.agent_ending_wins", "an agent that ended the run for good before a stop or the "
                          "budget was honoured gives the run its ending")
PREEMPTION_COUNTED = Guard("decide.preemption_counted", "every preemption of a run's node is counted")
OWN_DELETE_NO_PREEMPTION = Guard("decide.own_delete_no_preemption", "a node we deleted ourselves is never counted a "
                                 "preemption")

_CAUSES = {"vanished": "a vanished node", "unhealthy": "an unhealthy worker", "unbooted": "a node that never booted"}
"""How a restart's create event names its cause, where ``a KIND`` does not read."""


def _setting(name: str) -> Any:
    """The default of a ``Settings`` field: what a ``Policy`` built without settings (a test's) assumes."""
    return Settings.model_fields[name].default


@dataclass(frozen=True)
class Size:
    """One size of an elastic run: its accelerator type and the zones its frozen node may be created in."""

    accelerator: str
    zones: tuple[str, ...]


@dataclass(frozen=True)
class Policy:
    """The rules ``decide`` applies to one run: its settings' limits and its record's zones, node and capacity.

    ``Policy.of`` is the one builder of a run's policy; the defaults are the settings' own (a policy built
    field by field, as tests do, assumes nothing the settings would not).
    """

    zones: tuple[str, ...]
    evidence_passes: int = 2
    """Passes in a row a node must be missing from the listing before it counts as gone (a listing can lag)."""
    max_crashes: int = _setting("max_restarts")
    hang_after_s: float = _setting("hang_after_s")
    boot_timeout_s: float = _setting("boot_timeout_s")
    stockout_backoff_s: float = _setting("stockout_backoff_s")
    unhealthy_grace_s: float = _setting("unhealthy_grace_s")
    """How long a READY slice may keep an unhealthy worker before it is recreated (docs/design.md)."""
    create_timeout_s: float = _setting("operation_timeout_s")
    """How long a node may stay CREATING after its create was asked before it counts as never booted."""
    keep_node: bool = False
    capacity: Rule | None = None
    """The run's capacity rule (a deadline, or the fallback); None: its nodes keep the declared capacity."""
    sizes: tuple[Size, ...] = ()
    """An elastic run's sizes, largest first (``RunRecord.sizes``); empty: one size, created in ``zones``."""
    elastic_wait_s: float = 0.0
    """How long an elastic run waits for its largest size, stocked out everywhere, before taking a smaller one."""
    probe_every_s: float = 600.0
    """How often an elastic run on a smaller size probes a larger one."""

    @classmethod
    def of(cls, settings: Settings, record: RunRecord | None, zones: tuple[str, ...] | None = None) -> Policy:
        """The policy of the run ``record`` under ``settings``: the one place a run's ``Policy`` is built.

        ``zones`` replaces the record's (a damaged run's node is judged in the zone it was found in); a run
        whose record cannot be read (None) is judged by the settings alone, in ``zones``, its node not kept.
        """
        if record is None and zones is None:
            raise ValueError("a policy without a run record needs the zones it applies to")
        return cls(
            zones=zones if zones is not None else tuple(record.zones),  # type: ignore[union-attr]  # checked above
            max_crashes=settings.max_restarts, hang_after_s=settings.hang_after_s,
            boot_timeout_s=settings.boot_timeout_s, stockout_backoff_s=settings.stockout_backoff_s,
            unhealthy_grace_s=settings.unhealthy_grace_s, create_timeout_s=settings.operation_timeout_s,
            keep_node=record.keep if record is not None else False,
            capacity=(capacity_rule(record, settings.spot_preemptions_per_hour, settings.recovery_s)
                      if record is not None else None),
            sizes=(tuple(Size(node.accelerator, tuple(node.zones)) for node in record.sizes)
                   if record is not None and record.smaller else ()),
            elastic_wait_s=record.elastic_wait_s if record is not None else 0.0,
            probe_every_s=record.probe_every_s if record is not None else 600.0)


def capacity_rule(record: RunRecord, hazard_per_hour: float, recovery_s: float) -> Rule | None:
    """The run's capacity rule (``tpuops.billing.deadline``), at the spot hazard and recovery cost learned at its launch
    (``record.inputs``, ``tpuops.launch.planning``), else at ``hazard_per_hour`` preemptions costing ``recovery_s`` each
    (the settings' assumptions, for a record from before them); None without a rule, or for a run declared
    on-demand (nothing cheaper to move to)."""
    if record.node.capacity is Capacity.ON_DEMAND or (record.deadline_at is None and not record.fallback):
        return None
    sizes: tuple[SizeTerms, ...] = ()
    if record.inputs is not None:
        hazard_per_hour, recovery_s = record.inputs.hazard_per_hour.value, record.inputs.recovery_s.value
        sizes = size_terms(record.inputs) if record.smaller else ()
    return Rule(record.node.capacity, deadline_at=record.deadline_at, expected_s=record.expected_s,
                fallback=record.fallback, hazard_per_hour=hazard_per_hour, recovery_s=recovery_s, sizes=sizes)


def size_terms(inputs: PlanInputs) -> tuple[SizeTerms, ...]:
    """An elastic run's sizes as its deadline policy weighs them, from what its launch learned (largest first)."""
    return tuple(SizeTerms(s.accelerator, s.slowdown, s.spot_usd_per_hour, s.on_demand_usd_per_hour,
                           s.hazard_per_hour.value, s.stockouts_per_hour.value, s.spell_s.value) for s in inputs.sizes)


@dataclass(frozen=True)
class Observed:
    """What one pass saw of a run."""

    listed: bool
    node_state: NodeState | None = None
    node_zone: str | None = None
    node_uid: str | None = None
    node_capacity: Capacity | None = None
    unhealthy_workers: tuple[int, ...] = ()
    """The node's workers with a symptom (the provider's ``NodeInfo.unhealthy_workers``)."""
    status: AgentStatus | None = None
    create_result: CreateResult | None = None  # None: no create in flight
    create_message: str = ""
    spent_usd: float | None = None
    budget_usd: float | None = None
    stop: str | None = None
    """Why someone asked for the run to stop (its stop request, ``tpuops stop``), None when nobody did."""
    status_damaged: bool = False
    """The agent's status.json could not be read this pass (``status`` is the last one read, or None)."""
    node_accelerator: str | None = None
    """The accelerator type of the run's node as listed (an elastic run's size)."""
    node_created: float | None = None
    """When the run's node was created, as the provider says (epoch seconds; None: not listed, or not said)."""
    probe_result: CreateResult | None = None
    """Where the run's probe create stands (None: no probe in flight, or not asked this pass)."""
    probe_message: str = ""
    probe_ready: bool = False
    """The probe's node is listed READY: the larger size has capacity."""
    node_preemptions: int = 0
    """The preemptions count the run's node was created with (``tpuops.core.naming.PREEMPTIONS_KEY``)."""
    node_attempt: int = 0
    """The attempt the run's node was created for (``tpuops.core.naming.ATTEMPT_KEY``; 0: it does not say)."""


class ActionKind(ValueEnum):
    CREATE = "create"
    DELETE = "delete"
    PROBE = "probe"
    """Create a bare node of a larger size under the probe name (``tpuops.controller.probes``)."""
    UNPROBE = "unprobe"
    """Delete the probe's node (a missing one is no error)."""


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    zone: str


@dataclass
class Decision:
    """Actions to apply in order; a CREATE after a DELETE waits for that delete to complete."""

    actions: list[Action] = field(default_factory=list)
    ahead: Memory | None = None
    """The memory to write before the actions: a preemption counted before its node goes (``preemptions.ahead``)."""


def _zones_of(policy: Policy, size: int) -> tuple[str, ...]:
    return policy.sizes[size].zones if policy.sizes else policy.zones


def _key(policy: Policy, size: int, zone: str, capacity: Capacity | None = None) -> str:
    """The ``Memory.blocked_zones`` key of a stockout: the zone, or for an elastic run the size in the zone
    (a stockout of v3-32 in a zone says nothing about v3-8 there), on-demand apart from spot."""
    demand = "/on-demand" if capacity is Capacity.ON_DEMAND else ""
    return f"{policy.sizes[size].accelerator}{demand}@{zone}" if policy.sizes else zone


def _open_zone(memory: Memory, policy: Policy, size: int, now: float, spot: bool = False) -> str | None:
    """The zone of a create of ``size`` on the run's capacity now (``spot``: on its declared capacity)."""
    capacity = None if spot else memory.capacity
    open_zones = [z for z in _zones_of(policy, size)
                  if memory.blocked_zones.get(_key(policy, size, z, capacity), 0.0) <= now]
    if memory.zone in open_zones:
        return memory.zone
    return open_zones[0] if open_zones else None


def _next_zone(memory: Memory, policy: Policy, now: float) -> str | None:
    """The zone of the run's next create, for an elastic run at the largest size that has one (``memory.size``)."""
    if not policy.sizes:
        return _open_zone(memory, policy, 0, now)
    for size in range(len(policy.sizes)):
        smaller = size < len(policy.sizes) - 1
        zone = None if smaller and _out_everywhere(memory, policy, size, now) else _open_zone(memory, policy, size, now)
        if zone is not None:
            _resize(memory, policy, size, now)
            return zone
        if size == 0:
            memory.size_wait_since = now if memory.size_wait_since is None else memory.size_wait_since
            if memory.size_move == Move.WAIT.value or (
                    memory.size_move is None and now - memory.size_wait_since < policy.elastic_wait_s):
                return None
    return None


def _out_everywhere(memory: Memory, policy: Policy, size: int, now: float) -> bool:
    """Every zone of the size refused it in one round of refusals: one zone is still blocked, and each other's
    block ended no earlier than one backoff ago. The size is out, and an elastic run takes the next one.

    A run tries the zones one a pass, so with passes as far apart as ``stockout_backoff_s`` (both 300 s by default)
    each zone's block would end as the next one's begins, no moment would find them all blocked, and the run would
    ask its largest size for ever. Its return is the probes' to find (``probe_every_s``). Once no zone is blocked
    any more the size is asked again, as before (a size offered in one zone is out exactly while it is blocked)."""
    ends = [memory.blocked_zones.get(_key(policy, size, zone, memory.capacity), float("-inf"))
            for zone in _zones_of(policy, size)]
    return max(ends) > now and min(ends) > now - policy.stockout_backoff_s


def _resize(memory: Memory, policy: Policy, size: int, now: float) -> None:
    """Create the run's nodes at ``size`` from now (an event when it changes)."""
    if size == memory.size:
        return
    was, to = policy.sizes[memory.size].accelerator, policy.sizes[size].accelerator
    if size > memory.size:
        memory.event(now, "size-down", f"{was} is out of capacity in every zone: creating {to} until it returns")
    else:
        memory.event(now, "size-up", f"{to}'s stockout backoff is over: creating it instead of {was}")
    memory.size, memory.speed = size, None  # a speed measured on the other size is not this one's


def _waiting(memory: Memory, policy: Policy, now: float) -> str:
    """Why the run waits for capacity, and until when."""
    keys = [_key(policy, size, zone) for size in range(max(len(policy.sizes), 1)) for zone in _zones_of(policy, size)]
    retry = min((memory.blocked_zones[key] for key in keys if memory.blocked_zones.get(key, 0.0) > now), default=now)
    if policy.sizes and memory.size_wait_since is not None and now - memory.size_wait_since < policy.elastic_wait_s:
        left = memory.size_wait_since + policy.elastic_wait_s - now
        return (f"{policy.sizes[0].accelerator} is out of capacity in every zone; waiting up to {left:.0f} s more "
                f"for it before taking {policy.sizes[1].accelerator}")
    return f"every zone is out of capacity; retrying after {retry - now:.0f} s"


def _create(memory: Memory, policy: Policy, now: float, why: str, decision: Decision,
            replacing: str | None = None) -> None:
    zone = _next_zone(memory, policy, now)
    if zone is None:
        memory.deleting = True  # the node is wanted: its absence while we wait is no preemption
        if not memory.events or memory.events[-1]["kind"] != "waiting":
            memory.event(now, "waiting", _waiting(memory, policy, now))
        return
    memory.attempts += 1
    memory.zone = zone
    memory.deleting = False
    memory.ready_since = None
    memory.unhealthy_since = None
    memory.missing_passes = 0
    memory.pending_create = PendingCreate(zone=zone, at=now, replacing=replacing)
    size = f" of {policy.sizes[memory.size].accelerator}" if policy.sizes else ""
    memory.event(now, "create", f"attempt {memory.attempts}{size} in {zone}: {why}")
    decision.actions.append(Action(ActionKind.CREATE, zone))


def _replace(memory: Memory, observed: Observed, policy: Policy, now: float, why: str, decision: Decision) -> None:
    """Delete the run's node and create its replacement in this same pass (see the module docstring)."""
    memory.deleting = True  # if no zone has capacity, the node stays wanted and its absence is no preemption
    memory.pending_create = None
    decision.actions.append(Action(ActionKind.DELETE, observed.node_zone or ""))
    _create(memory, policy, now, why, decision, replacing=observed.node_uid)


def _restart(memory: Memory, observed: Observed, now: float, kind: str, message: str, decision: Decision,
             policy: Policy) -> None:
    """Crash, hang or vanished node: recreate from the checkpoint, bounded by ``max_crashes``."""
    memory.crashes += 1
    if kind == "hang":
        memory.hangs += 1
    # The node may be gone already (its dead-man's switch deletes it when the job ends): then the
    # replacement is created at once, or, when this pass's listing failed, by the next pass.
    memory.deleting = True
    exists = bool(observed.node_zone) and observed.node_state is not None
    if memory.crashes > policy.max_crashes:
        memory.finish(now, Outcome.CRASHED, f"{message}; gave up after {policy.max_crashes} restarts")
        if exists:
            decision.actions.append(Action(ActionKind.DELETE, observed.node_zone or ""))
        return
    memory.event(now, kind, f"{message}; restart {memory.crashes} of {policy.max_crashes} from the checkpoint")
    why = f"restart {memory.crashes} after {_CAUSES.get(kind, 'a ' + kind)}"
    if exists:
        _replace(memory, observed, policy, now, why, decision)
    elif observed.listed:
        _create(memory, policy, now, why, decision)


def _agent_news(memory: Memory, observed: Observed, now: float, decision: Decision, policy: Policy) -> bool:
    """Act on an exit the agent reported that we have not handled yet; True if it decided the pass."""
    status = observed.status
    if status is None or status.exit_class is None or status.attempt <= memory.handled_agent_attempt:
        return False
    memory.handled_agent_attempt = status.attempt
    message = status.message or str(status.exit_class)
    if status.final and (USER_ERROR_FINAL.on or status.exit_class == ExitClass.SUCCEEDED):
        succeeded = status.exit_class == ExitClass.SUCCEEDED
        memory.finish(now, Outcome.of_exit(status.exit_class), f"step {status.step}" if succeeded else message)
        if observed.node_zone and observed.node_state is not None and not policy.keep_node:
            decision.actions.append(Action(ActionKind.DELETE, observed.node_zone))
        return True
    if status.exit_class == ExitClass.CRASHED:
        _restart(memory, observed, now, "crash", f"agent crashed at step {status.step}: {message}",
                 decision, policy)
        return True
    memory.event(now, "notice", f"agent checkpointed at step {status.last_checkpoint_step} on "
                                f"{NOTICE_CAUSES[notice_cause(memory, status)]}")
    return False


def decide(memory: Memory, observed: Observed, now: float, policy: Policy) -> Decision:
    """Update ``memory`` in place for this pass and say what to do (and what to write before doing it)."""
    counted = memory.preemptions
    decision = _decide(memory, observed, now, policy)
    decision.ahead = ahead(memory, counted, any(action.kind is ActionKind.DELETE for action in decision.actions))
    return decision


def _decide(memory: Memory, observed: Observed, now: float, policy: Policy) -> Decision:
    decision = Decision()
    if memory.finished and ENDED_STAYS_ENDED.on:
        _drop_probe(memory, decision)
        keep = policy.keep_node and memory.outcome not in (Outcome.BUDGET_EXHAUSTED, Outcome.STOPPED)
        if observed.node_state not in (None, NodeState.DELETING) and observed.node_zone and not keep \
                and ENDED_NODE_GOES.on:
            decision.actions.append(Action(ActionKind.DELETE, observed.node_zone))
        return decision
    if observed.budget_usd is not None and observed.spent_usd is not None and \
            observed.spent_usd >= observed.budget_usd and not _ended_on_its_own(memory, observed) and BUDGET_STOP.on:
        memory.finish(now, Outcome.BUDGET_EXHAUSTED,
                f"spent {format_usd(observed.spent_usd)} of a {format_usd(observed.budget_usd)} budget")
        if observed.node_state is not None and observed.node_zone:
            decision.actions.append(Action(ActionKind.DELETE, observed.node_zone))
        _drop_probe(memory, decision)
        return decision
    if observed.stop is not None and not _ended_on_its_own(memory, observed) and STOP_REQUEST.on:
        memory.finish(now, Outcome.STOPPED, observed.stop)
        if observed.node_state is not None and observed.node_zone:
            decision.actions.append(Action(ActionKind.DELETE, observed.node_zone))
        _drop_probe(memory, decision)
        return decision
    if _agent_news(memory, observed, now, decision, policy):
        if memory.finished:
            _drop_probe(memory, decision)
        return decision
    if not observed.listed:
        return decision
    if observed.node_state is None:
        _missing(memory, observed, now, policy, decision)
        return decision
    memory.missing_passes = 0
    memory.zone = observed.node_zone or memory.zone
    state = observed.node_state
    adopt(memory, observed.node_attempt, f"{state.value} in {observed.node_zone}", now)  # a create not remembered
    recount(memory, observed.node_preemptions, now)
    if state in DEAD_NODE:
        _steer(memory, observed, now, policy)
        _dead(memory, observed, now, policy, decision)
    elif state is NodeState.READY:
        _steer(memory, observed, now, policy)
        wanted = memory.capacity
        if wanted is not None and observed.node_capacity not in (None, wanted) and not memory.deleting:
            memory.event(now, "checkpoint", f"moving the run to {wanted.value} through a checkpoint")
            _replace(memory, observed, policy, now, f"moving to {wanted.value}", decision)
            return decision
        if policy.sizes and not memory.deleting and _elastic(memory, observed, now, policy, decision):
            return decision
        _ready(memory, observed, now, policy, decision)
    elif state is NodeState.CREATING and _creating_s(memory, observed, now) > policy.create_timeout_s:
        _restart(memory, observed, now, "unbooted", f"node still CREATING {_creating_s(memory, observed, now):.0f} s "
                 "after its create: it never booted", decision, policy)
    elif state is NodeState.STOPPED:
        memory.event(now, "stopped", "node STOPPED outside tpuops: recreating it")
        _replace(memory, observed, policy, now, "replacing the stopped node", decision)
    elif state not in _WAITING:
        memory.event(now, "unknown-state", f"node in state {state.value}: waiting")
    return decision


def _creating_s(memory: Memory, observed: Observed, now: float) -> float:
    """How long the run's node has been CREATING: since our create (the memory's), else its create time as listed (a
    create whose memory write was lost: the swarm's seed 866); 0 when nothing says."""
    since = memory.pending_create.at if memory.pending_create is not None else observed.node_created
    return 0.0 if since is None else now - since


def _drop_probe(memory: Memory, decision: Decision) -> None:
    """A finished run's probe in flight: its node goes, whatever the probe found."""
    if memory.probe is not None:
        decision.actions.append(Action(ActionKind.UNPROBE, memory.probe.zone))
        memory.probe = None


def _elastic(memory: Memory, observed: Observed, now: float, policy: Policy, decision: Decision) -> bool:
    """An elastic run's READY node: move it up when a larger size was found, else probe; True if it moved."""
    names = [size.accelerator for size in policy.sizes]
    on = names.index(observed.node_accelerator) if observed.node_accelerator in names else memory.size
    if on < memory.size:  # a larger node than the run asked for last (adopted): it is the run's size now
        memory.size = on
    if on == 0:
        memory.size_wait_since = None
    if on == memory.size:
        _probe(memory, observed, now, policy, decision)
    if on > memory.size:  # a probe found the larger size (this pass or before): move while its capacity is there
        memory.moves += 1
        memory.event(now, "moved-up", f"moving from {names[on]} to {names[memory.size]} through a checkpoint "
                                      f"(move {memory.moves}; not a preemption)")
        _replace(memory, observed, policy, now, f"moving up to {names[memory.size]}", decision)
        return True
    return False


def _probe(memory: Memory, observed: Observed, now: float, policy: Policy, decision: Decision) -> None:
    """Judge the probe in flight, or ask for one when it is due (see the module docstring)."""
    probe = memory.probe
    if probe is not None:
        result = observed.probe_result
        if result in (None, CreateResult.RUNNING) and not observed.probe_ready:
            return
        memory.probe = None
        wanted = policy.sizes[memory.probe_size].accelerator
        if result == CreateResult.CAPACITY and not observed.probe_ready:
            memory.blocked_zones[_key(policy, memory.probe_size, probe.zone, memory.capacity)] = \
                now + policy.stockout_backoff_s
            memory.event(now, "probe", f"{wanted} is still out of capacity in {probe.zone}")
            return
        decision.actions.append(Action(ActionKind.UNPROBE, probe.zone))
        if result == CreateResult.OK or observed.probe_ready:
            memory.event(now, "size-up", f"{wanted} has capacity again in {probe.zone}: moving up to it")
            memory.size, memory.zone, memory.speed = memory.probe_size, probe.zone, None
        else:
            memory.event(now, "probe", f"the probe of {wanted} in {probe.zone} failed: {observed.probe_message}")
        return
    if memory.size == 0 or (memory.probed_at is not None and now - memory.probed_at < policy.probe_every_s):
        return
    for size in range(memory.size):
        zone = _open_zone(memory, policy, size, now)
        if zone is not None:
            memory.probed_at, memory.probe_size = now, size
            memory.probe = PendingCreate(zone=zone, at=now)
            decision.actions.append(Action(ActionKind.PROBE, zone))
            return


def _ended_on_its_own(memory: Memory, observed: Observed) -> bool:
    """The agent ended the run for good (succeeded, user-error, diverged) before a stop or the budget was honoured:
    that is its ending."""
    status = observed.status
    return status is not None and status.final and status.attempt > memory.handled_agent_attempt and \
        AGENT_ENDING_WINS.on


def _dead(memory: Memory, observed: Observed, now: float, policy: Policy, decision: Decision) -> None:
    """The node is PREEMPTED or TERMINATED: replace it, counting a preemption unless we had let it go."""
    pending = memory.pending_create
    ours = pending is not None and observed.node_uid is not None and pending.replacing == observed.node_uid
    if ours and pending is not None and pending.error != CreateResult.RETRY:
        # A listing from before the delete completed: the create went out (its failure, if any,
        # is judged once the old node is no longer listed).
        return
    if (memory.deleting or ours) and OWN_DELETE_NO_PREEMPTION.on:  # ours: the delete's wait failed (RETRY): again
        _replace(memory, observed, policy, now, "replacing the deleted node", decision)
        return
    state = observed.node_state.value if observed.node_state else ""
    _preempted(memory, observed, now, policy, decision, f"{state} in {observed.node_zone}")


def _preempted(memory: Memory, observed: Observed, now: float, policy: Policy, decision: Decision, how: str) -> None:
    """Count a preemption of the run's node and replace it (``how``: its state and zone, or why one listed READY is
    dead)."""
    if PREEMPTION_COUNTED.on:
        memory.preemptions += 1
    memory.event(now, "preempted", f"node {how} (preemption {memory.preemptions}); replacing it")
    _replace(memory, observed, policy, now, "replacing the preempted node", decision)


def _missing(memory: Memory, observed: Observed, now: float, policy: Policy, decision: Decision) -> None:
    pending = memory.pending_create
    if pending is not None:
        result = observed.create_result
        if result == CreateResult.CAPACITY:
            memory.blocked_zones[_key(policy, memory.size, pending.zone, memory.capacity)] = \
                now + policy.stockout_backoff_s
            memory.pending_create = None
            memory.event(now, "stockout", f"no capacity in {pending.zone}: {observed.create_message}")
            _steer(memory, observed, now, policy)
            _create(memory, policy, now, "failover after a stockout", decision)
        elif result == CreateResult.FAILED:
            memory.finish(now, Outcome.FAILED, f"the create request failed: {observed.create_message}")
        elif result == CreateResult.RETRY:
            memory.pending_create = None
            _create(memory, policy, now, f"retrying a failed create request ({observed.create_message})", decision)
        elif result in (None, CreateResult.OK):
            memory.pending_create = None
            memory.missing_passes += 1
        elif now - pending.at > policy.create_timeout_s:  # running with no node: it never ends (seed 1129)
            _restart(memory, observed, now, "unbooted", "its create still running, no node listed", decision, policy)
        return
    _steer(memory, observed, now, policy)
    if memory.attempts == 0:
        _create(memory, policy, now, "first node of the run", decision)
        return
    if memory.deleting:
        _create(memory, policy, now, "replacing the deleted node", decision)
        return
    memory.missing_passes += 1
    if memory.missing_passes >= policy.evidence_passes:
        # Not a preemption: a preempted node stays listed PREEMPTED until it is deleted. A node that is
        # simply gone was deleted: by itself after its agent ended without a status the store kept (an
        # unwritable store), or by someone outside tpuops. Restarted like a crash, so bounded.
        _restart(memory, observed, now, "vanished", f"node gone for {memory.missing_passes} passes without "
                 "a preemption (deleted outside tpuops, or by itself after its agent failed)", decision, policy)


def _steer(memory: Memory, observed: Observed, now: float, policy: Policy) -> None:
    """Apply the run's capacity rule: the capacity its nodes should be on from now (an event when it changes)."""
    rule = policy.capacity
    if rule is None:
        return
    status = observed.status
    step, total = (status.step, status.total_steps) if status else (0, None)
    if policy.sizes and _size_steer(memory, now, policy, rule, step, total):
        return
    on, speed = memory.capacity or rule.declared, memory.speed
    if rule.sizes and speed:  # measured on the size the run is on: the work left is weighed at the largest's pace
        speed *= rule.sizes[min(memory.size, len(rule.sizes) - 1)].slowdown
    choice = rule.choice(now, on, memory.preemptions, step, total, speed)
    memory.switch(now, choice, rule.declared)


def _size_steer(memory: Memory, now: float, policy: Policy, rule: Rule, step: int, total: int | None) -> bool:
    """An elastic run's deadline choice while its largest size is stocked out for spot in every zone (the module
    docstring); False when it is not (or the run has no such choice), so that uniform progress steers it."""
    if memory.size_move == Move.ON_DEMAND.value:
        return True
    if _open_zone(memory, policy, 0, now, spot=True) is not None:
        memory.size_move = None
        return False
    if memory.capacity is Capacity.ON_DEMAND:  # on on-demand already: its spot is out, nothing to move back to
        return True
    plan = rule.size_plan(now, step, total, memory.speed, memory.size)
    if plan is None:
        memory.size_move = None
        return False
    if plan.move.value != memory.size_move:
        memory.size_move = plan.move.value
        memory.event(now, "size-plan", plan.reason)
    if plan.move is Move.ON_DEMAND:
        memory.switch(now, Choice(Capacity.ON_DEMAND, f"{policy.sizes[0].accelerator} stocked out"), rule.declared)
    return True


def _measure(memory: Memory, attempt: int, step: int, now: float) -> None:
    """The run's speed in this attempt, from the first progress a pass saw in it (saves and evals included)."""
    start = memory.speed_from
    if start is None or start[0] != attempt or step < start[1]:
        memory.speed_from = (attempt, step, now)
    elif now > start[2] and step > start[1]:
        memory.speed = (step - start[1]) / (now - start[2])


def _ready(memory: Memory, observed: Observed, now: float, policy: Policy, decision: Decision) -> None:
    memory.pending_create = None
    memory.deleting = False  # this node is the run's now, whatever happened to the one before
    if memory.ready_since is None:
        memory.ready_since = now
        memory.progress_at, memory.progress_step = now, -1
        memory.event(now, "ready", f"node READY in {observed.node_zone}")
    if _unhealthy(memory, observed, now, policy, decision):
        return
    status = observed.status
    live = status is not None and status.attempt > memory.handled_agent_attempt and status.exit_class is None
    step = status.step if status is not None else 0
    attempt = status.attempt if status is not None else 0
    if live and (attempt, step) > (memory.progress_attempt, memory.progress_step):
        memory.progress_attempt, memory.progress_step, memory.progress_at = attempt, step, now
        if policy.capacity is not None:
            _measure(memory, attempt, step, now)
    if status is None and observed.status_damaged:
        live = True  # an agent is writing something: only the hang rule applies to it
    if not live and now - memory.ready_since > policy.boot_timeout_s:
        if left_on_notice(memory, status, observed.node_created, observed.node_capacity):
            _preempted(memory, observed, now, policy, decision, f"listed READY in {observed.node_zone} but left by "
                       "its agent on a preemption notice: a listing that lags")
        else:
            _restart(memory, observed, now, "hang", f"no agent on the READY node after {policy.boot_timeout_s:.0f} s",
                     decision, policy)
    elif live and now - memory.progress_at > policy.hang_after_s:
        _restart(memory, observed, now, "hang", f"no step progress for {now - memory.progress_at:.0f} s at step "
                                                f"{step}", decision, policy)


def _unhealthy(memory: Memory, observed: Observed, now: float, policy: Policy, decision: Decision) -> bool:
    """A READY slice with a bad worker: restart it once the grace is over; True if this pass restarted it."""
    bad = observed.unhealthy_workers
    if not bad:
        if memory.unhealthy_since is not None:
            memory.unhealthy_since = None
            memory.event(now, "worker-up", "every worker of the slice answers again")
        return False
    named = ", ".join(str(worker) for worker in bad)
    if memory.unhealthy_since is None:
        memory.unhealthy_since = now
        memory.event(now, "worker-down", f"worker {named} of the slice is unhealthy; recreating the slice if it still "
                                       f"is in {policy.unhealthy_grace_s:.0f} s")
        return False
    if now - memory.unhealthy_since <= policy.unhealthy_grace_s:
        return False
    memory.unhealthy_since = None
    _restart(memory, observed, now, "unhealthy", f"worker {named} of the slice unhealthy for "
             f"{policy.unhealthy_grace_s:.0f} s", decision, policy)
    return True
