"""An elastic run's sizes priced and timed, and the deadline policy's choice when its largest size is stocked out.

A run on ``accelerator: [v2-32, v2-8]`` keeps one global batch on every size, so a step on a smaller slice does the
same work more slowly: ``slowdown`` wall seconds per second of work on the largest (the accumulation factor: the
largest's replicas over the size's, as the agent takes that many micro-batches a step). A chip-hour costs the same
on every size of a generation, so one step costs about the same everywhere; what the sizes differ in is time,
preemption hazard (a slice of H hosts is preempted when any host is) and stockouts.

When the largest size is stocked out in every zone, a run with a deadline has three moves, each weighed here by
its expected time to result, its expected cost and its chance to meet the deadline (``Option``):

- ``wait`` for the largest (spot): nothing is billed while it waits; the stockout spell still to go is exponential
  with the size's mean spell ``spell_s`` (memoryless: a spell that has lasted an hour is as long to go as a new
  one), then the work on spot: ``W / (1 - h R)`` with its preemptions (``tpuops.billing.deadline``).
- ``smaller``: start on the next size now (a create, ``R``), at ``slowdown`` with its own preemptions, and move up
  (one more ``R``) when the largest returns, after that same exponential spell, if the work is not done by then.
- ``on-demand`` of the largest: a create (``R``) and the work, never preempted; on-demand is assumed to have
  capacity while spot is stocked out (``Option`` says so; a ledger that saw on-demand refused would say otherwise,
  and the controller then blocks that zone for on-demand as for spot).

The choice: the cheapest move whose chance to meet the deadline is at least ``ON_TIME``; when none is, the one with
the best chance (the sooner on a tie). Without a deadline the run follows its ``elastic: wait`` (docs/experiments.md).

Invariants: pure (numbers in, numbers out); every ``Option`` is what the chosen move is compared on, and
``SizePlan.reason`` names all three, so that the event a run records says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpuops.core.kinds import ValueEnum

ON_TIME = 0.9
"""The chance to meet the deadline a move needs to be chosen for its cost (else the likeliest to meet it wins)."""


class Move(ValueEnum):
    WAIT = "wait"
    SMALLER = "smaller"
    ON_DEMAND = "on-demand"


@dataclass(frozen=True)
class SizeTerms:
    """One size of an elastic run as the plan weighs it (``tpuops.launch.planning`` learns the hazards)."""

    accelerator: str
    slowdown: float
    """Wall seconds per second of the largest size's work (1 for it; for another, its replicas over this size's)."""
    spot_usd_per_hour: float
    on_demand_usd_per_hour: float
    hazard_per_hour: float
    """Spot preemptions per READY hour of one node of this size."""
    stockouts_per_hour: float
    """Stockout spells of this size (spot) starting per hour."""
    spell_s: float
    """A stockout spell's mean length."""

    def inflation(self, recovery_s: float) -> float:
        """Wall seconds per second of work on spot, with its expected preemptions (inf: they never let it finish)."""
        lost = self.hazard_per_hour / 3600.0 * recovery_s
        return math.inf if lost >= 1.0 else 1.0 / (1.0 - lost)

    def stocked_out_share(self) -> float:
        """The long-run share of time the size is stocked out (spells of ``spell_s`` starting at the hourly rate)."""
        out = self.stockouts_per_hour / 3600.0 * self.spell_s
        return out / (1.0 + out)

    def hours(self, work_s: float, recovery_s: float, on_demand: bool = False) -> float:
        """Expected hours of ``work_s`` (at the largest size's speed) wholly on this size, its start included."""
        per_s = self.slowdown * (1.0 if on_demand else self.inflation(recovery_s))
        return (recovery_s + work_s * per_s) / 3600.0

    def usd(self, work_s: float, recovery_s: float, on_demand: bool = False) -> float:
        """Expected cost of ``work_s`` wholly on this size (the billed part: the work and its preemptions)."""
        price = self.on_demand_usd_per_hour if on_demand else self.spot_usd_per_hour
        per_s = self.slowdown * (1.0 if on_demand else self.inflation(recovery_s))
        return work_s * per_s / 3600.0 * price


@dataclass(frozen=True)
class Option:
    """One move, as the choice weighs it."""

    move: Move
    hours: float
    """Expected time to result from now."""
    usd: float
    """Expected cost from now."""
    on_time: float
    """The chance to be done by the deadline."""

    def to_json(self) -> dict[str, float | str]:
        return {"move": self.move.value, "hours": round(self.hours, 4), "usd": round(self.usd, 4),
                "on_time": round(self.on_time, 4)}

    def words(self) -> str:
        return f"{self.move.value} {self.hours:.1f} h, ${self.usd:,.2f}, {self.on_time:.0%} on time"


