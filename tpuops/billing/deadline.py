"""Which capacity a run should be on now: the deadline policy (uniform progress) and the fallback, as pure functions.

One module decides every capacity move of a run, so that the controller, a sweep's endgame and the
simulator move runs by the same rules (``Memory.switch`` records a move, the controller carries it
out through a checkpoint: the node is deleted, the agent saves on the notice, the run resumes on
the other capacity).

The deadline rule, after "Can't Be Late" (NSDI '24): a run keeps making progress on spot while what
is left fits the time left with a margin, and moves to on-demand the pass it no longer does.

- On spot, ``W`` seconds of work take ``W / (1 - h R)`` on average (``h`` preemptions per second of
  node time, each costing a recovery of ``R`` seconds: detection, create -> READY, setup, restore and
  the work since the last save), and one more ``R`` is kept in reserve for the move to on-demand
  that a late preemption would force. Spot fits while that, plus ``MARGIN`` of the work, is at most
  the time left.
- On on-demand the slack (time left minus work left) stays constant while the work shrinks, so spot
  fits again near the end; the run moves back once spot fits with ``RETURN_RESERVES`` more ``R`` to spare
  (the move back is itself a recovery), which keeps it from switching back and forth on every pass.

An elastic run's rule also carries its sizes (``Rule.sizes``): while its largest is stocked out everywhere,
``Rule.size_plan`` asks ``tpuops.billing.elastic`` whether to wait for it, take the smaller size or take it on
on-demand.

Invariants: the functions read nothing and write nothing; ``choose`` never returns spot when the
work cannot even be done on on-demand (then on-demand is the best there is, and it says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpuops.billing.elastic import SizePlan, SizeTerms, choose_size
from tpuops.config import RECOVERY_S
from tpuops.core.kinds import Capacity, Choice

MARGIN = 0.05
"""The share of the remaining work kept free on spot, against the spread of preemptions around their mean."""

RETURN_RESERVES = 2.0
"""How many recoveries more than spot needs the time left must hold before a run on on-demand moves back to spot:
the hysteresis between the two moves. Measured (``bench/bench_plan.py --hysteresis 1 2 3 --runs 300``, a 24-h job
at 2 preemptions an hour and a 1.25x deadline): 1 -> 2 cut the most switches in a run from 12 to 8 (2.42 -> 2.36
on average) at the same cost (0.613x on-demand) and no deadline missed; 3 cut them to 6 but cost 0.615x."""


@dataclass(frozen=True)
class Situation:
    """Where a run stands against its deadline at ``now``."""

    now: float
    deadline_at: float
    remaining_s: float
    """Work left, in seconds at the run's own speed (the same on spot and on-demand)."""
    on_demand: bool
    """What the run is on (or moving to) now."""
    hazard_per_hour: float
    """Spot preemptions per READY hour."""
    recovery_s: float = RECOVERY_S


def spot_needs_s(situation: Situation) -> float:
    """The time the remaining work needs on spot, with its expected recoveries, one reserve and the margin."""
    lost = situation.hazard_per_hour / 3600.0 * situation.recovery_s
    if lost >= 1.0:
        return math.inf  # preemptions come faster than recoveries end: spot never finishes
    work = situation.remaining_s
    return work / (1.0 - lost) + situation.recovery_s + MARGIN * work


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


LATE_EVEN_ON_DEMAND = "it may be late even there"
"""What a move to on-demand says when even on-demand may miss the deadline (``tpuops.notify.rules`` reads it)."""


