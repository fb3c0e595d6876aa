"""The numbers a plan rests on, learned from history where it exists, and where each one came from.

Three inputs steer what tpuops does before and during a run, and each is learned from the user's own
history when it has any, else taken from a documented, labelled default (``tpuops.toml``):

- ``hazard_per_hour``: spot preemptions per READY node-hour of the run's (zones, accelerator, capacity),
  pooled over its zones from ``tpuops.billing.risk`` (the ledger); the ``spot_preemptions_per_hour`` setting
  (``tpuops.billing.risk.Prior``) where none of its zones has READY time.
- ``recovery_s``: what one preemption cost a run, observed: from the preempted node's PREEMPTED
  transition to its replacement's READY (ledger: detection, create, boot), plus the setup of the attempt
  that replacement ran (status: TensorFlow, restore, first call) and the steps it trained again
  (``recomputed_s``); the mean over the preemptions of the run's keys, else the ``recovery_s`` setting.
  The deadline policy keeps room for it (``tpuops.billing.deadline``).
- ``lost_work_per_hour``: how often a run lost work the notice save did not cover, per running hour: an
  attempt that trained again more than ``LOSS_MIN_S`` of what an earlier attempt had trained (a crash, a
  hang, a notice save that did not fit), over every attempt's stepping time; what ``checkpoint: {every:
  auto}`` weighs save costs against (``tpuops.contract.interval``). With no loss in H running hours the rate
  is the ``lost_work_per_hour`` setting, capped at the most H hours without a loss allow (the upper end of
  the exact 95 % interval): history can rule a pessimistic assumption out before it measures a rate.

An elastic run (``accelerator: [v2-32, v2-8]``) gets the same for each of its sizes (``size_inputs``): its
pace (the accumulation its smaller slice needs), its prices, its preemption hazard and its stockouts, each
learned from the ledger's episodes of that size (``tpuops.billing.risk``: consecutive refused creates, a run's
and its probes', until a create of it reached READY) or the stated assumption (``Prior.stockouts_per_hour``,
``STOCKOUT_SPELL_S``): the spells per hour of READY and stocked-out time, and the mean length of the spells
that ended.

Invariants: every ``Learned`` says whether it was learned and from what (``source``, shown by the dry runs
and ``tpuops status``); the functions read nothing and write nothing (ledger rows and agent statuses in).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tpuops.billing.ledger import NodeHistory
from tpuops.billing.poisson import rate_interval
from tpuops.billing.pricing import Catalog, parse_capacity
from tpuops.billing.risk import CONFIDENCE, STOCKOUT_SPELL_S, Prior, Risk, RiskKey, rate_for, ready_at
from tpuops.providers.nodes import NodeState
from tpuops.runs.models import AttemptTime, Learned, PlanInputs, RunRecord, SizeInputs

LOSS_MIN_S = 60.0
"""An attempt that trained again more than a minute lost work; less is the step call in flight at a notice
save, and no interval ``every: auto`` picks is shorter (``tpuops.contract.interval.MIN_INTERVAL_S``)."""


@dataclass(frozen=True)
class Defaults:
    """The documented assumptions (``tpuops.toml``) each input falls back to."""

    prior: Prior
    """``spot_preemptions_per_hour``, and the provider's offers that say a slice's hosts."""
    recovery_s: float
    lost_work_per_hour: float
    catalog: Catalog | None = None
    """The prices an elastic run's sizes are weighed at (None: no size terms are learned)."""


Learner = Callable[[Sequence[RiskKey]], PlanInputs]
"""The inputs of a run on the given keys, from whatever history the caller holds (``tpuops.api.plan``)."""


