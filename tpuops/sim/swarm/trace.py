"""What one seed did, as the checkers read it (``Trace``): the runner fills it in, the checkers of
``invariants``, ``promises``, ``notices`` and ``sweep_invariants`` read it, and none of them imports another's.

Imports: the billing truth of the simulated cloud (``tpuops.providers.simulated``), ``tpuops.runs``, the
simulation and the swarm's faults, draw, receivers and sweep watch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpuops import runs
from tpuops.core.errors import TpuopsError
from tpuops.providers.simulated import CALL_TIMEOUT_S, Billed
from tpuops.runs import Memory
from tpuops.sim.engine import START, Simulation
from tpuops.sim.swarm import faults as f
from tpuops.sim.swarm.draw import Scenario
from tpuops.sim.swarm.receivers import Receivers
from tpuops.sim.swarm.sweeps import SweepWatch

_BUSY = (f.API_ERRORS, f.API_OUTAGE, f.API_LAGGING_LIST, f.STORE_WRITE_ERRORS, f.STORE_READ_ERRORS,
         f.STORE_CAS_CONFLICT)
"""Fault kinds during whose windows a controller may be unable to act (its overrun allowance grows by them)."""
_LEDGER_BUSY = (*_BUSY, f.API_OPERATIONS)
"""...and the ledger unable to date what it saw (the operations listings date READY and self-deletes)."""


def _failing(fault: f.Fault, kinds: tuple[str, ...]) -> bool:
    """Whether calls failed throughout ``fault``'s window: a failing kind, or API answers slow enough to pass the
    client's call timeout (``tpuops.sim.swarm.extra``: such a call fails there, as an API error does; up to half the
    calls of a 60-s slowness, and a run's delete failed seven passes running: the swarm's seed 4889)."""
    return fault.kind in kinds or (fault.kind == f.API_SLOW and fault.count > CALL_TIMEOUT_S)


@dataclass
class Trace:
    """What one seed did, as the checkers read it."""

    scenario: Scenario
    sim: Simulation
    creates: list[tuple[float, str, str]]
    """(virtual time, zone, node name) of every create the cloud took (``FaultyCloud.creates``)."""
    stops: dict[str, float] = field(default_factory=dict)
    """By run: when the user's last stop or down was recorded (and no resume came after it)."""
    resumed: dict[str, float] = field(default_factory=dict)
    """By run: when the user's last ``train --resume`` was."""
    poisoned: set[str] = field(default_factory=set)
    """The runs whose memory or record a fault garbled."""
    garbled: dict[str, set[str]] = field(default_factory=dict)
    """By run: which of its documents a fault garbled (memory, status, stop, run, lease)."""
    orders: list[tuple[float, str, str]] = field(default_factory=list)
    """(virtual time, run, what) of every user command the store took: stop, down, resume."""
    errors: dict[str, str] = field(default_factory=dict)
    """By run: why this pass (every controller's in it) could not finish it, as its ``PassReport`` says."""
    sends: list[Send] = field(default_factory=list)
    """Every create or delete a controller's pass got to the cloud in this pass, with the lease of its run then."""
    pass_errors: list[str] = field(default_factory=list)
    """Every exception other than an injected death that escaped a pass (liveness)."""
    passes: list[float] = field(default_factory=list)
    """When each of the controller's passes was (virtual time, in order): the looks that frame an undated end."""
    clean_pass: bool = False
    """This pass saw no fault at all (no injection, no death): a stop must have taken effect in it."""
    stalls: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of every pass of the watch that took virtual time (slow calls, an overrun): it acted late."""
    now: float = START
    sweep: SweepWatch | None = None
    """The seed's sweep, when it has one (``tpuops.sim.swarm.sweep_invariants`` checks it)."""
    receivers: Receivers | None = None
    """The seed's simulated notification receivers and what they took (``tpuops.sim.swarm.notices`` reads it)."""

    def memory(self, run_id: str) -> Memory | None:
        """The run's memory as the store holds it; None when it cannot be read."""
        try:
            return runs.load_memory(self.sim.store, run_id)[0]
        except TpuopsError:
            return None

    def finished_at(self, memory: Memory) -> float | None:
        """When the run's memory last finished, or None."""
        ends = [event["at"] for event in memory.events if event["kind"] == "finished"]
        return ends[-1] if memory.finished and ends else None

    def busy_s(self, start: float, end: float, *, ledger: bool = False) -> float:
        """How long, within [start, end], a fault may have kept the controller from acting (``ledger``: or the ledger
        from dating what it saw): the windows of the failing kinds (``_failing``), a pass or more per kill or slipped
        pass, and the passes that took virtual time (``stalls``: how long they took)."""
        total = sum(max(0.0, min(end, hi) - max(start, lo)) for lo, hi in self.stalls)
        lo, hi = start - START, end - START
        for fault in self.scenario.faults:
            if _failing(fault, _LEDGER_BUSY if ledger else _BUSY):
                total += max(0.0, min(hi, fault.end) - max(lo, fault.start))
            elif fault.kind in (f.CONTROLLER_KILL, f.CLOCK_SKIPPED, f.CLOCK_LATE) and lo <= fault.start <= hi:
                total += self.scenario.cron_s * (1 + fault.rate)
        return total

    def intervals(self) -> list[Billed]:
        """Every READY interval of the world up to now, closed or open (the billing truth)."""
        return self.sim.world.ready_intervals()

    def judged(self) -> list[str]:
        """The runs the truth checks judge: every run but the poisoned ones."""
        return [plan.run_id for plan in self.scenario.runs if plan.run_id not in self.poisoned]


@dataclass(frozen=True)
class Send:
    """A create or delete of a run's node (its probe's too) that reached the cloud, and the run's lease then."""

    at: float
    sender: str
    """The lease holder of the controller whose pass sent it (the innermost passing: a rival runs inside the watch's
    call)."""
    verb: str
    node: str
    holder: str | None
    """Whom the run's lease document named as the call went (None: damaged)."""
    expires: float
