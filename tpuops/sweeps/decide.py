"""The rules of a sweep pass, as a pure function: what the pass saw -> what to report, tell, stop, adopt, launch.

No I/O and no Optuna here, so every rule is tested without servers (``advance`` applies the plan).
Trial states are ``TrialState``, named as Optuna names them (``tpuops.sweeps.trials`` turns one into
the other, and its test fails if Optuna renames one); a run's ending is ``tpuops.runs.Outcome``,
told as ``TRIAL_STATE`` says.

- A RUNNING trial without a run (a pass died between ask and declare) is adopted: its run is
  declared under its deterministic name; it is never asked again. A stopped sweep (or one out of
  budget) adopts none: such a trial is told FAIL without a run, so that nothing is created for a
  sweep that has ended (its node would be created by the run pass, then stopped by the next).
  A trial whose run is declared but was never driven (no attempt, no event: a pass may have died
  between its record and its index markers, which the controller lists) is adopted too, every
  pass until a controller has acted on it: declaring is idempotent and writes the markers again.
- A trial's evaluations are reported in step order above its high-water mark (the highest step
  it has reported), so a step recomputed after a restart is reported once.
- A finished run is told: succeeded -> COMPLETE with the objective (at ``objective_step`` or the
  final evaluation; none reported -> FAIL); user error, crash past the restarts, a refused
  create -> FAIL, counted against ``max_failures``; diverged (a NaN or infinite loss or metric),
  or an objective that is NaN or infinite -> FAIL, as Optuna itself fails a trial whose objective
  returns NaN, saying so, and not counted against ``max_failures`` (the sampled hyperparameters
  diverged, the code did not fail); stopped by the sweep (pruned, stopped,
  out of budget) -> PRUNED, as Optuna does for a trial ended early; too many preemptions -> FAIL,
  not counted as a failure of the code.
- A running trial is never told on account of a preemption: its run is recovered from its
  checkpoint by the controller. Past ``max_preemptions`` it is stopped.
- A running trial with new values is a pruning candidate (the pruner compares trials at equal
  steps, so a trial late because it was preempted is not pruned for it).
- New trials are launched up to ``parallel`` at once and ``trials`` in all, while the sweep is
  active, failures are under ``max_failures`` and the projected cost of one more trial fits in
  what is left of the budget after what the running trials still reserve: each its expected
  remaining cost (projected minus spent), and at least what its node bills until the next pass
  (a trial that outran its projection still costs money until a pass can stop it).
- A budget acts only at passes, and nodes bill between them. So a pass stops trials as soon as
  what the running trials would bill until the next pass (``pace_s``: the gap since the last
  one) no longer fits in what is left: the trials least far along first, until the rest fit.
  Spending at or over the budget, or ``sweep stop``, stops every running trial (the node's
  deletion makes the agent checkpoint); the sweep ends once no trial runs.
- Endgame (optional): once a set fraction of the budget is spent or of the trials has ended, the
  leading running trials (by their latest value) still on spot or preemptible capacity are
  promoted to on-demand, ``leaders`` trials in all over the sweep, so that its last results do not
  wait on spot capacity. A trial whose agent has ended or trained every step is not one of them, though its
  memory is not finished yet: promoted, it spent the promotion on a node that had nothing left to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from tpuops.core.formats import format_usd
from tpuops.core.guards import Guard
from tpuops.core.kinds import ValueEnum
from tpuops.runs.outcome import COUNTS_AS_FAILURE, Outcome
from tpuops.sweeps.models import SweepOutcome

if TYPE_CHECKING:
    from tpuops.sweeps.spec import Endgame


class TrialState(ValueEnum):
    """The states of an Optuna trial that a sweep meets, by Optuna's names."""

    WAITING = "WAITING"
    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    FAIL = "FAIL"


ENDED = frozenset({TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL})

ADOPT_ORPHAN = Guard("sweeps.adopt_orphan", "a trial asked by a pass that died before declaring its run is adopted "
                                            "(its run declared), never left running without one")
