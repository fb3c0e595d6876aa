"""An elastic run's sizes in its forecast and its deadline policy (``tpuops.billing.elastic``), and the controller
acting on the choice among waiting for the largest size, the smaller size and on-demand of the largest.

The sizes are a v2-32 (16 chips, 4 hosts) and a v2-8 (4 chips, 1 host: 4 micro-batches a step) at the catalog's
us-central1 prices, spot preemptions of 0.1 an hour a host, 15-minute recoveries and 2-hour stockout spells.
"""

from __future__ import annotations

import math

import pytest

from tpuops.billing.deadline import Rule
from tpuops.billing.elastic import ON_TIME, Move, SizeTerms, choose_size, on_demand, smaller, wait
from tpuops.controller.decide import Observed, Policy, Size, decide
from tpuops.core.create_result import CreateResult
from tpuops.core.kinds import Capacity
from tpuops.runs import Memory

pytestmark = pytest.mark.unit

HOUR = 3600.0
RECOVERY = 900.0
SPELL = 2 * HOUR
BIG = SizeTerms("v2-32", 1.0, 16 * 0.3375, 16 * 1.125, 0.4, 0.04, SPELL)
SMALL = SizeTerms("v2-8", 4.0, 4 * 0.3375, 4 * 1.125, 0.1, 0.01, SPELL)
WORK = 10 * HOUR


def test_a_size_wholly_costs_its_chip_hours_with_its_preemptions_and_a_step_costs_alike_on_every_size() -> None:
    f_big, f_small = 1 / (1 - 0.4 * 0.25), 1 / (1 - 0.1 * 0.25)
    assert BIG.hours(WORK, RECOVERY) == pytest.approx((RECOVERY + WORK * f_big) / HOUR)
    assert SMALL.hours(WORK, RECOVERY) == pytest.approx((RECOVERY + 4 * WORK * f_small) / HOUR)
    assert BIG.usd(WORK, RECOVERY, on_demand=True) == pytest.approx(10 * 18.0)
    # 4 chips for 4x as long: the same chip-hours, cheaper only by the single host's fewer preemptions
    assert SMALL.usd(WORK, RECOVERY) == pytest.approx(10 * 5.4 * f_small)
    assert SMALL.usd(WORK, RECOVERY) < BIG.usd(WORK, RECOVERY)
    assert BIG.stocked_out_share() == pytest.approx(0.08 / 1.08)


def test_wait_is_the_spell_then_the_work_and_on_time_when_the_spell_ends_in_the_slack() -> None:
    option = wait(WORK, 20 * HOUR, BIG, RECOVERY)
    run_s = RECOVERY + WORK / 0.9
    assert option.hours == pytest.approx((SPELL + run_s) / HOUR)
    assert option.on_time == pytest.approx(1 - math.exp(-(20 * HOUR - run_s) / SPELL))
    assert wait(WORK, run_s - 1, BIG, RECOVERY).on_time == 0.0


def test_the_smaller_size_matches_a_simulation_of_its_piecewise_timeline() -> None:
    """The closed form against the same timeline drawn 200,000 times (the largest returns after an exponential
    spell; the run moves up then unless it is done)."""
    import random

    rng, k, f = random.Random(7), 4.0 / (1 - 0.1 * 0.25), 1 / (1 - 0.4 * 0.25)
    times, left, on_time = [], 14 * HOUR, 0
    for _ in range(200_000):
        t = rng.expovariate(1 / SPELL)
        done = RECOVERY + k * WORK if t >= k * WORK else 2 * RECOVERY + t + (WORK - t / k) * f
        times.append(done)
        on_time += done <= left
    option = smaller(WORK, left, BIG, SMALL, RECOVERY)
    assert option.hours * HOUR == pytest.approx(sum(times) / len(times), rel=0.01)
    assert option.on_time == pytest.approx(on_time / len(times), abs=0.01)


