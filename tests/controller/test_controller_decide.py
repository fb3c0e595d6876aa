"""``decide``: the controller's rules (docs/design.md, "Failure taxonomy") as a pure function, pass by pass.

Each test plays a run's passes against one ``Memory``: what a pass observed (listing, agent
status, create operation, spending) and when, and checks the actions and what was remembered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpuops.controller.decide import Observed, Policy, decide
from tpuops.core.create_result import CreateResult
from tpuops.providers.nodes import NodeState
from tpuops.runs import AgentStatus, Memory, PendingCreate

pytestmark = pytest.mark.unit

A, B = "us-central1-a", "us-central1-b"
POLICY = Policy(zones=(A, B), evidence_passes=2, max_crashes=2, hang_after_s=600.0, boot_timeout_s=300.0,
                stockout_backoff_s=120.0)
READY, PREEMPTED, DELETING, CREATING = NodeState.READY, NodeState.PREEMPTED, NodeState.DELETING, NodeState.CREATING


def status(attempt: int, step: int, exit_class: str | None = None, **fields: Any) -> AgentStatus:
    return AgentStatus.model_validate({"attempt": attempt, "step": step, "exit_class": exit_class,
                                       "phase": "done" if exit_class else "training", **fields})


def seen(state: NodeState, zone: str = A, agent: AgentStatus | None = None, **fields: Any) -> Observed:
    """A pass whose listing shows the run's node in ``state``."""
    return Observed(listed=True, node_state=state, node_zone=zone, status=agent, **fields)


def missing(agent: AgentStatus | None = None, **fields: Any) -> Observed:
    """A pass whose listing worked and does not show the node."""
    return Observed(listed=True, status=agent, **fields)


def unlisted(agent: AgentStatus | None = None) -> Observed:
    """A pass whose listing failed (a 503 storm): no evidence about the node."""
    return Observed(listed=False, status=agent)


def step(memory: Memory, observed: Observed, now: float, policy: Policy = POLICY) -> list[tuple[str, str]]:
    return [(a.kind, a.zone) for a in decide(memory, observed, now, policy).actions]


def kinds(memory: Memory) -> list[str]:
    return [e["kind"] for e in memory.events]


def training(policy: Policy = POLICY, at: float = 100.0) -> Memory:
    """A run whose first node was created in A, became READY and runs attempt 1 of the agent."""
    memory = Memory()
    assert step(memory, missing(), 0.0, policy) == [("create", A)]
    assert step(memory, seen(READY), 10.0, policy) == []
    assert step(memory, seen(READY, agent=status(1, 20)), at, policy) == []
    return memory


def test_first_pass_creates_once_and_a_repeated_pass_does_not() -> None:
    memory = Memory()
    assert step(memory, missing(), 0.0) == [("create", A)]
    assert (memory.attempts, memory.zone, memory.pending_create) == (1, A, PendingCreate(zone=A, at=0.0))
    memory.pending_create.operation = "operations/op-1"  # what applying the create adds
    assert step(memory, missing(create_result="running"), 1.0) == []  # the listing lags the create
    assert step(memory, seen(CREATING), 2.0) == []
    assert step(memory, seen(READY), 3.0) == []
    assert memory.attempts == 1 and memory.pending_create is None
    assert kinds(memory) == ["create", "ready"]


def test_a_failed_listing_on_the_first_pass_creates_nothing() -> None:
    memory = Memory()
    assert step(memory, unlisted(), 0.0) == []
    assert memory.attempts == 0


def test_user_error_finishes_deletes_the_node_and_never_recreates_it() -> None:
    memory = training()
    failed = status(1, 20, "user-error", message="ValueError: bad hparam")
    assert step(memory, seen(READY, agent=failed), 200.0) == [("delete", A)]
    assert (memory.phase, memory.outcome, memory.reason) == ("finished", "user-error", "ValueError: bad hparam")
    assert step(memory, seen(DELETING, agent=failed), 201.0) == []
    for later in range(5):
        assert step(memory, missing(agent=failed), 300.0 + later * 1000) == []
    assert memory.attempts == 1 and memory.crashes == 0 and memory.preemptions == 0