STOP_LAUNCHES_NOTHING = Guard("sweeps.stop_launches_nothing", "a stopped sweep asks no new trial")
ONLY_SUCCESS_COMPLETES = Guard("sweeps.only_success_completes", "a trial is told COMPLETE only when its run succeeded")

TRIAL_STATE = MappingProxyType({
    Outcome.SUCCEEDED: TrialState.COMPLETE,
    Outcome.USER_ERROR: TrialState.FAIL,
    Outcome.CRASHED: TrialState.FAIL,
    Outcome.DIVERGED: TrialState.FAIL,
    Outcome.FAILED: TrialState.FAIL,
    Outcome.PREEMPTED_OUT: TrialState.FAIL,
    Outcome.PRUNED: TrialState.PRUNED,
    Outcome.STOPPED: TrialState.PRUNED,
    Outcome.BUDGET_EXHAUSTED: TrialState.PRUNED,
})
"""How a trial whose run ended is told (see the module docstring); ``COUNTS_AS_FAILURE`` says which FAILs
count against ``max_failures``."""


@dataclass(frozen=True)
class RunView:
    """What the pass read of a trial's run: its controller memory and its agent status."""

    finished: bool
    outcome: Outcome | None = None
    reason: str = ""
    step: int = 0
    evals: tuple[tuple[int, float], ...] = ()
    """(step, objective metric) of every evaluation the status holds."""
    final: float | None = None
    """The objective from the run's final evaluation (None until it succeeded)."""
    work_done: bool = False
    """Its agent has ended the run or trained every step (``AgentStatus.work_done``), which its memory may not say yet
    (the controller reads the agent's exit in the run pass, after the sweep's): the endgame leaves it be."""
    preemptions: int = 0
    cost_usd: float = 0.0
    on_demand: bool = False
    """Its node is (or will be recreated as) on-demand: promoted already, or never spot."""
    promoted: bool = False
    """The endgame promoted it."""
    usd_per_hour: float = 0.0
    """What its node bills an hour (at its current capacity)."""
    driven: bool = True
    """A controller has acted on it (an attempt or an event in its memory): its index markers were there."""


@dataclass(frozen=True)
class TrialView:
    number: int
    state: TrialState
    reported: int = -1
    """The high-water mark: the highest step reported for this trial (-1: none)."""
    failure: bool = False
    """A FAIL counted against ``max_failures``."""
    run: RunView | None = None


@dataclass(frozen=True)
class SweepView:
    trials: tuple[TrialView, ...]
    wanted: int
    parallel: int
    max_preemptions: int
    max_failures: int
    objective_step: int | None = None
    stopping: bool = False
    budget_usd: float | None = None
    spent_usd: float = 0.0
    projected_usd: float = 0.0
    """What one more trial is expected to cost (its node's price times the experiment's expected_hours)."""
    maximize: bool = True
    endgame: Endgame | None = None
    promoted: int = 0
    """Trials the endgame promoted so far, as the sweep's state remembers them (running or ended)."""
    pace_s: float = 0.0
    """How long until the next pass, as far as the sweep can tell (the gap since the last one)."""


@dataclass(frozen=True)
class Tell:
    number: int
    state: TrialState  # an ended one
    value: float | None
    why: str
    failure: bool


@dataclass(frozen=True)
class Stop:
    number: int
    outcome: Outcome  # pruned | stopped | budget-exhausted | preempted-out
    why: str


@dataclass
class Plan:
    reports: list[tuple[int, int, float]] = field(default_factory=list)  # (trial, step, value)
    prune_candidates: list[int] = field(default_factory=list)
    tells: list[Tell] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    adopt: list[int] = field(default_factory=list)
    promote: list[int] = field(default_factory=list)
    launch: int = 0
    waiting_reason: str | None = None
    ended: tuple[SweepOutcome, str] | None = None  # (how, why)


def _new_values(trial: TrialView, run: RunView) -> list[tuple[int, float]]:
    by_step: dict[int, float] = {}
    for step, value in run.evals:
        if step > trial.reported and math.isfinite(value):
            by_step[step] = value  # the latest of a recomputed step
    return sorted(by_step.items())