def keys_of(record: RunRecord) -> list[RiskKey]:
    """The (zone, accelerator, capacity) keys a run may be placed on: one per zone it may use, of each of its sizes
    (largest first: the run's own hazard and recovery are its largest size's)."""
    return [RiskKey(zone, node.accelerator, parse_capacity(node.capacity).value)
            for node in record.sizes for zone in node.zones]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def hazard(risks: Sequence[Risk], keys: Sequence[RiskKey], default: Prior) -> Learned:
    """Preemptions per READY hour pooled over ``keys`` (the run's zones) that have READY time, else the prior."""
    found = [risk for risk in (rate_for(risks, key, default) for key in keys) if not risk.assumed]
    if not found:
        capacity = keys[0].capacity if keys else "spot"
        return Learned.of(default.rate(capacity, keys[0].accelerator if keys else None), False,
                       "assumed: spot_preemptions_per_hour in tpuops.toml (no READY time in the ledger for "
                       f"{_where(keys)})")
    preemptions, hours = sum(r.preemptions for r in found), sum(r.ready_hours for r in found)
    return Learned.of(preemptions / hours, True,
                   f"learned from {_plural(preemptions, 'preemption')} over {hours:.1f} READY hours in "
                   f"{_where([r.key for r in found])}")


def _where(keys: Sequence[RiskKey]) -> str:
    if not keys:
        return "no zone"
    zones = ", ".join(dict.fromkeys(key.zone for key in keys))
    return f"{zones} ({keys[0].accelerator}, {keys[0].capacity})"


def recovery_samples(histories: Iterable[NodeHistory],
                     attempts: Mapping[str, Sequence[AttemptTime]]) -> dict[RiskKey, list[float]]:
    """Seconds each observed preemption cost its run, by the preempted node's key (module docstring).

    A preemption counts once the run's next node became READY and the agent's attempt on it has a status
    (an attempt that started after that node's create); until then its cost is not known yet.
    """
    by_run: dict[str, list[NodeHistory]] = defaultdict(list)
    for history in histories:
        if history.node.run_id:
            by_run[history.node.run_id].append(history)
    samples: dict[RiskKey, list[float]] = defaultdict(list)
    for run_id, members in by_run.items():
        members.sort(key=lambda h: h.node.created_at)
        starts = sorted((a for a in attempts.get(run_id, ()) if a.started_at is not None),
                        key=lambda a: a.started_at or 0.0)
        for index, history in enumerate(members):
            preempted = next((t.at for t in history.transitions if t.state == NodeState.PREEMPTED.value), None)
            if preempted is None:
                continue
            replacement = next((h for h in members[index + 1:]
                                if h.node.created_at >= preempted and ready_at(h) is not None), None)
            if replacement is None:
                continue
            created = replacement.node.created_at.timestamp()
            attempt = next((a for a in starts if (a.started_at or 0.0) >= created and a.first_step_at), None)
            ready = ready_at(replacement)
            if attempt is None or ready is None:
                continue
            node = history.node
            key = RiskKey(node.zone, node.accelerator, parse_capacity(node.capacity).value)
            samples[key].append((ready - preempted).total_seconds() + attempt.setup_s + attempt.recomputed_s)
    return dict(samples)


def recovery(samples: Mapping[RiskKey, Sequence[float]], keys: Sequence[RiskKey], default: float) -> Learned:
    """The mean observed cost of a preemption over ``keys``, else the ``recovery_s`` setting."""
    found = [s for key in keys for s in samples.get(key, ())]
    if not found:
        return Learned.of(default, False, "assumed: recovery_s in tpuops.toml (no measured recovery from a "
                                       f"preemption in {_where(keys)})")
    return Learned.of(statistics.fmean(found), True,
                   f"learned from {_plural(len(found), 'preemption')} in {_where(keys)} "
                   "(PREEMPTED -> replacement READY, setup, restore and work redone)")


def lost_work(attempts: Iterable[AttemptTime], default: float) -> Learned:
    """Losses of unsaved work per running hour over ``attempts`` (every run's), else the setting (docstring)."""
    every = list(attempts)
    losses = sum(1 for a in every if a.recomputed_s > LOSS_MIN_S)
    hours = sum(a.productive_s + a.recomputed_s for a in every) / 3600
    if hours <= 0:
        return Learned.of(default, False, "assumed: lost_work_per_hour in tpuops.toml (no running time measured yet)")
    interval = rate_interval(losses, hours, CONFIDENCE)
    if losses:
        return Learned.of(interval.rate, True, f"learned from {_plural(losses, 'loss')} of unsaved work over "
                                            f"{hours:.1f} running hours")
    if interval.high < default:
        return Learned.of(interval.high, True, f"learned: no loss of unsaved work in {hours:.1f} running hours, so at "
                                            f"most {interval.high:.3g} per hour ({CONFIDENCE:.0%})")
    return Learned.of(default, False, f"assumed: lost_work_per_hour in tpuops.toml (no loss in {hours:.1f} running "
                                   "hours yet, too few to rule it out)")