def test_user_error_after_the_node_deleted_itself_finishes_without_actions() -> None:
    memory = training()
    assert step(memory, missing(agent=status(1, 20, "user-error", message="bad")), 200.0) == []
    assert step(memory, missing(agent=status(1, 20, "user-error", message="bad")), 900.0) == []
    assert (memory.phase, memory.outcome, memory.attempts) == ("finished", "user-error", 1)


def test_succeeded_finishes_and_deletes_the_node() -> None:
    memory = training()
    done = status(1, 200, "succeeded")
    assert step(memory, seen(READY, agent=done), 300.0) == [("delete", A)]
    assert (memory.phase, memory.outcome, memory.reason) == ("finished", "succeeded", "step 200")
    assert step(memory, seen(READY, agent=done), 301.0) == [("delete", A)]  # a listing from before the delete
    assert step(memory, seen(DELETING, agent=done), 302.0) == []


def test_finished_with_keep_node_leaves_the_node() -> None:
    keep = Policy(zones=(A, B), keep_node=True)
    memory = training(keep)
    done = status(1, 200, "succeeded")
    assert step(memory, seen(READY, agent=done), 300.0, keep) == []
    assert step(memory, seen(READY, agent=done), 900.0, keep) == []
    assert memory.outcome == "succeeded"


def test_crashes_restart_from_the_checkpoint_up_to_max_crashes_then_finish_crashed() -> None:
    memory = training()
    now = 200.0
    for attempt in range(1, POLICY.max_crashes + 1):
        crashed = status(attempt, 20 * attempt, "crashed", message="Segmentation fault")
        # replaced in this pass: reconcile creates once the delete completed
        assert step(memory, seen(READY, agent=crashed), now) == [("delete", A), ("create", A)]
        assert memory.phase == "active" and memory.crashes == attempt
        assert step(memory, seen(CREATING, agent=crashed), now + 1) == []
        assert step(memory, seen(READY), now + 3) == []
        assert step(memory, seen(READY, agent=status(attempt + 1, 20 * attempt)), now + 4) == []
        now += 100
    last = POLICY.max_crashes + 1
    assert step(memory, seen(READY, agent=status(last, 60, "crashed", message="boom")), now) == [("delete", A)]
    assert (memory.phase, memory.outcome) == ("finished", "crashed")
    assert "gave up after 2 restarts" in (memory.reason or "")
    assert step(memory, missing(agent=status(last, 60, "crashed")), now + 10) == []
    assert (memory.attempts, memory.crashes, memory.preemptions) == (last, last, 0)


def test_a_crash_whose_node_already_deleted_itself_is_recreated_without_counting_a_preemption() -> None:
    """The dead-man's switch deletes the node when the job ends, before the controller sees the crash."""
    memory = training()
    crashed = status(1, 40, "crashed", message="killed by the OOM killer")
    assert step(memory, missing(agent=crashed), 200.0) == [("create", A)]  # at once: no evidence wait
    assert (memory.crashes, memory.attempts, memory.preemptions) == (1, 2, 0)
    assert step(memory, missing(agent=crashed), 201.0) == []  # the listing lags the create
    assert "vanished" not in kinds(memory)


def test_a_crash_seen_while_the_listing_failed_is_recreated_by_the_next_pass() -> None:
    memory = training()
    crashed = status(1, 40, "crashed", message="killed by the OOM killer")
    assert step(memory, unlisted(agent=crashed), 200.0) == []  # the node may still be there: no create
    assert memory.crashes == 1
    assert step(memory, missing(agent=crashed), 201.0) == [("create", A)]
    assert (memory.attempts, memory.preemptions) == (2, 0)