def test_a_loose_deadline_and_a_costlier_smaller_size_wait_for_the_largest() -> None:
    """A v2-8 whose accumulation costs more than its chips save (5x the time on a quarter of the chips)."""
    slow = SizeTerms("v2-8", 5.0, SMALL.spot_usd_per_hour, SMALL.on_demand_usd_per_hour, 0.1, 0.01, SPELL)
    plan = choose_size(WORK, 40 * HOUR, BIG, slow, RECOVERY)
    assert plan.move is Move.WAIT
    assert plan.option(Move.WAIT).on_time >= ON_TIME
    assert plan.option(Move.WAIT).usd < plan.option(Move.SMALLER).usd < plan.option(Move.ON_DEMAND).usd
    assert "wait" in plan.reason and "smaller" in plan.reason and "on-demand" in plan.reason


def test_a_deadline_the_wait_may_miss_takes_the_smaller_size() -> None:
    plan = choose_size(WORK, 15.5 * HOUR, BIG, SMALL, RECOVERY)
    assert plan.option(Move.WAIT).on_time < ON_TIME <= plan.option(Move.SMALLER).on_time
    assert plan.move is Move.SMALLER
    assert plan.option(Move.SMALLER).usd < plan.option(Move.ON_DEMAND).usd / 2


def test_a_tight_deadline_takes_on_demand_of_the_largest() -> None:
    plan = choose_size(WORK, 12 * HOUR, BIG, SMALL, RECOVERY)
    assert plan.move is Move.ON_DEMAND
    assert plan.option(Move.ON_DEMAND).on_time == 1.0
    assert max(plan.option(Move.WAIT).on_time, plan.option(Move.SMALLER).on_time) < ON_TIME


def test_nothing_on_time_takes_the_likeliest_and_a_run_on_the_smaller_size_never_stops_to_wait() -> None:
    late = choose_size(WORK, 9 * HOUR, BIG, SMALL, RECOVERY)
    assert late.move is Move.ON_DEMAND and "likeliest" in late.reason
    running = choose_size(WORK, 15.5 * HOUR, BIG, SMALL, RECOVERY, running_smaller=True)
    assert [o.move for o in running.options] == [Move.SMALLER, Move.ON_DEMAND]
    assert running.option(Move.SMALLER).on_time >= choose_size(WORK, 15.5 * HOUR, BIG, SMALL, RECOVERY) \
        .option(Move.SMALLER).on_time  # no create to wait for


def test_the_rule_weighs_the_work_left_at_the_largest_sizes_pace() -> None:
    rule = Rule(Capacity.SPOT, deadline_at=15.5 * HOUR, expected_s=WORK, sizes=(BIG, SMALL), recovery_s=RECOVERY)
    assert rule.size_plan(0.0, 0, None, None, 0).move is Move.SMALLER  # type: ignore[union-attr]
    # measured on the v2-8: 1 step/s there is 4 steps/s of the v2-32's work; 36,000 steps left are 2.5 h of it
    measured = rule.size_plan(0.0, 0, 36_000, 1.0, 1)
    assert measured is not None and measured.option(Move.SMALLER).hours < 11
    assert Rule(Capacity.SPOT, sizes=(BIG, SMALL)).size_plan(0.0, 0, None, None, 0) is None  # no deadline
    assert on_demand(WORK, 0.0, BIG, RECOVERY).on_time == 0.0


# -- the controller acting on it ------------------------------------------------------------------------------

A, B = "us-central1-a", "us-central1-b"
SIZES = (Size("v2-32", (A,)), Size("v2-8", (B,)))


def _policy(due_h: float) -> Policy:
    rule = Rule(Capacity.SPOT, deadline_at=due_h * HOUR, expected_s=WORK, recovery_s=RECOVERY, sizes=(BIG, SMALL))
    return Policy(zones=(A, B), stockout_backoff_s=300.0, sizes=SIZES, capacity=rule, elastic_wait_s=86_400.0)


def _stocked_out(policy: Policy) -> tuple[Memory, list[tuple[str, str]]]:
    """The run's first create of the v2-32 refused: what the next create asks for."""
    memory = Memory()
    assert [(a.kind, a.zone) for a in decide(memory, Observed(listed=True), 0.0, policy).actions] == [("create", A)]
    refused = Observed(listed=True, create_result=CreateResult.CAPACITY, create_message="no v2-32")
    return memory, [(a.kind, a.zone) for a in decide(memory, refused, 10.0, policy).actions]


