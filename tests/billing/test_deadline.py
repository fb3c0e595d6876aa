"""The deadline policy (``tpuops.billing.deadline``) on hand-made timelines, and the controller steering a run by it.

The timelines are a 24-hour job due in 36 hours, spot at 0.5 preemptions an hour, 15-minute recoveries,
played pass by pass (every 5 minutes) so that each test names the pass a switch must happen at.
"""

from __future__ import annotations

import pytest

from tpuops.billing.deadline import MARGIN, RETURN_RESERVES, Rule, Situation, choose, fallback, spot_needs_s
from tpuops.controller.decide import Observed, Policy, decide
from tpuops.core.kinds import Capacity
from tpuops.providers.nodes import NodeState
from tpuops.runs import AgentStatus, Memory

pytestmark = pytest.mark.unit

HOUR = 3600.0
WORK, DUE, HAZARD, RECOVERY = 24 * HOUR, 36 * HOUR, 0.5, 900.0
PASS = 300.0


def _at(now: float, remaining: float, on_demand: bool) -> Situation:
    return Situation(now, DUE, remaining, on_demand, HAZARD, RECOVERY)


def test_spot_needs_the_work_over_the_share_recoveries_leave_plus_a_reserve_and_the_margin() -> None:
    lost = HAZARD / HOUR * RECOVERY  # 0.125 of spot time goes to recoveries
    assert spot_needs_s(_at(0.0, WORK, False)) == pytest.approx(WORK / (1 - lost) + RECOVERY + MARGIN * WORK)
    assert spot_needs_s(Situation(0.0, DUE, WORK, False, 4.0, RECOVERY)) == float("inf")  # 4/h x 15 min >= 1


def test_a_stalled_run_stays_on_spot_while_it_fits_and_moves_to_on_demand_the_first_pass_it_does_not() -> None:
    needs = spot_needs_s(_at(0.0, WORK, False))  # about 28.9 h: spot fits 36 h with 7.1 h to spare
    choices = [(now, choose(_at(now, WORK, False))) for now in range(0, int(DUE), int(PASS))]
    first = next(now for now, choice in choices if choice.on_demand)
    assert first == pytest.approx(DUE - needs, abs=PASS)  # the first pass past the last moment spot fits
    assert first > DUE - needs
    assert not any(choice.on_demand for now, choice in choices if now < first)
    reason = choose(_at(first, WORK, False)).reason
    assert "needs 28.9 h on spot with its expected recoveries, only 28.8 h left" in reason


def test_on_demand_returns_to_spot_once_slack_allows_a_move_back_and_not_one_pass_sooner() -> None:
    moved = DUE - spot_needs_s(_at(0.0, WORK, False)) + PASS  # on-demand from here, at full speed
    timeline = [(moved + k * PASS, WORK - k * PASS) for k in range(int(WORK / PASS))]
    back = next(now for now, left in timeline if not choose(_at(now, left, True)).on_demand)
    work_then = dict(timeline)[back]
    spare = RETURN_RESERVES * RECOVERY
    assert RETURN_RESERVES >= 1  # at least the move back's own recovery
    assert DUE - back >= spot_needs_s(_at(back, work_then, True)) + spare  # the move back's recoveries fit
    before = back - PASS
    assert DUE - before < spot_needs_s(_at(before, work_then + PASS, True)) + spare
    # Hysteresis: on spot with that slack the run would stay; on on-demand it waits for more recoveries.
    assert any(not choose(_at(now, left, False)).on_demand and choose(_at(now, left, True)).on_demand
               for now, left in timeline)
    assert "slack returned" in choose(_at(back, work_then, True)).reason


def test_a_run_on_spot_that_keeps_pace_never_moves() -> None:
    timeline = [(k * PASS, WORK - k * PASS * 0.9) for k in range(int(WORK / (PASS * 0.9)))]
    assert all(not choose(_at(now, left, False)).on_demand for now, left in timeline)


def test_work_that_cannot_fit_even_on_demand_is_on_demand_and_says_it_may_be_late() -> None:
    choice = choose(_at(DUE - 10 * HOUR, 12 * HOUR, False))
    assert choice.on_demand and choice.reason.endswith("it may be late even there")