def test_a_replacement_whose_memory_write_was_lost_gives_its_preemption_back_from_the_node_label() -> None:
    memory = training()  # the pass that replaced the preempted node lost its write: this memory never saw it
    assert step(memory, seen(READY, agent=status(2, 80), node_uid="u2", node_preemptions=1), 400.0) == []
    assert memory.preemptions == 1 and kinds(memory)[-1] == "preempted"
    assert step(memory, seen(READY, agent=status(2, 90), node_uid="u2", node_preemptions=1), 410.0) == []
    assert memory.preemptions == 1 and kinds(memory).count("preempted") == 1  # counted once
    notice = status(2, 90, "preempted", last_checkpoint_step=90)  # the label counts what came before this node
    assert step(memory, seen(PREEMPTED, agent=notice, node_uid="u2", node_preemptions=1), 420.0) == \
        [("delete", A), ("create", A)]
    assert memory.preemptions == 2


def test_preempted_node_counts_once_and_is_replaced_in_the_same_pass_and_zone() -> None:
    memory = training()
    notice = status(1, 60, "preempted", last_checkpoint_step=60)
    assert step(memory, seen(PREEMPTED, agent=notice, node_uid="u1"), 200.0) == [("delete", A), ("create", A)]
    assert (memory.preemptions, memory.attempts, memory.zone) == (1, 2, A)
    assert memory.pending_create == PendingCreate(zone=A, at=200.0, replacing="u1")
    assert [(e["kind"], e["at"]) for e in memory.events[-2:]] == [("preempted", 200.0), ("create", 200.0)]
    # a listing taken before the delete completed still shows the old node: not counted twice
    assert step(memory, seen(PREEMPTED, agent=notice, node_uid="u1"), 201.0) == []
    assert step(memory, seen(DELETING, agent=notice, node_uid="u1"), 202.0) == []
    assert step(memory, seen(CREATING, agent=notice, node_uid="u2"), 203.0) == []
    assert memory.preemptions == 1
    assert step(memory, seen(READY, agent=notice, node_uid="u2"), 210.0) == []
    assert step(memory, seen(READY, agent=status(2, 60)), 220.0) == []
    assert step(memory, seen(READY, agent=status(2, 200, "succeeded")), 300.0) == [("delete", A)]
    assert memory.outcome == "succeeded" and memory.preemptions == 1
    assert [k for k in kinds(memory) if k in ("create", "preempted", "vanished", "finished")] == \
        ["create", "preempted", "create", "finished"]


def test_a_replacement_preempted_before_it_was_seen_ready_counts_as_a_preemption() -> None:
    memory = training()
    assert step(memory, seen(PREEMPTED, node_uid="u1"), 200.0) == [("delete", A), ("create", A)]
    assert step(memory, seen(PREEMPTED, node_uid="u2"), 260.0) == [("delete", A), ("create", A)]
    assert (memory.preemptions, memory.attempts) == (2, 3)
    assert memory.pending_create is not None and memory.pending_create.replacing == "u2"


def test_a_replacement_whose_delete_did_not_complete_is_done_again_without_counting() -> None:
    memory = training()
    assert step(memory, seen(PREEMPTED, node_uid="u1"), 200.0) == [("delete", A), ("create", A)]
    assert memory.pending_create is not None
    memory.pending_create.error = "retry"  # what reconcile remembers when the delete's wait failed
    assert step(memory, seen(PREEMPTED, node_uid="u1"), 210.0) == [("delete", A), ("create", A)]
    assert (memory.preemptions, memory.attempts) == (1, 3)
    memory.pending_create.error = "retry"
    assert step(memory, seen(DELETING, node_uid="u1"), 220.0) == []
    assert step(memory, missing(create_result="retry"), 230.0) == [("create", A)]
    assert (memory.preemptions, memory.attempts) == (1, 4)