def objective_of(run: RunView, objective_step: int | None) -> float | None:
    """The value to tell for a succeeded run (NaN or infinite as it was reported); None when it reported none."""
    if objective_step is not None:
        at = [value for step, value in run.evals if step == objective_step]
        if at:
            return at[-1]
    return run.final


def tell_for(number: int, run: RunView, objective_step: int | None, has_values: bool) -> Tell:
    """How a finished run is told to Optuna (see the module docstring)."""
    outcome = run.outcome or Outcome.FAILED
    state = TRIAL_STATE[outcome] if ONLY_SUCCESS_COMPLETES.on else TrialState.COMPLETE
    why = f"{outcome}: {run.reason}" if run.reason else outcome.value
    if state is TrialState.COMPLETE:
        value = objective_of(run, objective_step)
        if value is None:
            return Tell(number, TrialState.FAIL, None, "the run succeeded but reported no objective value", True)
        if not math.isfinite(value):
            return Tell(number, TrialState.FAIL, None, f"the objective was {value} (diverged)", False)
        return Tell(number, TrialState.COMPLETE, value, why, False)
    if state is TrialState.PRUNED and not has_values and outcome is not Outcome.PRUNED:
        return Tell(number, TrialState.FAIL, None, why, False)  # stopped before its first value: nothing to keep
    return Tell(number, state, None, why, COUNTS_AS_FAILURE[outcome])


def decide(view: SweepView) -> Plan:
    plan = Plan()
    over_budget = view.budget_usd is not None and view.spent_usd >= view.budget_usd
    running: list[TrialView] = []
    for trial in view.trials:
        if trial.state != TrialState.RUNNING:
            continue
        run = trial.run
        if run is None and (view.stopping or over_budget):
            plan.tells.append(Tell(trial.number, TrialState.FAIL, None, "the sweep ended before its run was declared "
                                   f"({'stopped' if view.stopping else 'out of budget'})", False))
            continue
        if run is None:
            if ADOPT_ORPHAN.on:
                plan.adopt.append(trial.number)
                running.append(trial)
            continue
        values = _new_values(trial, run)
        plan.reports.extend((trial.number, step, value) for step, value in values)
        if run.finished:
            plan.tells.append(tell_for(trial.number, run, view.objective_step, trial.reported >= 0 or bool(values)))
            continue
        running.append(trial)
        if not (run.driven or view.stopping or over_budget):
            plan.adopt.append(trial.number)  # its index markers again: a pass may have died before them
        if run.preemptions > view.max_preemptions:
            plan.stops.append(Stop(trial.number, Outcome.PREEMPTED_OUT,
                                   f"preempted {run.preemptions} times (max_preemptions {view.max_preemptions})"))
        elif view.stopping:
            plan.stops.append(Stop(trial.number, Outcome.STOPPED, "the sweep was stopped"))
        elif over_budget:
            plan.stops.append(Stop(trial.number, Outcome.BUDGET_EXHAUSTED, _budget_text(view)))
        elif values:
            plan.prune_candidates.append(trial.number)
    if not (view.stopping or over_budget):
        plan.stops.extend(_runs_out(view, plan, running))
    failures = sum(t.failure for t in view.trials) + sum(t.failure for t in plan.tells)
    created = sum(t.state != TrialState.WAITING for t in view.trials)
    if not (view.stopping or over_budget):
        plan.promote = _endgame(view, plan, running)
    blocked = _launch(view, plan, running, failures, created, over_budget)
    if running:
        return plan
    if plan.launch == 0:
        plan.ended = _end(view, failures, created, over_budget or blocked)
    return plan


