"""Preemption risk learned from the ledger, per (zone, accelerator, capacity).

Google publishes no spot or preemptible TPU preemption rates; the honest source is the user's own
history, which the ledger holds (every incarnation, its READY time, every PREEMPTED transition).
From it, per (zone, accelerator, capacity):

- exposure: READY node-hours (the same intervals the cost tracker bills, ``tpuops.billing.cost``);
- preemptions: incarnations seen PREEMPTED (a name is recreated after one, so an incarnation is
  preempted at most once). A node that went from READY straight to gone unseen is not counted:
  the rate is a lower bound by the preemptions nobody saw;
- the rate per READY node-hour with its exact Poisson interval (``tpuops.billing.poisson``);
- create -> READY latency: from the incarnation's ``created_at`` to its first READY transition;
- failed creates and stockout episodes: an incarnation that was closed without ever being READY
  is a create that failed (a stockout, as the ledger alone cannot tell it from a quota or invalid
  refusal); consecutive failed creates of one key form an episode, which ends at the key's next
  create that reached READY (or is still going).

Where a key has no READY time the rate used for planning is an ASSUMPTION: the
``spot_preemptions_per_hour`` setting of tpuops.toml for spot and preemptible capacity, 0 for
on-demand (which Cloud TPU does not preempt). ``Risk.assumed`` says so wherever it is shown.
A pod slice is preempted whole when any of its hosts is, so the assumption for a slice of H hosts is
H times that setting (hosts preempted independently at the one-host rate), and its create -> READY
is assumed ``Prior.ready_s`` (the slice is READY when its last host is): both only until the
ledger has READY time (create latencies) of that slice size; what it learned then wins. Stockouts are assumed
the same way until the ledger has episodes of a size (``Prior.stockouts_per_hour``, ``STOCKOUT_SPELL_S``; an elastic
run's deadline policy weighs them, ``tpuops.launch.planning.size_inputs``).

How many hosts a slice has, and which capacities may be preempted, the configured provider's offers say
(``Prior.offers``), never a cloud's catalog.

Pure: a function of ledger rows (``NodeHistory``), ``now`` and the ``Prior``; no database, no clock.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpuops.billing.cost import ready_intervals
from tpuops.billing.ledger import NodeHistory
from tpuops.billing.poisson import rate_interval
from tpuops.billing.pricing import parse_capacity
from tpuops.providers.nodes import NodeState
from tpuops.providers.offers import Offers, hosts_of
from tpuops.providers.registry import offers_of

if TYPE_CHECKING:
    from tpuops.config import Settings

CONFIDENCE = 0.95
"""The confidence of every rate interval shown."""


@dataclass(frozen=True, order=True)
class RiskKey:
    zone: str
    accelerator: str
    capacity: str


@dataclass(frozen=True)
class Stockout:
    """Consecutive creates of one key that never became READY; ``end`` None while it lasts."""

    start: datetime
    end: datetime | None
    failed_creates: int

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat() if self.end else None,
                "failed_creates": self.failed_creates}


@dataclass(frozen=True)
class Risk:
    """What the ledger says about one (zone, accelerator, capacity), and the rate planning uses."""

    key: RiskKey
    nodes: int
    ready_hours: float
    preemptions: int
    rate_per_hour: float
    """Observed preemptions per READY node-hour, or the assumption when ``assumed``."""
    low: float | None
    high: float | None
    """The exact 95 % interval of the observed rate; None when assumed (no READY time)."""
    assumed: bool
    ready_latency_s: tuple[float, ...]
    """create -> READY seconds of every incarnation that became READY, oldest first."""
    stockouts: tuple[Stockout, ...]

    @property
    def failed_creates(self) -> int:
        return sum(episode.failed_creates for episode in self.stockouts)

    def latency_quantiles(self) -> tuple[float, float] | None:
        """Median and 90th percentile of create -> READY, or None without a sample."""
        samples = sorted(self.ready_latency_s)
        if not samples:
            return None
        return statistics.median(samples), samples[min(len(samples) - 1, int(0.9 * len(samples)))]

    def to_json(self) -> dict[str, Any]:
        latency = self.latency_quantiles()
        return {
            "zone": self.key.zone, "accelerator": self.key.accelerator, "capacity": self.key.capacity,
            "nodes": self.nodes, "ready_hours": round(self.ready_hours, 6), "preemptions": self.preemptions,
            "rate_per_hour": self.rate_per_hour, "low": self.low, "high": self.high, "confidence": CONFIDENCE,
            "assumed": self.assumed,
            "create_to_ready_s": None if latency is None else {"p50": latency[0], "p90": latency[1],
                                                               "samples": len(self.ready_latency_s)},
            "failed_creates": self.failed_creates, "stockouts": [s.to_json() for s in self.stockouts],
        }


STOCKOUTS_PER_HOST_HOUR = 0.01
"""ASSUMED stockout spells per hour of one host's spot capacity in a zone (Google publishes no stockout rates: about
one spell every four days), times the hosts of a slice, which needs all of them free at once."""

STOCKOUT_SPELL_S = 7200.0
"""ASSUMED mean length of a stockout spell (2 h), until the ledger has spells of that size that ended."""

ONE_HOST_READY_S = 90.0
"""ASSUMED create -> READY of a one-host TPU VM (docs/cloud-tpu.md: a v3-8 takes about 60-120 s)."""


@dataclass(frozen=True)
class Prior:
    """What is assumed of a key without history: ``spot_preemptions_per_hour`` (tpuops.toml) per host, and the
    configured provider's offers, which say how many hosts a slice of an accelerator has and which capacities
    are spot-priced (the ones it may preempt)."""

    spot_preemptions_per_hour: float
    offers: Offers = field(repr=False, compare=False)

    @classmethod
    def of(cls, settings: Settings) -> Prior:
        """The prior the settings give: their ``spot_preemptions_per_hour`` and their provider's offers."""
        return cls(settings.spot_preemptions_per_hour, offers_of(settings.node_provider))

    def rate(self, capacity: str, accelerator: str | None = None) -> float:
        """The assumed rate: the setting for spot-priced capacity (times the hosts of a slice of ``accelerator``:
        any host's preemption takes the slice), 0 for on-demand."""
        if parse_capacity(capacity).value not in self.offers.spot_priced():
            return 0.0
        return self.spot_preemptions_per_hour * (hosts_of(self.offers, accelerator) if accelerator else 1)

    def stockouts_per_hour(self, accelerator: str) -> float:
        """ASSUMED stockout spells per hour of ``accelerator`` in a zone: ``STOCKOUTS_PER_HOST_HOUR`` x its hosts."""
        return STOCKOUTS_PER_HOST_HOUR * hosts_of(self.offers, accelerator)

    def ready_s(self, accelerator: str) -> float:
        """ASSUMED create -> READY of ``accelerator``: the one-host figure times the square root of its hosts (a
        slice is READY when its slowest host is, and its hosts boot side by side: 180 s for 4 hosts)."""
        return ONE_HOST_READY_S * hosts_of(self.offers, accelerator) ** 0.5


