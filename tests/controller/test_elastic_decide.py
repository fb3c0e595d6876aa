"""``decide`` for elastic runs (``accelerator: [v2-32, v2-8]``): which size a create asks for, when a run moves
down and back up, and what a move is never counted as (docs/design.md, "Elastic sizes").

Each test plays a run's passes against one ``Memory``, as tests/test_controller_decide.py does.
"""

from __future__ import annotations

from typing import Any

import pytest

from tpuops.controller.decide import Observed, Policy, Size, decide
from tpuops.core.create_result import CreateResult
from tpuops.core.errors import UsageError
from tpuops.providers.nodes import NodeState
from tpuops.providers.offers import check_sizes
from tpuops.providers.registry import offers_of
from tpuops.runs import AgentStatus, Memory, PendingCreate

pytestmark = pytest.mark.unit

A, B = "us-central1-a", "us-central1-b"
BIG, SMALL = "v2-32", "v2-8"
BACKOFF = 120.0
PROBE_EVERY = 600.0
POLICY = Policy(zones=(A, B), stockout_backoff_s=BACKOFF, sizes=(Size(BIG, (A,)), Size(SMALL, (B,))),
                probe_every_s=PROBE_EVERY)
READY = NodeState.READY


def training(step: int, attempt: int = 1) -> AgentStatus:
    return AgentStatus.model_validate({"attempt": attempt, "step": step, "phase": "training"})


def ready(accelerator: str, zone: str, step: int = 10, attempt: int = 1, **fields: Any) -> Observed:
    return Observed(listed=True, node_state=READY, node_zone=zone, node_accelerator=accelerator,
                    node_uid=f"uid-{accelerator}", status=training(step, attempt), **fields)


def actions(memory: Memory, observed: Observed, now: float, policy: Policy = POLICY) -> list[tuple[str, str]]:
    return [(a.kind, a.zone) for a in decide(memory, observed, now, policy).actions]


def kinds(memory: Memory) -> list[str]:
    return [event["kind"] for event in memory.events]


def on_small(policy: Policy = POLICY) -> Memory:
    """A run whose largest size stocked out in its only zone, now READY on the smaller one (at t=20)."""
    memory = Memory()
    assert actions(memory, Observed(listed=True), 0.0, policy) == [("create", A)]
    assert memory.size == 0
    stocked = Observed(listed=True, create_result=CreateResult.CAPACITY, create_message="no v2-32")
    assert actions(memory, stocked, 10.0, policy) == [("create", B)]
    assert memory.size == 1
    assert actions(memory, ready(SMALL, B), 20.0, policy) == []
    return memory


def test_the_largest_size_stocked_out_everywhere_creates_the_next_size() -> None:
    memory = on_small()
    assert memory.blocked_zones == {f"{BIG}@{A}": 10.0 + BACKOFF}  # v2-32 in a is blocked, v2-8 nowhere
    assert kinds(memory) == ["create", "stockout", "size-down", "create", "ready"]
    assert memory.events[3]["message"].startswith(f"attempt 2 of {SMALL} in {B}")
    assert memory.preemptions == memory.crashes == memory.moves == 0


def test_the_largest_size_refused_in_each_zone_one_pass_apart_is_out_everywhere() -> None:
    """Passes as far apart as the backoff (300 s both, the defaults): each zone's block ends as the next begins, yet
    the size was refused everywhere, so the run goes down (the swarm's sweeps: a trial asked v2-32 twenty times)."""
    policy = Policy(zones=(A, B), stockout_backoff_s=300.0, sizes=(Size(BIG, (A, B)), Size(SMALL, (A, B))),
                    probe_every_s=PROBE_EVERY)
    memory = Memory()
    assert actions(memory, Observed(listed=True), 0.0, policy) == [("create", A)]
    stocked = Observed(listed=True, create_result=CreateResult.CAPACITY)
    assert actions(memory, stocked, 300.0, policy) == [("create", B)]  # v2-32 failed over to b
    assert memory.size == 0
    # a's block ended at 600 as b's began: v2-32 was refused in every zone, one pass apart
    assert actions(memory, stocked, 600.0, policy) == [("create", B)]  # v2-8, in the zone it was last in
    assert memory.size == 1 and kinds(memory).count("size-down") == 1, kinds(memory)
    assert memory.events[-1]["message"].startswith(f"attempt 3 of {SMALL} in {B}")