@dataclass(frozen=True)
class SizePlan:
    """The choice among the three moves, and what it rested on."""

    move: Move
    options: tuple[Option, ...]
    reason: str

    def option(self, move: Move) -> Option:
        return next(option for option in self.options if option.move is move)

    def to_json(self) -> dict[str, object]:
        return {"choice": self.move.value, "reason": self.reason, "options": [o.to_json() for o in self.options],
                "on_time_needed": ON_TIME}


def _exceeds(limit_s: float, spell_s: float) -> float:
    """P(an exponential spell of mean ``spell_s`` is over within ``limit_s``)."""
    if limit_s < 0:
        return 0.0
    if spell_s <= 0:
        return 1.0
    return 1.0 - math.exp(-limit_s / spell_s)


def wait(work_s: float, left_s: float, big: SizeTerms, recovery_s: float) -> Option:
    """Wait out the largest size's stockout, then do the work on it (spot)."""
    run_s = recovery_s + work_s * big.inflation(recovery_s)
    return Option(Move.WAIT, (big.spell_s + run_s) / 3600.0, big.usd(work_s, recovery_s),
                  _exceeds(left_s - run_s, big.spell_s))


def smaller(work_s: float, left_s: float, big: SizeTerms, small: SizeTerms, recovery_s: float,
            started: bool = False) -> Option:
    """Work on the smaller size now (``started``: it is already there, no create to wait for), move up (one
    recovery) when the largest returns (module docstring).

    With ``a = k W`` the time the work takes wholly on the smaller size (``k`` its slowdown with its preemptions)
    and ``t`` the return of the largest (exponential, mean ``D``): the result comes at ``R + a`` when ``t >= a``,
    else at ``R + t + R + (W - t / k) f`` (``f``: the largest's inflation); the expectations below are those
    of that piecewise function.
    """
    k, f, spell, rec = small.slowdown * small.inflation(recovery_s), big.inflation(recovery_s), big.spell_s, recovery_s
    start = 0.0 if started else rec
    a = k * work_s
    if spell <= 0:  # the largest is back at once: move up now
        t_mean, stays, t_within = 0.0, 0.0, 0.0
    elif math.isinf(a):  # preempted faster than it recovers: no progress until the largest returns
        t_mean, stays, t_within = spell, 0.0, spell
    else:
        stays = math.exp(-a / spell)  # P(t >= a): done on the smaller size
        t_mean = spell * (1.0 - stays)  # E[min(t, a)]: time on the smaller size
        t_within = spell - (a + spell) * stays  # E[t; t < a]
    moved = 1.0 - stays
    hours = (start + (a * stays if stays else 0.0) + t_within * (1.0 - f / k if k else 1.0)
             + moved * (rec + work_s * f)) / 3600.0
    big_s = f * (work_s * moved - (t_within / k if k else 0.0))
    usd = t_mean / 3600.0 * small.spot_usd_per_hour + big_s / 3600.0 * big.spot_usd_per_hour
    if start + a <= left_s:
        on_time = 1.0
    elif k > f:  # the largest is faster: the sooner it returns, the sooner the result
        on_time = _exceeds((left_s - start - rec - work_s * f) / (1.0 - f / k), spell)
    else:
        on_time = 0.0
    return Option(Move.SMALLER, hours, usd, on_time)


def on_demand(work_s: float, left_s: float, big: SizeTerms, recovery_s: float) -> Option:
    """The largest size on on-demand: never preempted, assumed to have capacity."""
    hours = big.hours(work_s, recovery_s, on_demand=True)
    return Option(Move.ON_DEMAND, hours, big.usd(work_s, recovery_s, on_demand=True),
                  1.0 if hours * 3600.0 <= left_s else 0.0)


def choose_size(work_s: float, left_s: float, big: SizeTerms, small: SizeTerms, recovery_s: float,
                running_smaller: bool = False) -> SizePlan:
    """The move for a run with ``work_s`` of work left (at the largest size's speed) and ``left_s`` before its
    deadline, its largest size (``big``) stocked out everywhere. A run already on the smaller size does not stop to
    wait (waiting is never better than progress at the same place in the queue): its choice is between staying
    there and on-demand of the largest."""
    options = [smaller(work_s, left_s, big, small, recovery_s, started=running_smaller),
               on_demand(work_s, left_s, big, recovery_s)]
    if not running_smaller:
        options.insert(0, wait(work_s, left_s, big, recovery_s))
    fit = [o for o in options if o.on_time >= ON_TIME]
    chosen = (min(fit, key=lambda o: (o.usd, o.hours)) if fit
              else max(options, key=lambda o: (o.on_time, -o.hours)))
    why = "cheapest" if fit else f"none is {ON_TIME:.0%} likely on time; the likeliest"
    listed = "; ".join(o.words() for o in options)
    return SizePlan(chosen.move, tuple(options), f"{big.accelerator} stocked out, {work_s / 3600:.1f} h of work, "
                                                 f"{left_s / 3600:.1f} h left: {chosen.move.value} ({why}; {listed})")