def ready_at(history: NodeHistory) -> datetime | None:
    return next((t.at for t in history.transitions if t.state == NodeState.READY.value), None)


def _stockouts(members: Sequence[NodeHistory]) -> tuple[Stockout, ...]:
    episodes: list[Stockout] = []
    start: datetime | None = None
    failed = 0
    for history in sorted(members, key=lambda h: h.node.created_at):
        if ready_at(history) is not None:
            if failed:
                episodes.append(Stockout(start or history.node.created_at, history.node.created_at, failed))
            start, failed = None, 0
        elif history.node.deleted_at is not None:
            start = start or history.node.created_at
            failed += 1
    if failed and start is not None:
        episodes.append(Stockout(start, None, failed))
    return tuple(episodes)


def risk_of(key: RiskKey, members: Sequence[NodeHistory], now: datetime, prior: Prior) -> Risk:
    """The risk of one key from its incarnations (any order)."""
    ready_s = sum(i.seconds for h in members for i in ready_intervals(h.transitions, now))
    preemptions = sum(1 for h in members if any(t.state == NodeState.PREEMPTED.value for t in h.transitions))
    latencies = tuple((ready - h.node.created_at).total_seconds()
                      for h in sorted(members, key=lambda h: h.node.created_at)
                      if (ready := ready_at(h)) is not None)
    common = {"key": key, "nodes": len(members), "ready_hours": ready_s / 3600, "preemptions": preemptions,
              "ready_latency_s": latencies, "stockouts": _stockouts(members)}
    if ready_s <= 0:
        return Risk(rate_per_hour=prior.rate(key.capacity, key.accelerator), low=None,
                    high=None, assumed=True, **common)
    interval = rate_interval(preemptions, ready_s / 3600, CONFIDENCE)
    return Risk(rate_per_hour=interval.rate, low=interval.low, high=interval.high, assumed=False, **common)


def learn(histories: Iterable[NodeHistory], now: datetime, prior: Prior) -> list[Risk]:
    """One ``Risk`` per (zone, accelerator, capacity) the ledger has nodes of, sorted by key."""
    groups: dict[RiskKey, list[NodeHistory]] = defaultdict(list)
    for history in histories:
        node = history.node
        groups[RiskKey(node.zone, node.accelerator, parse_capacity(node.capacity).value)].append(history)
    return [risk_of(key, members, now, prior) for key, members in sorted(groups.items())]


def rate_for(risks: Iterable[Risk], key: RiskKey, prior: Prior) -> Risk:
    """The learned risk of ``key``, or the assumption when the ledger has nothing of it."""
    found = next((risk for risk in risks if risk.key == key), None)
    if found is not None:
        return found
    return Risk(key=key, nodes=0, ready_hours=0.0, preemptions=0,
                rate_per_hour=prior.rate(key.capacity, key.accelerator), low=None, high=None,
                assumed=True, ready_latency_s=(), stockouts=())