def test_the_fallback_is_spot_until_the_first_preemption() -> None:
    assert fallback(0).capacity is Capacity.SPOT
    assert fallback(1).on_demand and fallback(3).on_demand
    assert fallback(0, Capacity.PREEMPTIBLE).capacity is Capacity.PREEMPTIBLE


def test_remaining_work_uses_the_measured_speed_and_else_the_expected_length() -> None:
    rule = Rule(Capacity.SPOT, deadline_at=DUE, expected_s=WORK)
    assert rule.remaining_s(250, 1000, 0.5) == 1500.0
    assert rule.remaining_s(250, 1000, None) == 0.75 * WORK
    assert rule.remaining_s(0, None, None) == WORK


# -- the controller's decide, steered by the rule ----------------------------------------------------------------

A = "us-central1-a"
RULE = Rule(Capacity.SPOT, deadline_at=DUE, expected_s=WORK, hazard_per_hour=HAZARD, recovery_s=RECOVERY)
POLICY = Policy(zones=(A,), capacity=RULE)


def _status(attempt: int, step: int, total: int = 24 * 3600) -> AgentStatus:
    return AgentStatus(attempt=attempt, step=step, total_steps=total, phase="training")


def _actions(memory: Memory, observed: Observed, now: float) -> list[str]:
    return [a.kind.value for a in decide(memory, observed, now, POLICY).actions]


def test_a_preempted_run_short_of_time_is_recreated_on_demand_and_the_event_says_why() -> None:
    memory = Memory()
    assert _actions(memory, Observed(listed=True), 0.0) == ["create"]
    assert memory.capacity is None  # 24 h of work fits 36 h on spot
    ready = Observed(listed=True, node_state=NodeState.READY, node_zone=A, node_capacity=Capacity.SPOT)
    assert _actions(memory, ready, 60.0) == []
    late = 10 * HOUR  # still at step 0: 24 h of work, 26 h left
    preempted = Observed(listed=True, node_state=NodeState.PREEMPTED, node_zone=A, node_capacity=Capacity.SPOT,
                         node_uid="1", status=_status(1, 0))
    assert _actions(memory, preempted, late) == ["delete", "create"]
    assert memory.capacity is Capacity.ON_DEMAND  # the create the reconcile applies asks for on-demand
    switched = [e for e in memory.events if e["kind"] == "capacity"]
    assert len(switched) == 1 and switched[0]["message"].endswith("moving from spot to on-demand at the next "
                                                                   "checkpoint")
    assert "only 26.0 h left before the deadline" in switched[0]["message"]


def test_a_ready_spot_node_is_moved_through_a_checkpoint_and_back_when_slack_returns() -> None:
    memory = Memory(attempts=1, zone=A)
    spot = Observed(listed=True, node_state=NodeState.READY, node_zone=A, node_uid="1",
                    node_capacity=Capacity.SPOT, status=_status(1, 0))
    assert _actions(memory, spot, 10 * HOUR) == ["delete", "create"]  # 24 h of work, 26 h left
    assert [e["kind"] for e in memory.events][-3:] == ["capacity", "checkpoint", "create"]
    on_demand = Observed(listed=True, node_state=NodeState.READY, node_zone=A, node_uid="2",
                         node_capacity=Capacity.ON_DEMAND, status=_status(2, 20 * 3600))
    assert _actions(memory, on_demand, 12 * HOUR) == ["delete", "create"]  # 4 h of work, 24 h left
    assert memory.capacity is Capacity.SPOT and "slack returned" in memory.events[-3]["message"]


def test_the_pass_measures_the_runs_speed_from_its_progress() -> None:
    memory = Memory(attempts=1, zone=A)
    for now, step in ((0.0, 100), (600.0, 400), (1200.0, 700)):
        _actions(memory, Observed(listed=True, node_state=NodeState.READY, node_zone=A, node_capacity=Capacity.SPOT,
                                  status=_status(1, step)), now)
    assert memory.speed == pytest.approx(0.5)


def test_a_run_without_a_rule_keeps_its_capacity() -> None:
    memory = Memory(attempts=1, zone=A)
    observed = Observed(listed=True, node_state=NodeState.READY, node_zone=A, node_capacity=Capacity.SPOT,
                        status=_status(1, 0))
    assert decide(memory, observed, 30 * HOUR, Policy(zones=(A,))).actions == []
    assert memory.capacity is None