def test_the_elastic_wait_holds_the_largest_size_before_going_down() -> None:
    policy = Policy(zones=(A, B), stockout_backoff_s=BACKOFF, sizes=POLICY.sizes, elastic_wait_s=300.0)
    memory = Memory()
    actions(memory, Observed(listed=True), 0.0, policy)
    stocked = Observed(listed=True, create_result=CreateResult.CAPACITY)
    assert actions(memory, stocked, 10.0, policy) == []  # waiting for v2-32, not yet on v2-8
    assert memory.size == 0 and kinds(memory)[-1] == "waiting"
    assert "waiting up to 300 s more" in memory.events[-1]["message"]
    assert actions(memory, Observed(listed=True), 200.0, policy) == [("create", A)]  # its backoff is over: v2-32
    assert actions(memory, stocked, 210.0, policy) == []  # out again: still within the wait, from t=10
    assert actions(memory, Observed(listed=True), 309.0, policy) == []
    assert actions(memory, Observed(listed=True), 311.0, policy) == [("create", B)]  # the wait is over: v2-8
    assert memory.size == 1 and "size-down" in kinds(memory)


def test_a_run_on_the_smaller_size_probes_the_larger_one_and_a_stockout_blocks_it_again() -> None:
    memory = on_small()
    assert actions(memory, ready(SMALL, B, 20), 100.0) == []  # v2-32 still blocked: no probe
    assert actions(memory, ready(SMALL, B, 30), 10.0 + BACKOFF + 1) == [("probe", A)]
    assert memory.probe is not None and memory.probe_size == 0
    assert actions(memory, ready(SMALL, B, 40, probe_result=CreateResult.RUNNING), 140.0) == []
    refused = ready(SMALL, B, 50, probe_result=CreateResult.CAPACITY)
    assert actions(memory, refused, 150.0) == []  # nothing to delete: the zone refused it
    assert memory.probe is None and memory.blocked_zones[f"{BIG}@{A}"] == 150.0 + BACKOFF
    assert actions(memory, ready(SMALL, B, 60), 150.0 + BACKOFF + 1) == []  # probes every probe_every_s only
    assert actions(memory, ready(SMALL, B, 70), 131.0 + PROBE_EVERY) == [("probe", A)]
    assert memory.preemptions == memory.crashes == memory.moves == 0


