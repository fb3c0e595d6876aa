"""The simulated Cloud TPU's assumptions: create -> READY latency, preemption hazard, stockouts, delete latency.

Every number has a stated default from docs/cloud-tpu.md; a caller with better numbers (the ledger's
learned risk, ``tpuops.billing.risk``) passes them in. Durations are seconds, rates per hour. Draws come
from a ``random.Random`` the caller seeds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from tpuops.core.errors import UsageError
from tpuops.providers.cloud_tpu.billing_rules import PREEMPTIBLE_CAPACITIES

CREATE_TO_READY_S = 90.0
"""docs/cloud-tpu.md: a v3-8 takes about 60-120 s from create to READY."""
NOTICE_S = 30.0
"""A preempted VM gets about 30 s between the notice and the end (docs/cloud-tpu.md)."""


@dataclass(frozen=True)
class Latency:
    """A log-normal duration given by its median and the spread of its logarithm."""

    median_s: float
    sigma: float = 0.25

    def draw(self, rng: random.Random) -> float:
        return self.median_s * math.exp(rng.gauss(0.0, self.sigma)) if self.sigma > 0 else self.median_s


@dataclass(frozen=True)
class ScriptedStockout:
    """No capacity in ``zone`` from ``start_s`` after the simulation's start, for ``duration_s``: for every size, or
    for ``accelerator`` alone (a big slice stocked out while a smaller size is there: what an elastic run meets), and
    for every capacity, or for ``capacity`` alone (a spot stockout while on-demand is there)."""

    zone: str
    start_s: float
    duration_s: float
    accelerator: str | None = None
    capacity: str | None = None

    def covers(self, zone: str, offset_s: float, accelerator: str | None = None, capacity: str | None = None) -> bool:
        return (zone == self.zone and self.start_s <= offset_s < self.start_s + self.duration_s
                and self.accelerator in (None, accelerator) and self.capacity in (None, capacity))


@dataclass(frozen=True)
class CloudModel:
    """The simulated Cloud TPU: create -> READY latency per accelerator, preemption hazard per zone and
    capacity, stockout episodes, delete latency, and the preemption notice."""

    ready_latency: Mapping[str, Latency] = field(default_factory=dict)
    """By accelerator type (``v3-8``); others take ``default_ready``."""
    default_ready: Latency = Latency(CREATE_TO_READY_S)
    replacement_ready: Latency | None = None
    """Create -> READY of a node whose name was created before (a replacement), where it differs (None:
    as any other): a calibration measures it apart, since a replacement's create comes in a busier pass."""
    hazard_per_hour: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """By (zone, capacity); spot and preemptible capacity elsewhere take ``spot_hazard_per_hour``."""
    spot_hazard_per_hour: float = 0.1
    stockouts: tuple[ScriptedStockout, ...] = ()
    delete_latency: Latency = Latency(30.0)
    notice_s: float = NOTICE_S
    self_delete: Latency = Latency(0.0, 0.0)
    """From a job's end to its node's self-delete (the startup script's metadata calls and its DELETE):
    the node stays READY, billed and preemptible meanwhile, as on the emulator and on Cloud TPU. 0 by
    default (the node goes at the job's end); a calibration passes the time it measured."""
    ends_with_agent: bool = False
    """How a preempted node ends. False: ``notice_s`` after its notice, when Cloud TPU stops the VM. True: once
    its job has stopped after the notice (``Workload.stops_at``), at the latest ``notice_s`` after it, as the
    local emulator ends a node when its agent exits; the hazard (or ``lifetime``) then dates the notice."""
    lifetime: Latency | None = None
    """A preemption trace instead of the hazard: a READY spot or preemptible node is preempted at an age drawn
    from this (sigma 0: every node at the same age), so that policies compare on equal preemption counts."""

    def __post_init__(self) -> None:
        rates = [self.spot_hazard_per_hour, *self.hazard_per_hour.values()]
        if any(rate < 0 for rate in rates):
            raise UsageError(f"a preemption rate must be >= 0 per hour, got {min(rates)}")

    def hazard(self, zone: str, capacity: str) -> float:
        """Preemptions per READY hour of one node; on-demand nodes are not preempted unless a rate says so."""
        if (zone, capacity) in self.hazard_per_hour:
            return self.hazard_per_hour[(zone, capacity)]
        return self.spot_hazard_per_hour if capacity in PREEMPTIBLE_CAPACITIES else 0.0

    def ready_for(self, accelerator: str, replacement: bool = False) -> Latency:
        if replacement and self.replacement_ready is not None:
            return self.replacement_ready
        return self.ready_latency.get(accelerator, self.default_ready)

    def out_of_capacity(self, zone: str, offset_s: float, accelerator: str | None = None,
                        capacity: str | None = None) -> bool:
        """Whether a create of ``accelerator`` on ``capacity`` in ``zone`` at ``offset_s`` is refused for capacity."""
        return any(episode.covers(zone, offset_s, accelerator, capacity) for episode in self.stockouts)


EMULATOR_SPEED = CloudModel(default_ready=Latency(0.2, 0.0), delete_latency=Latency(0.0, 0.0), spot_hazard_per_hour=0.0)
"""The local emulator's pace as the tests start it (a 0.2-s boot, deletes at once) and no random preemption:
the model of a simulated cloud opened from the registry, on wall time."""
