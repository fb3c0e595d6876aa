"""What a pass does with the node of a run whose memory (or record) is damaged (``damaged_verdict``), apart from
``decide`` so that each module stays within its size: pure, no I/O.

Imports: ``tpuops.core``, ``tpuops.providers`` (node states), ``tpuops.runs`` (the agent's status) and
``tpuops.controller.decide`` (its policy and the dead node states).
"""

from __future__ import annotations

from datetime import datetime

from tpuops.controller.decide import BUDGET_STOP, DEAD_NODE, Policy
from tpuops.core.clock import UTC
from tpuops.core.formats import format_usd
from tpuops.providers.nodes import NodeState
from tpuops.runs import AgentStatus


def damaged_verdict(node_state: NodeState | None, status: AgentStatus | None, node_age_s: float | None,
                    now: float, policy: Policy, stuck_s: float | None = None,
                    budget: tuple[float, float] | None = None) -> str | None:
    """What a pass does with the node of a run whose memory (or record) is damaged: why to delete it, or None.

    Without its memory a pass cannot count, restart or recreate, so it creates nothing for the run; but a
    READY node must not bill forever, and a PREEMPTED, TERMINATED or STOPPED one (no agent runs on it, and
    nothing replaces it without the memory) must not hold the name and the quota forever: it goes at once
    (a STOPPED one is left when the run keeps its node: it may be the user's to start), and so does one still
    CREATING ``create_timeout_s`` after its create (it never booted: the swarm's seed 866). A READY node is left
    to its agent while the agent works (its own end deletes the node, ``templates/startup.sh.j2``) and
    deleted once the agent has exited, or has shown no sign of life (a heartbeat; without a readable status,
    the node's age) for as long as a hang takes, or no progress for that long while it beats: ``stuck_s``, how
    long the caller has seen its step stand still (a hung step beats on, and would bill for ever). ``budget``
    (spent, budget in USD), when the run's record is readable and has one: the budget bounds a damaged run too
    (the ledger, not the memory, knows what it spent): a READY node goes once it is spent, working agent or not
    (the swarm's seeds 2892, 4049: a garbled memory let a $5 run spend $8.33).
    """
    if node_state in DEAD_NODE or (node_state is NodeState.STOPPED and not policy.keep_node):
        return f"its node is {node_state.value}"
    if node_state is NodeState.CREATING and node_age_s is not None and node_age_s > policy.create_timeout_s:
        return f"its node is still CREATING after {node_age_s:.0f} s: it never booted"
    if node_state is not NodeState.READY:
        return None
    if budget is not None and budget[0] >= budget[1] and BUDGET_STOP.on:
        return f"it spent {format_usd(budget[0])} of a {format_usd(budget[1])} budget"
    if status is not None and status.exit_class is not None:
        kept = policy.keep_node and status.exit_class.complete  # a stop deletes the node, kept or not
        return None if kept else f"its agent exited ({status.exit_class})"
    beat = _epoch(status.heartbeat) if status is not None else None
    if beat is not None:
        silent = now - beat
        if silent > policy.hang_after_s:
            return f"no heartbeat for {silent:.0f} s"
        stuck = stuck_s is not None and stuck_s > policy.hang_after_s
        return f"no step progress for {stuck_s:.0f} s" if stuck else None
    if node_age_s is not None and node_age_s > policy.boot_timeout_s + policy.hang_after_s:
        return f"no readable agent status on a node READY for {node_age_s:.0f} s"
    return None


def stuck_for(held: dict[str, tuple[tuple[int, int], float]], run_id: str, status: AgentStatus | None,
              now: float) -> float | None:
    """How long ``held`` (a controller's own, across its passes) has seen a damaged run's agent at one step of one
    attempt; None without a readable status (``damaged_verdict``'s ``stuck_s``)."""
    at = None if status is None else (status.attempt, status.step)
    if at is not None and held.get(run_id, (None, now))[0] != at:
        held[run_id] = (at, now)
    return None if at is None else now - held[run_id][1]


def _epoch(text: str | None) -> float | None:
    """An ISO-8601 time (UTC when naive) as epoch seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