def test_with_every_zone_out_of_capacity_a_preempted_node_is_deleted_and_the_run_waits() -> None:
    memory = training()
    memory.blocked_zones = {A: 500.0, B: 500.0}
    assert step(memory, seen(PREEMPTED, node_uid="u1"), 200.0) == [("delete", A)]
    assert kinds(memory)[-2:] == ["preempted", "waiting"] and memory.deleting
    assert step(memory, missing(), 210.0) == []
    assert step(memory, missing(), 501.0) == [("create", A)]
    assert (memory.preemptions, memory.attempts) == (1, 2)


def test_a_vanished_node_needs_evidence_passes_in_a_row() -> None:
    memory = training()
    agent = status(1, 40)
    assert step(memory, missing(agent=agent), 200.0) == []  # one missing pass: a lagging listing, maybe
    assert step(memory, seen(READY, agent=status(1, 60)), 210.0) == []  # it was: the count starts again
    assert step(memory, missing(agent=agent), 220.0) == []
    assert step(memory, unlisted(agent=agent), 230.0) == []  # a failed listing is no evidence either way
    assert memory.preemptions == 0 and memory.attempts == 1
    assert step(memory, missing(agent=agent), 240.0) == [("create", A)]
    assert (memory.preemptions, memory.crashes, memory.attempts) == (0, 1, 2)  # gone is no preemption
    assert "vanished" in kinds(memory)


def test_a_node_that_keeps_vanishing_is_a_bounded_crash_never_a_preemption() -> None:
    """An agent that fails because the store cannot be written: its node deletes itself, its status says nothing
    new. Each time is a restart (issue 30, item 12), and past ``max_crashes`` the run ends crashed, not looping."""
    memory = training()
    agent = status(1, 40)
    at = 200.0
    for restart in range(1, POLICY.max_crashes + 1):
        assert step(memory, missing(agent=agent), at) == []
        assert step(memory, missing(agent=agent), at + 10) == [("create", A)]
        assert (memory.preemptions, memory.crashes) == (0, restart)
        assert step(memory, seen(READY, agent=agent), at + 20) == []
        at += 100
    assert step(memory, missing(agent=agent), at) == []
    assert step(memory, missing(agent=agent), at + 10) == []
    assert memory.finished and memory.outcome == "crashed" and memory.preemptions == 0


def test_a_503_storm_does_nothing_for_as_long_as_it_lasts() -> None:
    memory = training()
    before = (memory.attempts, memory.preemptions, memory.crashes, memory.missing_passes, len(memory.events))
    for n in range(20):
        assert step(memory, unlisted(agent=status(1, 20 + n)), 200.0 + n * 60) == []
    assert (memory.attempts, memory.preemptions, memory.crashes, memory.missing_passes,
            len(memory.events)) == before


def test_missed_heartbeats_are_no_hang_while_steps_progress() -> None:
    memory = training()
    stale = "2000-01-01T00:00:00+00:00"  # the status heartbeat is old: writes failed for a while
    for n in range(10):
        now = 200.0 + n * (POLICY.hang_after_s * 0.9)
        assert step(memory, seen(READY, agent=status(1, 40 + n, heartbeat=stale)), now) == []
    assert memory.crashes == 0 and memory.hangs == 0


def test_no_step_progress_for_hang_after_s_restarts_the_run() -> None:
    memory = training()
    stuck = status(1, 20)
    assert step(memory, seen(READY, agent=stuck), 100.0 + POLICY.hang_after_s) == []  # at the limit
    assert step(memory, seen(READY, agent=stuck), 101.0 + POLICY.hang_after_s) == [("delete", A), ("create", A)]
    assert (memory.hangs, memory.crashes, memory.phase, memory.attempts) == (1, 1, "active", 2)
    assert step(memory, missing(agent=stuck), 800.0) == []  # the listing lags the create
    assert memory.preemptions == 0