def _launch(view: SweepView, plan: Plan, running: list[TrialView], failures: int, created: int,
            over_budget: bool) -> bool:
    """Set ``plan.launch``; True when the budget refused a launch."""
    if (view.stopping and STOP_LAUNCHES_NOTHING.on) or over_budget or failures >= view.max_failures:
        return over_budget
    if any(s.outcome is Outcome.BUDGET_EXHAUSTED for s in plan.stops):
        return True  # trials were just stopped for the budget: no new one takes their money
    slots = min(view.parallel - len(running), view.wanted - created)
    if slots <= 0:
        return False
    if view.budget_usd is None:
        plan.launch = slots
        return False
    stopped = {s.number for s in plan.stops}
    committed = view.spent_usd + sum(_reserved(view, t) for t in running if t.number not in stopped)
    for _ in range(slots):
        if committed + view.projected_usd > view.budget_usd:
            plan.waiting_reason = (f"a trial is projected to cost {format_usd(view.projected_usd)}; "
                                   f"{format_usd(max(0.0, view.budget_usd - committed))} of the "
                                   f"{format_usd(view.budget_usd)} budget is left after the running trials")
            return True
        committed += view.projected_usd
        plan.launch += 1
    return False


def _reserved(view: SweepView, trial: TrialView) -> float:
    """What a running trial holds of the budget: its expected remaining cost, and at least what it bills
    until the next pass."""
    run = trial.run
    if run is None:  # adopted: its run is declared this pass, nothing spent yet
        return view.projected_usd
    return max(view.projected_usd - run.cost_usd, run.usd_per_hour * view.pace_s / 3600)


def _runs_out(view: SweepView, plan: Plan, running: list[TrialView]) -> list[Stop]:
    """The trials to stop now because the budget would run out before the next pass (least far along first)."""
    if view.budget_usd is None:
        return []
    stopped = {s.number for s in plan.stops}
    going = [t for t in running if t.run is not None and t.number not in stopped]
    left = view.budget_usd - view.spent_usd
    billing = sum(t.run.usd_per_hour for t in going if t.run is not None)
    stops = []
    for trial in sorted(going, key=lambda t: (t.run.step if t.run else 0, -t.number)):
        if billing * view.pace_s / 3600 <= left:
            break
        rate = trial.run.usd_per_hour if trial.run else 0.0
        stops.append(Stop(trial.number, Outcome.BUDGET_EXHAUSTED,
                          f"the budget would run out before the next pass: {format_usd(left)} of the "
                          f"{format_usd(view.budget_usd)} left, running trials bill {format_usd(billing)}/h"))
        billing -= rate
    return stops


def _endgame(view: SweepView, plan: Plan, running: list[TrialView]) -> list[int]:
    """The leading running trials to move to on-demand, once the sweep nears its end."""
    rule = view.endgame
    if rule is None:
        return []
    ended = sum(t.state in ENDED for t in view.trials) + len(plan.tells)
    near = ended >= rule.at_trials_fraction * view.wanted or (
        view.budget_usd is not None and view.spent_usd >= rule.at_budget_fraction * view.budget_usd)
    if not near:
        return []
    stopped = {s.number for s in plan.stops}
    scored = []
    for trial in running:
        if trial.run is None or trial.number in stopped or not trial.run.evals or trial.run.work_done:
            continue
        latest = max(trial.run.evals)[1]  # the value at its highest step
        scored.append((latest if view.maximize else -latest, trial))
    scored.sort(key=lambda item: (-item[0], item[1].number))
    promoted = max(view.promoted, sum(bool(t.run and t.run.promoted) for t in running))
    left = max(0, rule.leaders - promoted)
    return [t.number for _, t in scored if t.run is not None and not t.run.on_demand][:left]


def _budget_text(view: SweepView) -> str:
    return f"spent {format_usd(view.spent_usd)} of the {format_usd(view.budget_usd or 0.0)} budget"


def _end(view: SweepView, failures: int, created: int, budget: bool) -> tuple[SweepOutcome, str] | None:
    if view.stopping:
        return SweepOutcome.STOPPED, "stopped by 'tpuops sweep stop'"
    if budget:
        return SweepOutcome.BUDGET_EXHAUSTED, _budget_text(view)
    if failures >= view.max_failures:
        return SweepOutcome.FAILED, f"{failures} trials failed (max_failures {view.max_failures})"
    if created >= view.wanted:
        return SweepOutcome.COMPLETED, f"all {view.wanted} trials ended"
    return None
