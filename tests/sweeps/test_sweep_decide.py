"""The sweep pass's rules as a pure function, and the sweep spec's validation: no server, no Optuna, no TF."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO

from tpuops.contract.exits import ExitClass
from tpuops.core.errors import UsageError
from tpuops.runs.outcome import COUNTS_AS_FAILURE, OUTCOME_OF_EXIT, Outcome
from tpuops.sweeps.decide import (
    TRIAL_STATE,
    RunView,
    SweepView,
    TrialState,
    TrialView,
    decide,
    objective_of,
)
from tpuops.sweeps.spec import Endgame, grid_points, load_sweep
from tpuops.sweeps.status import lost_to_recompute

pytestmark = pytest.mark.unit



def view(*trials: TrialView, **limits: object) -> SweepView:
    base: dict[str, object] = {"wanted": 4, "parallel": 2, "max_preemptions": 3, "max_failures": 2}
    base.update(limits)
    return SweepView(trials=tuple(trials), **base)  # type: ignore[arg-type]


def running(number: int, **run: object) -> TrialView:
    reported = run.pop("reported", -1)
    return TrialView(number, TrialState.RUNNING, reported=int(reported), run=RunView(**{"finished": False, **run}))


def finished(number: int, outcome: str, **run: object) -> TrialView:
    return TrialView(number, TrialState.RUNNING, run=RunView(finished=True, outcome=Outcome(outcome), **run))


def test_a_new_sweep_launches_up_to_parallel() -> None:
    plan = decide(view())
    assert (plan.launch, plan.ended, plan.adopt) == (2, None, [])


def test_launches_stop_at_the_number_of_trials() -> None:
    trials = [TrialView(n, TrialState.COMPLETE) for n in range(3)]
    assert decide(view(*trials)).launch == 1
    assert decide(view(*trials, running(3))).launch == 0


def test_a_running_trial_without_a_run_is_adopted_and_takes_its_slot() -> None:
    plan = decide(view(TrialView(0, TrialState.RUNNING, run=None)))
    assert plan.adopt == [0] and plan.launch == 1


@pytest.mark.parametrize("limits", [{"stopping": True}, {"budget_usd": 1.0, "spent_usd": 1.0}])
def test_a_stopped_or_spent_sweep_tells_a_trial_without_a_run_failed_and_adopts_nothing(
        limits: dict[str, object]) -> None:
    """Adopted, its run would get a node from the run pass that follows, for a sweep that has ended (the swarm's
    seed 21: a node created 90 minutes after ``stop --sweep``)."""
    plan = decide(view(TrialView(0, TrialState.RUNNING, run=None), **limits))
    assert plan.adopt == [] and plan.launch == 0
    assert [(t.number, t.state, t.value, t.failure) for t in plan.tells] == [(0, TrialState.FAIL, None, False)]
    assert "before its run was declared" in plan.tells[0].why and plan.ended is not None


def test_a_trial_whose_run_no_controller_drove_yet_is_adopted_again_every_pass_until_one_does() -> None:
    """Its index markers may be missing (a pass died after the record): adopting rewrites them (the swarm's seed
    138 waited 48 hours for a run the controller never listed)."""
    assert decide(view(running(0, driven=False))).adopt == [0]
    assert decide(view(running(0, driven=True))).adopt == []
    assert decide(view(running(0, driven=False), stopping=True)).adopt == []


def test_values_are_reported_in_step_order_above_the_high_water_mark_once() -> None:
    trial = running(0, evals=((20, 0.5), (40, 0.6), (20, 0.55), (60, float("nan")), (40, 0.61)), reported=20)
    plan = decide(view(trial))
    assert plan.reports == [(0, 40, 0.61)]  # 20 was reported already; a NaN is never reported
    assert plan.prune_candidates == [0]
    assert decide(view(running(0, evals=((20, 0.5),), reported=20))).prune_candidates == []


def test_a_preempted_running_trial_is_neither_told_nor_replaced() -> None:
    plan = decide(view(running(0, preemptions=2), running(1)))
    assert (plan.tells, plan.stops, plan.launch) == ([], [], 0)


def test_too_many_preemptions_stop_the_trial_without_counting_a_failure() -> None:
    plan = decide(view(running(0, preemptions=4)))
    assert [(s.number, s.outcome) for s in plan.stops] == [(0, "preempted-out")]
    told = decide(view(finished(0, "preempted-out", reason="preempted 4 times")))
    assert [(t.state, t.failure) for t in told.tells] == [("FAIL", False)]


@pytest.mark.parametrize(("outcome", "state", "failure"), [
    ("succeeded", "COMPLETE", False), ("user-error", "FAIL", True), ("crashed", "FAIL", True),
    ("failed", "FAIL", True), ("pruned", "PRUNED", False), ("stopped", "PRUNED", False),
    ("budget-exhausted", "PRUNED", False), ("diverged", "FAIL", False),
])
def test_finished_runs_are_told_by_their_outcome(outcome: str, state: str, failure: bool) -> None:
    plan = decide(view(finished(0, outcome, final=0.9, evals=((20, 0.4),))))
    assert [(t.number, t.state, t.failure) for t in plan.tells] == [(0, state, failure)]
    assert plan.tells[0].value == (0.9 if state == "COMPLETE" else None)
    assert plan.reports == [(0, 20, 0.4)]  # the values still unreported go first


def test_a_stopped_trial_without_values_fails_and_a_success_without_objective_fails() -> None:
    assert decide(view(finished(0, "stopped"))).tells[0].state == "FAIL"
    no_value = decide(view(finished(0, "succeeded"))).tells[0]
    assert (no_value.state, no_value.failure) == ("FAIL", True) and "no objective" in no_value.why


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nan_objective_fails_the_trial_saying_it_diverged_not_that_it_reported_none(value: float) -> None:
    for run in ({"final": value}, {"final": 0.5, "evals": ((40, value),)}):
        plan = decide(view(finished(0, "succeeded", **run), objective_step=40))
        told = plan.tells[0]
        assert (told.state, told.value, told.failure) == ("FAIL", None, False)
        assert told.why == f"the objective was {value} (diverged)"
        assert plan.reports == []  # a NaN is never reported to the pruner either


def test_the_objective_at_a_step_is_that_evaluation() -> None:
    run = RunView(finished=True, outcome=Outcome.SUCCEEDED, evals=((20, 0.3), (40, 0.7), (60, 0.8)), final=0.8)
    assert objective_of(run, 40) == 0.7 and objective_of(run, None) == 0.8 and objective_of(run, 30) == 0.8


def test_failures_stop_launches_and_end_the_sweep_failed() -> None:
    failed = [TrialView(0, TrialState.FAIL, failure=True), TrialView(1, TrialState.FAIL, failure=True)]
    plan = decide(view(*failed))
    assert plan.launch == 0 and plan.ended is not None and plan.ended[0] == "failed"
    plan = decide(view(TrialView(0, TrialState.FAIL, failure=True), finished(1, "user-error")))
    assert plan.launch == 0 and plan.ended is not None and plan.ended[0] == "failed"


def test_all_trials_ended_completes_the_sweep() -> None:
    plan = decide(view(*(TrialView(n, TrialState(s)) for n, s in enumerate(["COMPLETE", "PRUNED", "COMPLETE"])),
                       finished(3, "succeeded", final=0.5)))
    assert plan.ended == ("completed", "all 4 trials ended") and plan.launch == 0


def test_stop_stops_running_trials_then_ends() -> None:
    plan = decide(view(running(0), TrialView(1, TrialState.COMPLETE), stopping=True))
    assert [(s.number, s.outcome) for s in plan.stops] == [(0, "stopped")] and plan.launch == 0
    assert plan.ended is None  # ends once nothing runs
    stopped = decide(view(TrialView(1, TrialState.COMPLETE), stopping=True)).ended
    assert stopped == ("stopped", "stopped by 'tpuops sweep stop'")


def test_a_launch_must_fit_the_budget_after_what_running_trials_will_still_cost() -> None:
    # $10 budget, $3 a trial: two running trials that spent $1 each still reserve $2 each.
    limits = {"budget_usd": 10.0, "projected_usd": 3.0, "parallel": 4, "wanted": 8}
    plan = decide(view(running(0, cost_usd=1.0), running(1, cost_usd=1.0), spent_usd=2.0, **limits))
    assert plan.launch == 1 and plan.waiting_reason is not None and "$3.00" in plan.waiting_reason
    plan = decide(view(TrialView(0, TrialState.COMPLETE), TrialView(1, TrialState.COMPLETE), spent_usd=8.0, **limits))
    assert plan.launch == 0 and plan.ended is not None and plan.ended[0] == "budget-exhausted"


def test_spending_at_the_cap_stops_every_running_trial() -> None:
    plan = decide(view(running(0), running(1), budget_usd=5.0, spent_usd=5.0, projected_usd=1.0))
    assert [(s.number, s.outcome) for s in plan.stops] == [(0, "budget-exhausted"), (1, "budget-exhausted")]
    assert plan.launch == 0 and plan.ended is None


def test_waiting_grid_points_are_not_counted_as_created() -> None:
    plan = decide(view(TrialView(0, TrialState.WAITING), TrialView(1, TrialState.WAITING), wanted=2))
    assert plan.launch == 2


def test_the_endgame_promotes_the_leaders_once_the_sweep_nears_its_end() -> None:
    rule = Endgame(leaders=1, at_budget_fraction=0.8, at_trials_fraction=0.5)
    trials = (running(2, evals=((20, 0.6),), reported=20), running(3, evals=((20, 0.9),), reported=20))
    early = decide(view(TrialView(0, TrialState.COMPLETE), *trials, endgame=rule))
    assert early.promote == []  # 1 of 4 trials ended: not yet
    late = decide(view(TrialView(0, TrialState.COMPLETE), TrialView(1, TrialState.PRUNED), *trials, endgame=rule))
    assert late.promote == [3]  # the leader by its latest value
    assert decide(view(TrialView(0, TrialState.COMPLETE), TrialView(1, TrialState.PRUNED), *trials, endgame=rule,
                       maximize=False)).promote == [2]
    spent = decide(view(*trials, endgame=rule, budget_usd=10.0, spent_usd=8.5, projected_usd=0.1))
    assert spent.promote == [3]  # 85 % of the budget spent
    promoted = running(3, evals=((20, 0.9),), reported=20, on_demand=True, promoted=True)
    ended = (TrialView(0, TrialState.COMPLETE), TrialView(1, TrialState.PRUNED))
    assert decide(view(*ended, trials[0], promoted, endgame=rule)).promote == []  # one leader in all
    assert decide(view(*ended, trials[0], endgame=rule, promoted=1)).promote == []  # ...even once it ended
    two = Endgame(leaders=2, at_budget_fraction=0.8, at_trials_fraction=0.5)
    assert decide(view(*ended, trials[0], promoted, endgame=two)).promote == [2]


def test_the_endgame_passes_over_a_leader_whose_agent_has_ended() -> None:
    """Its agent ended (or trained every step) and the controller has not read its exit yet: its memory is not
    finished, but a move has nothing left to speed up. The next trial leads."""
    rule = Endgame(leaders=1, at_budget_fraction=0.5)
    done = running(3, evals=((20, 0.9),), reported=20, work_done=True)
    plan = decide(view(running(2, evals=((20, 0.6),), reported=20), done, endgame=rule, budget_usd=10.0,
                       spent_usd=6.0, projected_usd=0.1))
    assert plan.promote == [2]
    assert decide(view(done, endgame=rule, budget_usd=10.0, spent_usd=6.0, projected_usd=0.1)).promote == []


# -- the spec -------------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "e.yaml").write_text("name: e\n")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


GOOD = """name: s
experiment: experiments/e.yaml
space:
  lr: {type: float, low: 0.001, high: 0.1, log: true}