def test_ready_without_an_agent_for_boot_timeout_s_restarts_the_run() -> None:
    memory = Memory()
    assert step(memory, missing(), 0.0) == [("create", A)]
    assert step(memory, seen(READY), 10.0) == []
    assert step(memory, seen(READY), 10.0 + POLICY.boot_timeout_s) == []
    assert step(memory, seen(READY), 11.0 + POLICY.boot_timeout_s) == [("delete", A), ("create", A)]
    assert memory.hangs == 1 and "no agent on the READY node" in memory.events[-2]["message"]


def test_a_new_attempt_that_resumes_below_the_killed_attempts_step_is_progress() -> None:
    """Attempt 1 reported step 180 and was SIGKILLed (no exit class); attempt 2 resumes at 160."""
    memory = training()
    assert step(memory, seen(READY, agent=status(1, 180)), 200.0) == []
    assert step(memory, seen(PREEMPTED, agent=status(1, 180)), 210.0) == [("delete", A), ("create", A)]
    assert step(memory, seen(CREATING, agent=status(1, 180)), 220.0) == []
    assert step(memory, seen(READY, agent=status(1, 180)), 230.0) == []
    hang = POLICY.hang_after_s
    for n in range(1, 6):  # attempt 2 steps slowly from 160 towards 180, within hang_after_s each time
        assert step(memory, seen(READY, agent=status(2, 160 + 3 * n)), 230.0 + n * hang * 0.9) == []
    assert memory.hangs == 0


def test_a_stockout_blocks_the_zone_fails_over_waits_and_comes_back_after_the_backoff() -> None:
    memory = Memory()
    assert step(memory, missing(), 0.0) == [("create", A)]
    no_capacity = 'There is no more capacity in the zone "us-central1-a"'
    assert step(memory, missing(create_result="capacity", create_message=no_capacity), 5.0) == [("create", B)]
    assert memory.blocked_zones == {A: 5.0 + POLICY.stockout_backoff_s}
    assert step(memory, missing(create_result="capacity", create_message="no capacity in b"), 10.0) == []
    assert kinds(memory)[-1] == "waiting"
    for n in range(6):  # every zone blocked: wait, without counting the absent node as a preemption
        assert step(memory, missing(), 20.0 + n * 10) == []
    assert (memory.preemptions, kinds(memory).count("waiting")) == (0, 1)
    assert step(memory, missing(), 5.0 + POLICY.stockout_backoff_s + 1) == [("create", A)]
    assert memory.attempts == 3 and memory.zone == A


def test_after_a_failover_a_recreate_stays_in_the_zone_that_had_capacity() -> None:
    memory = Memory()
    step(memory, missing(), 0.0)
    assert step(memory, missing(create_result="capacity"), 5.0) == [("create", B)]
    assert step(memory, seen(READY, zone=B, agent=status(1, 20)), 10.0) == []
    assert step(memory, seen(PREEMPTED, zone=B), 20.0) == [("delete", B), ("create", B)]


def test_a_refused_create_request_finishes_failed_and_a_transient_one_is_retried() -> None:
    memory = Memory()
    step(memory, missing(), 0.0)
    assert step(memory, missing(create_result="retry", create_message="503 after 120 s"), 5.0) == [("create", A)]
    assert memory.attempts == 2 and memory.phase == "active"
    quota = "Quota limit 'TPUV3sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded"
    assert step(memory, missing(create_result="failed", create_message=quota), 10.0) == []
    assert (memory.phase, memory.outcome) == ("finished", "failed") and quota in (memory.reason or "")
    assert step(memory, missing(), 20.0) == []
    assert memory.attempts == 2