def stockouts(risks: Sequence[Risk], keys: Sequence[RiskKey], default: Prior) -> tuple[Learned, Learned]:
    """Stockout spells per hour and their mean length, over ``keys`` (one size's zones; module docstring)."""
    found = [rate_for(risks, key, default) for key in keys]
    episodes = [episode for risk in found for episode in risk.stockouts]
    ended = [(e.end - e.start).total_seconds() for e in episodes if e.end is not None]
    hours = sum(r.ready_hours for r in found) + sum(ended) / 3600
    accelerator = keys[0].accelerator if keys else ""
    where = _where(keys)
    if episodes and hours > 0:
        rate = Learned.of(len(episodes) / hours, True, f"learned from {_plural(len(episodes), 'stockout')} over "
                                                       f"{hours:.1f} READY and stocked-out hours in {where}")
    else:
        rate = Learned.of(default.stockouts_per_hour(accelerator), False,
                          f"assumed: {default.stockouts_per_hour(accelerator):.3g} per hour for its hosts (no stockout "
                          f"with READY time around it in the ledger for {where})")
    if ended:
        spell = Learned.of(statistics.fmean(ended), True, f"learned from {_plural(len(ended), 'stockout')} that "
                                                          f"ended in {where}")
    else:
        spell = Learned.of(STOCKOUT_SPELL_S, False, f"assumed: {STOCKOUT_SPELL_S / 3600:g} h (no stockout of "
                                                    f"{where} ended in the ledger)")
    return rate, spell


def size_inputs(risks: Sequence[Risk], keys: Sequence[RiskKey], defaults: Defaults) -> list[SizeInputs]:
    """Each size's terms, largest first, for the sizes ``keys`` span (empty for one size, or without a catalog)."""
    accelerators = list(dict.fromkeys(key.accelerator for key in keys))
    if len(accelerators) < 2 or defaults.catalog is None:
        return []
    offers, catalog = defaults.prior.offers, defaults.catalog
    largest = offers.shape(accelerators[0]).replicas
    terms = []
    for accelerator in accelerators:
        mine = [key for key in keys if key.accelerator == accelerator]
        rate, spell = stockouts(risks, mine, defaults.prior)
        zone = mine[0].zone
        terms.append(SizeInputs(
            accelerator=accelerator, slowdown=largest / offers.shape(accelerator).replicas,
            spot_usd_per_hour=catalog.price_per_hour(accelerator, mine[0].capacity, zone),
            on_demand_usd_per_hour=catalog.price_per_hour(accelerator, "on-demand", zone),
            hazard_per_hour=hazard(risks, mine, defaults.prior), stockouts_per_hour=rate, spell_s=spell))
    return terms


def learn(risks: Sequence[Risk], histories: Iterable[NodeHistory], attempts: Mapping[str, Sequence[AttemptTime]],
          keys: Sequence[RiskKey], defaults: Defaults) -> PlanInputs:
    """The inputs of a run on ``keys`` (its zones, accelerator and capacity; an elastic run's for each size, largest
    first) from the ledger's ``risks`` and ``histories`` and the agents' ``attempts`` by run id."""
    largest = [key for key in keys if key.accelerator == keys[0].accelerator] if keys else []
    return PlanInputs(
        hazard_per_hour=hazard(risks, largest, defaults.prior),
        recovery_s=recovery(recovery_samples(histories, attempts), largest, defaults.recovery_s),
        lost_work_per_hour=lost_work((a for found in attempts.values() for a in found), defaults.lost_work_per_hour),
        sizes=size_inputs(risks, keys, defaults))