trials: 4
parallel: 2
"""


def test_the_example_sweep_is_valid() -> None:
    spec = load_sweep(REPO / "sweeps" / "digits_lr.yaml")
    assert (spec.trials, spec.parallel, spec.sampler.type, spec.pruner.type) == (8, 2, "tpe", "median")
    assert spec.params == ["filters", "learning_rate"] and spec.space["learning_rate"].log  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "fragment"), [
    (GOOD.replace("parallel: 2", "paralel: 2"), "unknown key 'paralel' (did you mean 'parallel'?)"),
    (GOOD.replace("log: true", "lg: true"), "unknown key 'space.lr.float.lg'"),
    (GOOD.replace("low: 0.001", "low: 0.5"), "low (0.5) must be below high (0.1)"),
    (GOOD.replace("trials: 4", "trials: 1"), "parallel (2) exceeds trials (1)"),
    (GOOD.replace("experiments/e.yaml", "nope.yaml"), "experiment = 'nope.yaml': no such file"),
    (GOOD + "grid: {lr: [1, 2]}\n", "give exactly one of space"),
    (GOOD + "storage: {kind: database, url: 'postgresql+psycopg://u:hunter2@h/db'}\n", "carries a password"),
    (GOOD.replace("name: s", "name: S"), "name = 'S' is not allowed"),
])
def test_a_bad_spec_is_one_line(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(UsageError) as err:
        load_sweep(write(tmp_path, text))
    message = str(err.value)
    assert fragment in message and "\n" not in message and "hunter2" not in message


def test_grids_are_enumerated_in_a_fixed_order() -> None:
    assert grid_points({}) == []  # a sampled sweep enqueues nothing
    assert grid_points({"b": [1, 2], "a": ["x", "y"]}) == [
        {"a": "x", "b": 1}, {"a": "x", "b": 2}, {"a": "y", "b": 1}, {"a": "y", "b": 2}]


def test_dollars_lost_are_the_share_of_cost_spent_on_steps_trained_twice() -> None:
    assert lost_to_recompute(3.0, step=200, recomputed=100) == pytest.approx(1.0)
    assert lost_to_recompute(3.0, step=200, recomputed=0) == 0.0
    assert lost_to_recompute(0.0, step=0, recomputed=0) == 0.0


def test_every_run_ending_has_one_trial_state_and_one_failure_verdict() -> None:
    assert set(TRIAL_STATE) == set(Outcome) == set(COUNTS_AS_FAILURE)
    assert {o for o, failure in COUNTS_AS_FAILURE.items() if failure} == {
        Outcome.USER_ERROR, Outcome.CRASHED, Outcome.FAILED}


def test_an_agent_exit_ends_a_run_unless_it_was_a_preemption() -> None:
    assert {e: OUTCOME_OF_EXIT.get(e) for e in ExitClass} == {
        ExitClass.SUCCEEDED: Outcome.SUCCEEDED, ExitClass.USER_ERROR: Outcome.USER_ERROR,
        ExitClass.CRASHED: Outcome.CRASHED, ExitClass.DIVERGED: Outcome.DIVERGED, ExitClass.PREEMPTED: None,
        ExitClass.STOPPED: Outcome.STOPPED}
    assert all(Outcome.of_exit(e) is OUTCOME_OF_EXIT[e] for e in OUTCOME_OF_EXIT)


def test_a_trial_past_its_projection_still_reserves_what_it_bills_until_the_next_pass() -> None:
    # $10 budget, $2 a trial, passes every 30 min; trial 0 spent $3 (past its projection) and bills $4/h:
    # it still holds $2 until the next pass, so $10 - $5 spent - $2 leaves room for one launch, not two.
    limits = {"budget_usd": 10.0, "projected_usd": 2.0, "parallel": 4, "wanted": 8, "pace_s": 1800.0}
    plan = decide(view(running(0, cost_usd=3.0, usd_per_hour=4.0), spent_usd=5.0, **limits))
    assert plan.launch == 1 and plan.stops == []
    without_pace = decide(view(running(0, cost_usd=3.0, usd_per_hour=4.0), spent_usd=5.0,
                               **{**limits, "pace_s": 0.0}))
    assert without_pace.launch == 2  # the old rule: a trial past its projection held nothing


def test_trials_stop_as_soon_as_the_budget_would_run_out_before_the_next_pass() -> None:
    # $1.50 left, 5-min passes, three trials billing $6/h each ($0.50 each until the next pass): all three fit.
    limits = {"budget_usd": 10.0, "spent_usd": 8.5, "projected_usd": 0.1, "pace_s": 300.0, "parallel": 3}
    trials = [running(n, step=step, usd_per_hour=6.0) for n, step in ((0, 500), (1, 100), (2, 900))]
    assert decide(view(*trials, **limits)).stops == []
    # $1.00 left: they would bill $1.50 before the next pass, so the one least far along (trial 1) stops now.
    plan = decide(view(*trials, **{**limits, "spent_usd": 9.0}))
    assert [(s.number, s.outcome) for s in plan.stops] == [(1, "budget-exhausted")]
    assert "before the next pass" in plan.stops[0].why and plan.launch == 0
    # $0.40 left: not even one fits; all stop, least far along first.
    plan = decide(view(*trials, **{**limits, "spent_usd": 9.6}))
    assert [s.number for s in plan.stops] == [1, 0, 2] and plan.ended is None
    # A first pass (no pace known yet) has nothing to look ahead to.
    assert decide(view(*trials, **{**limits, "spent_usd": 9.6, "pace_s": 0.0})).stops == []


def test_no_trial_is_launched_in_a_pass_that_stopped_one_for_the_budget() -> None:
    limits = {"budget_usd": 10.0, "spent_usd": 9.0, "projected_usd": 0.01, "pace_s": 3600.0, "parallel": 4}
    plan = decide(view(running(0, step=10, usd_per_hour=0.6), running(1, step=20, usd_per_hour=0.6), **limits))
    assert [s.number for s in plan.stops] == [0] and plan.launch == 0 and plan.waiting_reason is None
