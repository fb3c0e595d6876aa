"""How ``decide`` counts a run's preemptions where a node listed PREEMPTED is not the whole story.

A pass counts a preemption when it finds the run's node PREEMPTED or TERMINATED (``decide._dead``). Four other
ways a preemption could go uncounted are closed here (``Memory.preemptions``: ``runs``, ``cost`` and the capacity
rule read it):

- the pass that counted it replaced the node and lost its memory write: the replacement carries the count
  (``tpuops.core.naming.PREEMPTIONS_KEY``) and the next pass that lists it takes it back (``recount``);
- a pass created the run's next node while the memory said its node was going on purpose (``Memory.deleting``:
  after a stop and ``train --resume``, a restart, a preemption with every zone out of capacity) and lost its memory
  write (a 503 of the store, a kill): the memory still says so, and the next pass would take that node, preempted,
  for the one we deleted. Every node carries the attempt it was created for (``tpuops.core.naming.ATTEMPT_KEY``,
  ``carried``), and a pass that lists a node of a later attempt than the memory knows adopts it as the run's node
  (``adopt``): its preemption is counted (the swarm's seeds 5739 and 6192);
- the listing lags behind the cloud (it still shows the node READY after the cloud took it) while the node's agent
  reported that it saved and left on a preemption notice: the node is as dead as a PREEMPTED one, and the pass that
  gives up waiting for it counts a preemption, not a hang (``left_on_notice``);
- a pass that counts a preemption writes the memory before it deletes the preempted node (``ahead``): once the
  node is gone nothing else may show that it was preempted (its replacement's create can be refused, or the
  replacement can end before any pass lists it). A pass whose early write fails deletes nothing, and the next pass
  finds the node PREEMPTED again; one killed after it finds the create marked not sent and replaces the node
  without counting it twice.

Imports: ``tpuops.core`` and ``tpuops.runs`` only (``decide``, pure as it is, uses it).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from tpuops.core.create_result import CreateResult
from tpuops.core.kinds import Capacity
from tpuops.core.naming import ATTEMPT_KEY, PREEMPTIONS_KEY, label_count
from tpuops.runs import AgentStatus, ExitClass, Memory

NOTICE_CAUSES = {"preempted": "a preemption notice", "checkpoint": "the notice of a planned capacity move",
                 "moved-up": "the notice of a planned move to a larger size"}
"""What the notice an agent saved on was, by the last event that deletes a run's READY node through its notice."""

NOT_SENT = "not sent yet: the pass writes the preemption it counted before it deletes the preempted node"
"""Why the memory written ahead of a replacement marks its create to be tried again (``ahead``)."""


def notice_cause(memory: Memory, status: AgentStatus) -> str:
    """Why the attempt that reported a notice save got its notice: the last move or capacity change that deleted a
    READY node through its notice, if it came after the attempt started (on the node it deleted), else a preemption
    (the controller may see the agent's exit before the PREEMPTED node; a move before the attempt started moved an
    earlier node, as when a run that moved up is preempted on the larger size)."""
    started = _started(status)
    last = next((e for e in reversed(memory.events) if e["kind"] in NOTICE_CAUSES), None)
    return last["kind"] if last is not None and (started is None or last["at"] >= started) else "preempted"


def _started(status: AgentStatus) -> float | None:
    """When the status's attempt started, as the agent says (its timing, else ``started``; None: it does not say)."""
    timed = next((a.started_at for a in status.attempts if a.attempt == status.attempt), None)
    if timed is not None or status.started is None:
        return timed
    try:
        started = datetime.fromisoformat(status.started)
    except ValueError:
        return None
    return started.timestamp() if started.tzinfo is not None else None


def recount(memory: Memory, node_preemptions: int, now: float) -> None:
    """Take back the preemptions a pass counted, replaced and then lost with its memory write: the node it created
    carries the count (``tpuops.core.naming.PREEMPTIONS_KEY``)."""
    if node_preemptions > memory.preemptions:
        memory.event(now, "preempted", f"{node_preemptions - memory.preemptions} preemption(s) recovered "
                                       "by a pass whose memory write was lost, counted from the node's label")
        memory.preemptions = node_preemptions


def adopt(memory: Memory, node_attempt: int, how: str, now: float) -> None:
    """Take the listed node (``how``: its state and zone) as the run's when the memory knows no node of the run
    (a pass created it and died before it could remember that) or the node was created for a later attempt than the
    memory knows (``node_attempt``, ``ATTEMPT_KEY``; 0: a node from before the label): that pass's memory write was
    lost, and whatever the memory said of the node before (going on purpose, a create in flight) is older than it."""
    if memory.attempts and node_attempt <= memory.attempts:
        return
    lost = f", created for attempt {node_attempt} by a pass that lost its memory write (the memory knew " \
        f"{memory.attempts})" if memory.attempts else ""
    memory.attempts = max(node_attempt, 1)
    memory.deleting, memory.pending_create = False, None
    memory.event(now, "adopted", f"node of this run found {how}{lost}")


def carried(memory: Memory) -> dict[str, str]:
    """The labels a create of the run's node adds to its run's: the attempt it is for and the preemptions counted so
    far (none before the first), in the cloud before the pass's memory write (``adopt``, ``recount``)."""
    return {ATTEMPT_KEY: str(memory.attempts), **({PREEMPTIONS_KEY: str(memory.preemptions)}
                                                  if memory.preemptions else {})}


def labelled(labels: Mapping[str, str]) -> dict[str, int]:
    """What the run's listed node carries (``carried``), as ``decide.Observed``'s fields (none listed: zeros)."""
    return {"node_attempt": label_count(labels, ATTEMPT_KEY), "node_preemptions": label_count(labels, PREEMPTIONS_KEY)}


def left_on_notice(memory: Memory, status: AgentStatus | None, node_created: float | None,
                   capacity: Capacity | None) -> bool:
    """The agent of the run's node listed READY saved and left on a preemption notice: its last exit, already handled,
    was a save on a notice none of our moves gave (``notice_cause``), in an attempt that started on this node (after
    its create; an attempt from before ran on a node we replaced, whose delete gave the notice), and the node is
    preemptible (an on-demand node's maintenance event repairs it, and it comes back READY with a new attempt)."""
    if status is None or status.exit_class != ExitClass.PREEMPTED or status.attempt != memory.handled_agent_attempt:
        return False
    started = _started(status)
    return capacity is not Capacity.ON_DEMAND and started is not None and node_created is not None and \
        started >= node_created and notice_cause(memory, status) == "preempted"


def ahead(memory: Memory, counted_before: int, deletes: bool) -> Memory | None:
    """The memory to write before a pass's actions when its decision counted a preemption and ``deletes`` the node
    (the module docstring): a copy whose create, if any, is marked not sent (``CreateResult.RETRY``), so that a pass
    after a kill replaces the node again without counting it (as ``Memory.deleting`` does without a create); None
    when there is nothing to write first."""
    if memory.preemptions <= counted_before or not deletes:
        return None
    early = memory.model_copy(deep=True)
    if early.pending_create is not None:
        early.pending_create.error, early.pending_create.message = CreateResult.RETRY, NOT_SENT
    return early