def test_budget_spent_finishes_budget_exhausted_and_deletes_the_node() -> None:
    memory = training()
    assert step(memory, seen(READY, agent=status(1, 40), spent_usd=0.99, budget_usd=1.0), 200.0) == []
    assert step(memory, seen(READY, agent=status(1, 60), spent_usd=1.0, budget_usd=1.0), 210.0) == [("delete", A)]
    assert (memory.phase, memory.outcome) == ("finished", "budget-exhausted")
    assert memory.reason == "spent $1.00 of a $1.00 budget"
    assert step(memory, missing(spent_usd=1.0, budget_usd=1.0), 220.0) == []


@pytest.mark.parametrize("exit_class", ["succeeded", "user-error", "diverged"])
def test_an_agent_that_ended_the_run_in_the_pass_that_finds_the_budget_spent_keeps_its_own_ending(
        exit_class: str) -> None:
    memory = training()
    spent = {"spent_usd": 1.2, "budget_usd": 1.0}
    assert step(memory, seen(READY, agent=status(1, 1000, exit_class), **spent), 200.0) == [("delete", A)]
    assert memory.outcome == exit_class


def test_an_agent_that_crashed_when_the_budget_is_spent_is_not_restarted() -> None:
    memory = training()
    spent = {"spent_usd": 1.2, "budget_usd": 1.0}
    assert step(memory, seen(READY, agent=status(1, 500, "crashed"), **spent), 200.0) == [("delete", A)]
    assert memory.outcome == "budget-exhausted" and memory.crashes == 0


def test_a_tiny_budget_is_reported_in_digits_that_show_it() -> None:
    memory = training()
    assert step(memory, seen(READY, spent_usd=0.0042, budget_usd=0.001), 200.0) == [("delete", A)]
    assert memory.reason == "spent $0.0042 of a $0.001 budget"


def test_budget_stops_a_kept_node_too() -> None:
    keep = Policy(zones=(A, B), keep_node=True)
    memory = training(keep)
    assert step(memory, unlisted(), 200.0, keep) == []
    assert step(memory, Observed(listed=False, spent_usd=5.0, budget_usd=1.0), 210.0, keep) == []
    assert memory.outcome == "budget-exhausted"
    assert step(memory, seen(READY), 220.0, keep) == [("delete", A)]  # seen again: it goes, --keep or not


def test_a_node_found_without_memory_of_creating_it_is_adopted_not_duplicated() -> None:
    """The pass that created it died before it wrote the run's memory."""
    memory = Memory()
    assert step(memory, seen(CREATING), 0.0) == []
    assert step(memory, seen(READY, agent=status(1, 20)), 5.0) == []
    assert memory.attempts == 1 and kinds(memory) == ["adopted", "ready"]


def test_a_reopened_run_gets_its_node_back_at_once() -> None:
    """``train --resume`` of a run stopped by its budget (then raised): active again, its node long gone."""
    memory = training()
    assert step(memory, seen(READY, spent_usd=2.0, budget_usd=1.0), 200.0) == [("delete", A)]
    assert step(memory, missing(), 210.0) == []
    memory.phase, memory.outcome, memory.reason, memory.crashes = "active", None, None, 0
    assert step(memory, missing(spent_usd=2.0, budget_usd=10.0), 5000.0) == [("create", A)]
    assert memory.preemptions == 0


def test_a_stop_request_finishes_the_run_stopped_and_deletes_its_node_even_a_kept_one() -> None:
    for policy in (POLICY, Policy(zones=(A, B), keep_node=True)):
        memory = training(policy)
        assert step(memory, seen(READY, agent=status(1, 60), stop="tpuops stop"), 200.0, policy) == [("delete", A)]
        assert (memory.finished, memory.outcome, memory.reason, memory.preemptions) == (
            True, "stopped", "tpuops stop", 0)
        # the next pass sees the node going, then gone, the agent saying it saved on the notice: no preemption
        assert step(memory, seen(DELETING, agent=status(1, 60, "preempted")), 210.0, policy) == []
        assert step(memory, missing(agent=status(1, 60, "preempted")), 220.0, policy) == []
        assert step(memory, missing(agent=status(1, 60, "preempted")), 230.0, policy) == []
        assert (memory.attempts, memory.preemptions, memory.crashes) == (1, 0, 0)
        assert kinds(memory)[-1] == "finished"