def choose(situation: Situation, spot: Capacity = Capacity.SPOT) -> Choice:
    """Uniform progress: ``spot`` (the run's declared cheap capacity) while it fits, on-demand when not."""
    left = situation.deadline_at - situation.now
    needs = spot_needs_s(situation)
    if situation.on_demand:
        back = needs + RETURN_RESERVES * situation.recovery_s
        if left >= back:
            return Choice(spot, f"slack returned: {_hours(situation.remaining_s)} of work needs {_hours(back)} on "
                                f"{spot.value} with a move back, {_hours(left)} left before the deadline")
        return Choice(Capacity.ON_DEMAND, f"{_hours(situation.remaining_s)} of work, {_hours(left)} left: "
                                          f"{spot.value} would need {_hours(back)}")
    if left >= needs:
        return Choice(spot, f"{_hours(situation.remaining_s)} of work needs {_hours(needs)} on {spot.value}, "
                            f"{_hours(left)} left before the deadline")
    late = "" if left >= situation.remaining_s + situation.recovery_s else f"; {LATE_EVEN_ON_DEMAND}"
    return Choice(Capacity.ON_DEMAND, f"{_hours(situation.remaining_s)} of work needs {_hours(needs)} on "
                                      f"{spot.value} with its expected recoveries, only {_hours(left)} left "
                                      f"before the deadline{late}")


def fallback(preemptions: int, spot: Capacity = Capacity.SPOT) -> Choice:
    """SkyPilot-like: ``spot`` until the first preemption, on-demand from then on."""
    if preemptions > 0:
        return Choice(Capacity.ON_DEMAND, f"preempted {preemptions} time(s): on-demand from the first preemption")
    return Choice(spot, "not preempted yet")


@dataclass(frozen=True)
class Rule:
    """A run's capacity rule, from its record: a deadline (uniform progress) or the fallback."""

    declared: Capacity
    """The capacity the run was declared on (spot or preemptible): the cheap one it returns to."""
    deadline_at: float | None = None
    expected_s: float | None = None
    """Its length at on-demand speed, until its speed is measured."""
    fallback: bool = False
    hazard_per_hour: float = 0.1
    recovery_s: float = RECOVERY_S
    sizes: tuple[SizeTerms, ...] = ()
    """An elastic run's sizes, largest first (``tpuops.billing.elastic``): with a deadline, what it does when its
    largest is stocked out."""

    def remaining_s(self, step: int, total_steps: int | None, speed: float | None) -> float:
        """Work left: the steps left at the measured speed, else the expected length's share still to do."""
        if total_steps and speed and speed > 0:
            return max(0.0, total_steps - step) / speed
        done = min(1.0, step / total_steps) if total_steps else 0.0
        return (self.expected_s or 0.0) * (1.0 - done)

    def size_plan(self, now: float, step: int, total_steps: int | None, speed: float | None, size: int
                  ) -> SizePlan | None:
        """Wait, the smaller size or on-demand of the largest, for a run at ``step`` whose largest size is stocked out
        everywhere, on ``size`` (an index into ``sizes``) at ``speed`` steps/s (measured there); None without a
        deadline or sizes."""
        if self.deadline_at is None or len(self.sizes) < 2:
            return None
        work_s = self.remaining_s(step, total_steps, speed)
        if total_steps and speed:  # measured on ``size``: its slowdown is not the largest's work
            work_s /= self.sizes[min(size, len(self.sizes) - 1)].slowdown
        return choose_size(work_s, self.deadline_at - now, self.sizes[0], self.sizes[1], self.recovery_s,
                           running_smaller=size > 0)

    def choice(self, now: float, on: Capacity, preemptions: int, step: int, total_steps: int | None,
               speed: float | None) -> Choice:
        """What the run should be on at ``now``, on ``on`` so far."""
        if self.deadline_at is None:
            return fallback(preemptions, self.declared)
        return choose(Situation(now, self.deadline_at, self.remaining_s(step, total_steps, speed),
                                on is Capacity.ON_DEMAND, self.hazard_per_hour, self.recovery_s), self.declared)


def endgame() -> Choice:
    """A sweep's endgame: its leading trials move to on-demand so that its last results do not wait on spot."""
    return Choice(Capacity.ON_DEMAND, "endgame")