def test_the_larger_size_returning_moves_the_run_up_through_a_checkpoint_never_a_preemption() -> None:
    memory = on_small()
    assert actions(memory, ready(SMALL, B), 200.0) == [("probe", A)]
    got = ready(SMALL, B, 80, probe_result=CreateResult.OK, probe_ready=True)
    # The probe's node goes, then the run's v2-8 node (its delete makes the agent save), then v2-32 is created.
    assert actions(memory, got, 260.0) == [("unprobe", A), ("delete", B), ("create", A)]
    assert memory.size == 0 and memory.moves == 1
    assert kinds(memory)[-3:] == ["size-up", "moved-up", "create"]
    assert memory.events[-1]["message"].startswith(f"attempt 3 of {BIG} in {A}")
    # The v2-8 node still listed PREEMPTED by a listing from before its delete completed: not a preemption.
    stale = Observed(listed=True, node_state=NodeState.PREEMPTED, node_zone=B, node_accelerator=SMALL,
                     node_uid=f"uid-{SMALL}")
    assert actions(memory, stale, 270.0) == []
    saved = AgentStatus.model_validate({"attempt": 1, "step": 80, "last_checkpoint_step": 80, "phase": "done",
                                        "exit_class": "preempted", "attempts": [{"attempt": 1, "started_at": 10.0}]})
    assert actions(memory, Observed(listed=True, status=saved), 280.0) == []
    assert memory.events[-1]["message"] == "agent checkpointed at step 80 on the notice of a planned move to a " \
                                           "larger size"
    assert actions(memory, ready(BIG, A, 80, attempt=2), 300.0) == []
    assert memory.preemptions == memory.crashes == 0 and memory.size_wait_since is None
    assert actions(memory, ready(BIG, A, 90, attempt=2), 300.0 + 2 * PROBE_EVERY) == []  # largest: no probe
    # Preempted later on the larger size, the agent's report read before the PREEMPTED node: the move came before
    # that attempt started, so what it saved on was a preemption's notice, not the move's.
    later = AgentStatus.model_validate({"attempt": 2, "step": 95, "last_checkpoint_step": 95, "phase": "done",
                                        "exit_class": "preempted", "attempts": [{"attempt": 2, "started_at": 290.0}]})
    actions(memory, Observed(listed=True, status=later), 310.0 + 2 * PROBE_EVERY)
    assert memory.events[-1]["message"] == "agent checkpointed at step 95 on a preemption notice"


def test_a_stop_is_never_undone_by_a_move() -> None:
    memory = on_small()
    assert actions(memory, ready(SMALL, B), 200.0) == [("probe", A)]
    stopped = ready(SMALL, B, 80, probe_result=CreateResult.OK, probe_ready=True, stop="tpuops stop")
    assert actions(memory, stopped, 260.0) == [("delete", B), ("unprobe", A)]  # no create of the larger size
    assert memory.finished and memory.moves == 0 and memory.probe is None
    assert actions(memory, Observed(listed=True), 300.0) == []  # a finished run creates nothing, at any size
    assert kinds(memory).count("create") == 2


def test_a_run_whose_node_is_down_creates_the_largest_size_again_once_its_backoff_is_over() -> None:
    memory = on_small()
    preempted = Observed(listed=True, node_state=NodeState.PREEMPTED, node_zone=B, node_accelerator=SMALL,
                         node_uid="uid-small")
    assert actions(memory, preempted, 10.0 + BACKOFF + 1) == [("delete", B), ("create", A)]
    assert memory.preemptions == 1 and memory.size == 0 and "size-up" in kinds(memory)


def test_a_probe_in_flight_when_the_run_finishes_is_deleted() -> None:
    memory = on_small()
    memory.probe, memory.probe_size = PendingCreate(zone=A, at=200.0, operation="op-1"), 0
    done = AgentStatus.model_validate({"attempt": 1, "step": 100, "phase": "done", "exit_class": "succeeded"})
    observed = Observed(listed=True, node_state=READY, node_zone=B, node_accelerator=SMALL, status=done)
    assert actions(memory, observed, 300.0) == [("delete", B), ("unprobe", A)]
    assert memory.finished and memory.probe is None


@pytest.mark.parametrize(("sizes", "error"), [
    (["v2-32", "v3-8"], "different generations (v2, v3)"),
    (["v2-8", "v2-32"], "largest first: v2-32 (16 chips) comes after v2-8 (4 chips)"),
    (["v2-32", "v2-9"], "v2-9"),
])
def test_sizes_are_checked_against_the_providers_offers(sizes: list[str], error: str) -> None:
    with pytest.raises(UsageError, match=error.replace("(", r"\(").replace(")", r"\)")) as raised:
        check_sizes(offers_of("cloud-tpu"), sizes)
    assert "\n" not in str(raised.value)


def test_sizes_largest_first_of_one_generation_pass() -> None:
    assert [shape.chips for shape in check_sizes(offers_of("cloud-tpu"), ["v2-32", "v2-8"])] == [16, 4]