def test_a_stop_request_of_a_run_whose_node_is_gone_or_not_made_yet_only_finishes_it() -> None:
    memory = Memory()
    assert step(memory, unlisted(), 0.0) == []
    assert step(memory, Observed(listed=False, stop="tpuops stop"), 20.0) == []
    assert memory.finished and memory.outcome == "stopped" and memory.attempts == 0


def test_an_agent_that_ended_the_run_before_the_stop_keeps_its_own_ending() -> None:
    memory = training()
    assert step(memory, seen(READY, agent=status(1, 1000, "succeeded"), stop="tpuops stop"), 200.0) == [
        ("delete", A)]
    assert memory.outcome == "succeeded"


def test_a_slice_with_an_unhealthy_worker_is_recreated_after_the_grace_as_a_bounded_restart() -> None:
    policy = Policy(zones=(A, B), max_crashes=1, unhealthy_grace_s=60.0)
    memory = training(policy)
    sick = {"unhealthy_workers": (2,)}
    assert step(memory, seen(READY, agent=status(1, 30), **sick), 200.0, policy) == []
    assert kinds(memory)[-1] == "worker-down" and "worker 2" in memory.events[-1]["message"]
    assert step(memory, seen(READY, agent=status(1, 31), **sick), 260.0, policy) == []  # at the grace
    assert step(memory, seen(READY, agent=status(1, 32), **sick), 261.0, policy) == [("delete", A), ("create", A)]
    [restart] = [e for e in memory.events if e["kind"] == "unhealthy"]
    assert "worker 2 of the slice unhealthy" in restart["message"]
    assert (memory.crashes, memory.preemptions, memory.phase) == (1, 0, "active")
    assert "an unhealthy worker" in memory.events[-1]["message"]
    # the replacement is sick too: past max_crashes the run ends crashed and its node goes
    assert step(memory, seen(READY, agent=status(2, 32), **sick), 300.0, policy) == []
    assert step(memory, seen(READY, agent=status(2, 33), **sick), 400.0, policy) == [("delete", A)]
    assert (memory.phase, memory.outcome, memory.preemptions) == ("finished", "crashed", 0)


def test_a_node_that_stays_creating_past_the_create_timeout_never_booted_and_is_replaced_as_a_bounded_restart(
        ) -> None:
    policy = Policy(zones=(A, B), max_crashes=1, create_timeout_s=600.0)
    memory = Memory()
    assert step(memory, missing(), 0.0, policy) == [("create", A)]
    assert step(memory, seen(CREATING), 300.0, policy) == []
    assert step(memory, seen(CREATING), 600.0, policy) == []  # at the timeout: a slow boot still
    assert step(memory, seen(CREATING), 601.0, policy) == [("delete", A), ("create", A)]
    assert kinds(memory)[-2:] == ["unbooted", "create"] and "never booted" in memory.events[-1]["message"]
    assert (memory.crashes, memory.preemptions, memory.attempts) == (1, 0, 2)
    assert step(memory, seen(CREATING), 1000.0, policy) == []  # the replacement's clock starts at its create
    assert step(memory, seen(CREATING), 1202.0, policy) == [("delete", A)]  # past max_crashes: crashed
    assert (memory.phase, memory.outcome) == ("finished", "crashed")
    lost = training(policy)  # a create whose memory write was lost: the node's own create time dates it
    assert lost.pending_create is None
    assert step(lost, seen(CREATING, node_created=2000.0), 2600.0, policy) == []
    assert step(lost, seen(CREATING, node_created=2000.0), 2601.0, policy) == [("delete", A), ("create", A)]