def test_the_controller_waits_for_the_largest_when_the_policy_says_wait() -> None:
    slow = SizeTerms("v2-8", 5.0, SMALL.spot_usd_per_hour, SMALL.on_demand_usd_per_hour, 0.1, 0.01, SPELL)
    rule = Rule(Capacity.SPOT, deadline_at=40 * HOUR, expected_s=WORK, recovery_s=RECOVERY, sizes=(BIG, slow))
    memory, created = _stocked_out(Policy(zones=(A, B), stockout_backoff_s=300.0, sizes=SIZES, capacity=rule))
    assert created == [] and memory.size == 0 and memory.size_move == "wait"  # elastic_wait_s is 0: the plan rules
    assert any(e["kind"] == "size-plan" and "wait (cheapest" in e["message"] for e in memory.events)


def test_the_controller_takes_the_smaller_size_at_once_when_the_policy_says_so() -> None:
    memory, created = _stocked_out(_policy(15.5))  # elastic.wait of a day would hold it; the deadline does not
    assert created == [("create", B)] and memory.size == 1 and memory.size_move == "smaller"
    assert memory.capacity is None  # still spot


def test_the_controller_takes_the_largest_on_demand_when_the_policy_says_so_and_keeps_it() -> None:
    memory, created = _stocked_out(_policy(12.0))
    assert created == [("create", A)] and memory.size == 0
    assert memory.capacity is Capacity.ON_DEMAND and memory.size_move == "on-demand"
    assert memory.blocked_zones == {f"v2-32@{A}": 310.0}  # spot's stockout does not block on-demand
    memory.blocked_zones.clear()  # spot back: on-demand stays to the end
    assert not any(a.kind == "delete" for a in decide(memory, Observed(listed=True), 400.0, _policy(12.0)).actions)
    assert memory.capacity is Capacity.ON_DEMAND


def _training_on_small(step: int, total: int) -> Observed:
    from tpuops.providers.nodes import NodeState
    from tpuops.runs import AgentStatus

    status = AgentStatus.model_validate({"attempt": 2, "step": step, "total_steps": total, "phase": "training"})
    return Observed(listed=True, node_state=NodeState.READY, node_zone=B, node_accelerator="v2-8", node_uid="u2",
                    node_capacity=Capacity.SPOT, status=status)


def test_uniform_progress_weighs_a_speed_measured_on_the_smaller_size_at_the_largests_pace() -> None:
    """On the v2-8 at 1 step/s, 36,000 steps left are 10 h there but 2.5 h of v2-32 work: with 5 h left and the
    v2-32's spot open again, spot still fits (read as 10 h it would have moved the run to on-demand)."""
    memory = Memory(size=1, speed=1.0, attempts=2, ready_since=0.0, progress_at=0.0)
    decide(memory, _training_on_small(0, 36_000), 0.0, _policy(5.0))
    assert memory.capacity is None and not any(e["kind"] == "capacity" for e in memory.events)


def test_a_run_on_on_demand_stays_there_while_its_largests_spot_is_stocked_out_and_a_size_change_drops_the_speed(
        ) -> None:
    memory = Memory(capacity=Capacity.ON_DEMAND, speed=4.0, blocked_zones={f"v2-32@{A}": 10_000.0})
    decide(memory, Observed(listed=True), 100.0, _policy(40.0))  # loose: uniform progress alone would go back to spot
    assert memory.capacity is Capacity.ON_DEMAND and memory.size_move is None
    moving = Memory(speed=4.0)  # measured on the v2-32 before it was preempted, say
    decide(moving, Observed(listed=True), 0.0, _policy(15.5))
    decide(moving, Observed(listed=True, create_result=CreateResult.CAPACITY), 10.0, _policy(15.5))
    assert moving.size == 1 and moving.speed is None  # the v2-32's speed is not the v2-8's