def test_a_create_still_running_past_the_create_timeout_with_no_node_listed_is_a_bounded_unbooted_restart() -> None:
    policy = Policy(zones=(A, B), max_crashes=1, create_timeout_s=600.0)
    memory = Memory()  # the unbooted node was deleted, the memory of that lost: its create runs for ever (seed 1129)
    assert step(memory, missing(), 0.0, policy) == [("create", A)]
    memory.pending_create.operation = "op-1"
    running = {"create_result": CreateResult.RUNNING}
    assert step(memory, missing(**running), 600.0, policy) == []  # at the timeout: a slow create still
    assert step(memory, missing(**running), 601.0, policy) == [("create", A)]
    assert kinds(memory)[-2:] == ["unbooted", "create"] and (memory.crashes, memory.attempts) == (1, 2)
    memory.pending_create.operation = "op-2"
    assert step(memory, missing(**running), 1202.0, policy) == []  # past max_crashes: crashed, nothing to delete
    assert (memory.phase, memory.outcome) == ("finished", "crashed")


def test_a_worker_that_recovers_within_the_grace_changes_nothing() -> None:
    policy = Policy(zones=(A, B), unhealthy_grace_s=60.0)
    memory = training(policy)
    assert step(memory, seen(READY, agent=status(1, 30), unhealthy_workers=(1, 3)), 200.0, policy) == []
    assert step(memory, seen(READY, agent=status(1, 31)), 250.0, policy) == []
    assert kinds(memory)[-1] == "worker-up" and memory.unhealthy_since is None
    assert step(memory, seen(READY, agent=status(1, 32), unhealthy_workers=(1,)), 300.0, policy) == []
    assert step(memory, seen(READY, agent=status(1, 33), unhealthy_workers=(1,)), 340.0, policy) == []
    assert memory.crashes == 0 and memory.attempts == 1


def test_a_runs_policy_is_built_from_its_settings_and_its_record_in_one_place(tmp_path: Path) -> None:
    from tpuops.config import Settings, load_settings
    from tpuops.core.kinds import Capacity
    from tpuops.launch.provision import plan_up
    from tpuops.runs import NodeSpec, RunKind, RunRecord

    (tmp_path / "tpuops.toml").write_text('project = "p"\nzones = ["us-central1-a", "us-central1-b"]\n'
                                          "max_restarts = 7\nhang_after_s = 61.0\nunhealthy_grace_s = 9.0\n")
    settings = load_settings(config_path=tmp_path / "tpuops.toml", environ={"TPUOPS_HOME": str(tmp_path / "home")})
    request = plan_up(settings, "r1", accelerator="v2-8", capacity=Capacity.SPOT, zone=A, run_id="r1").request
    record = RunRecord(run_id="r1", kind=RunKind.TRAIN, node=NodeSpec.of(request, [A, B]), keep=True,
                       deadline_at=10_000.0, expected_s=3_000.0)
    policy = Policy.of(settings, record)
    assert (policy.zones, policy.max_crashes, policy.hang_after_s, policy.unhealthy_grace_s, policy.keep_node) == (
        (A, B), 7, 61.0, 9.0, True)
    assert policy.capacity is not None and policy.capacity.deadline_at == 10_000.0
    assert policy.capacity.hazard_per_hour == settings.spot_preemptions_per_hour  # a record without learned inputs
    unreadable = Policy.of(settings, None, zones=(B,))  # a damaged run: judged where its node was found
    assert (unreadable.zones, unreadable.keep_node, unreadable.capacity, unreadable.hang_after_s) == ((B,), False, None,
                                                                                                        61.0)
    with pytest.raises(ValueError, match="zones"):
        Policy.of(settings, None)
    defaults = Settings.model_fields  # a policy built field by field assumes what the settings would
    assert (Policy(zones=(A,)).max_crashes, Policy(zones=(A,)).boot_timeout_s) == (
        defaults["max_restarts"].default, defaults["boot_timeout_s"].default)
