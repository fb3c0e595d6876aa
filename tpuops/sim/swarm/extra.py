"""The fault kinds added after the swarm's first 22: drawn from a stream of their own, played through the same views.

``draw`` adds zero to four of them (a dying worker with a chance of its own, ``EXTRA_CHANCES``) to a
seed's scenario from ``random.Random(f"{seed}:faults2")``, after every draw of the seed's first stream, so a seed
draws exactly the scenario it drew before they existed, plus these. ``More`` plays them beside the runner
(``tpuops.sim.swarm.runner``):

- time that calls take (``api.slow``, ``store.slow``, ``controller.overrun``): ``SlowCloud`` and ``SlowStore`` (the
  faulty views with a delay before each call) move the world's clock while the pass waits, so the agents step,
  nodes boot, preempt and delete themselves meanwhile, and the pass acts on what it read before. A pass that
  overruns runs the passes due meanwhile beside it (a cron ``reconcile`` while the ``watch`` is stalled);
- the cloud's own (``api.maintenance``, ``api.worker_dies``, ``api.never_boots``): asked of the simulated cloud
  (``tpuops.sim.world.SimWorld``) at their moment, as Cloud TPU would report them (``SimulatedCloud``);
- ``api.operations``: the node_operations listings (which date self-deletes) fail or lag;
- ``agent.late_notice``: the run's agent hears a notice late (``SimulatedAgent.late``).

Like the first kinds, whether a call is slowed, and how much, is a hash of the seed and the call (``faults.chance``),
never a shared stream. Each injection is counted by kind in the seed's ``Injected``.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from tpuops.core.errors import TransientError
from tpuops.providers.base import NodeProvider
from tpuops.providers.nodes import Operation
from tpuops.providers.simulated import CALL_TIMEOUT_S
from tpuops.sim.engine import START, Simulation
from tpuops.sim.swarm import faults as f
from tpuops.store import Store

MORE_HOURS = 6.0
"""The new faults fall inside the first six virtual hours too (``draw.FAULT_HOURS``)."""


EXTRA_CHANCES = (f.API_WORKER_DIES,)
"""Kinds drawn from this stream once more besides the later ones: a dying worker needs a slice run. (A stuck create
near the creates, which the first stream's windows seldom meet, broke money.billing_never_missed in 29 seeds of
1,000: READY is then dated between sightings; tests/sim/swarm_seeds.toml, seed 282.)"""


def _window(rng: random.Random, hours: float, shortest_s: float, longest_s: float) -> tuple[float, float]:
    """A window starting within the job's first life (one and a half times its length, at most ``MORE_HOURS``),
    when its nodes are up: a fault on a node needs one."""
    start = rng.uniform(0, min(MORE_HOURS, 1.5 * hours) * 3600)
    return start, start + rng.uniform(shortest_s, longest_s)


def _one(rng: random.Random, kind: str, runs: tuple[Any, ...], hours: float) -> f.Fault:
    """One fault of ``kind`` at a drawn moment, rate and duration."""
    slices = [plan.run_id for plan in runs if plan.accelerator == "v2-32"]
    run = rng.choice(slices) if kind == f.API_WORKER_DIES and slices else rng.choice(runs).run_id
    if kind == f.API_SLOW:
        return f.Fault(kind, *_window(rng, hours, 300, 3 * 3600), rate=rng.choice([0.1, 0.3, 0.7, 1.0]),
                       count=rng.choice([5, 20, 60]))
    if kind == f.STORE_SLOW:
        return f.Fault(kind, *_window(rng, hours, 300, 3 * 3600), rate=rng.choice([0.05, 0.2, 0.5]),
                       count=rng.choice([2, 10, 45]))
    if kind == f.API_OPERATIONS:
        return f.Fault(kind, *_window(rng, hours, 600, 4 * 3600), rate=rng.choice([0.3, 0.7, 1.0]),
                       arg=rng.choice(("errors", "lag")))
    if kind == f.API_MAINTENANCE:
        return f.Fault(kind, *_window(rng, hours, 600, 3 * 3600), run=run, count=rng.randint(120, 1800))
    if kind == f.API_WORKER_DIES:
        return f.Fault(kind, *_window(rng, hours, 600, 3 * 3600), run=run, count=rng.randint(1, 3))
    if kind in (f.API_NEVER_BOOTS, f.API_STUCK_CREATE):  # most creates come first: half these windows open at 0
        start, end = _window(rng, hours, 60, 2 * 3600 if kind == f.API_NEVER_BOOTS else 1800)
        start = start if rng.random() < 0.5 else 0.0
        return f.Fault(kind, start, max(end, start + 60), run=run if kind == f.API_NEVER_BOOTS else "",
                       count=rng.randint(1, 2) if kind == f.API_NEVER_BOOTS else 0)
    if kind == f.AGENT_LATE_NOTICE:
        start, end = _window(rng, hours, 3600, MORE_HOURS * 3600)
        return f.Fault(kind, start / 4, end, rate=rng.uniform(5, 120), run=run)
    at = rng.uniform(0, MORE_HOURS * 3600)  # controller.overrun
    return f.Fault(kind, at, at, rate=rng.choice([1.5, 2.5, 4.0]), count=rng.randint(1, 5))


def draw(seed: int, runs: tuple[Any, ...], hours: float) -> list[f.Fault]:
    """The new faults of ``seed`` (module docstring): ``runs`` are its run plans, ``hours`` its job's length."""
    rng = random.Random(f"{seed}:faults2")
    kinds = (*f.KINDS[len(f.FIRST_KINDS):], *EXTRA_CHANCES)
    return [_one(rng, rng.choice(kinds), runs, hours) for _ in range(rng.randint(0, 4))]


class More:
    """The new faults of one seed being played (module docstring). ``beside(at)`` runs one pass of a second
    controller process at ``at`` and ends it (the runner's rival)."""

    def __init__(self, sim: Simulation, faults: tuple[f.Fault, ...], injected: f.Injected, cron_s: float,
                 beside: Callable[[float], None]) -> None:
        self.world = sim.world
        self.zones = tuple(sim.settings.zones)
        self.injected = injected
        self.cron_s = cron_s
        self.beside = beside
        self._seq = itertools.count()
        self._host = [(x.start, next(self._seq), x) for x in faults if x.kind in (f.API_MAINTENANCE, f.API_WORKER_DIES)]
        heapq.heapify(self._host)
        self._overruns = sorted((x for x in faults if x.kind == f.CONTROLLER_OVERRUN), key=lambda x: x.start)
        self._armed: f.Fault | None = None
        self._calls = 0
        self._pass_at = START
        self._boots = {index: x.count for index, x in enumerate(faults) if x.kind == f.API_NEVER_BOOTS}
        self._faults = faults
        self._nth: Counter[tuple[str, ...]] = Counter()
        self._lock = threading.Lock()
        self._overlapping = False  # a stalled pass's neighbours are running: they do not stall it again
        self.world.never_boots(self._never_boots)
        self.world.agents.late = self._late

    # -- the cloud's own faults ---------------------------------------------------------------------

    def until(self, now: float) -> None:
        """Strike the maintenance events and dying workers due by ``now``, each at its moment (the world moves
        there). One that finds no READY node of its run tries again half a pass later, to its window's end."""
        while self._host and START + self._host[0][0] <= now:
            at, _, fault = heapq.heappop(self._host)
            self.world.advance_to(max(START + at, self.world.clock()))
            if self._strike(fault):
                self.injected.count(fault.kind)
            elif at + self.cron_s / 2 < fault.end:
                heapq.heappush(self._host, (at + self.cron_s / 2, next(self._seq), fault))

    def _strike(self, fault: f.Fault) -> bool:
        for zone in self.zones:
            if fault.kind == f.API_MAINTENANCE and self.world.maintenance(zone, fault.run, float(fault.count)):
                return True
            if fault.kind == f.API_WORKER_DIES and self.world.worker_dies(zone, fault.run, fault.count):
                return True
        return False

    def _never_boots(self, zone: str, name: str) -> bool:
        offset = self.world.clock() - START
        for index, left in self._boots.items():
            fault = self._faults[index]
            if left > 0 and fault.run == name and fault.covers(offset):
                self._boots[index] -= 1
                self.injected.count(f.API_NEVER_BOOTS)
                return True
        return False

    def _late(self, run_id: str, notice_at: float) -> float:
        for fault in self.injected.active(f.AGENT_LATE_NOTICE):
            if fault.run == run_id and fault.covers(notice_at - START):
                self.injected.count(f.AGENT_LATE_NOTICE)
                return fault.rate
        return 0.0

    # -- time the calls take ------------------------------------------------------------------------

    def passing(self, now: float) -> None:
        """A pass of the watch starts at ``now``: arm the overrun due, if any."""
        self._pass_at, self._calls = now, 0
        while self._overruns and START + self._overruns[0].start <= now:
            due = self._overruns.pop(0)
            self._armed = self._armed or due

    def api_call(self, *call: str) -> None:
        """Before an API call: the overrun armed stalls here, and a slow answer takes its time (past the client's
        call timeout, the call fails there)."""
        armed = self._armed
        if armed is not None and not self._overlapping:
            self._calls += 1
            if self._calls >= armed.count:
                self._armed = None
                self.injected.count(f.CONTROLLER_OVERRUN)
                self._stall(armed.rate * self.cron_s, overlap=True)
        delay = self._delay(f.API_SLOW, call)
        if delay > CALL_TIMEOUT_S:
            self._stall(CALL_TIMEOUT_S)
            raise TransientError(f"simulated: the Cloud TPU API did not answer {call[0]} within {CALL_TIMEOUT_S:.0f} s")
        self._stall(delay)

    def store_call(self, method: str, key: str) -> None:
        """Before a store call: a slow one takes its time."""
        self._stall(self._delay(f.STORE_SLOW, (method, key)))

    def _delay(self, kind: str, call: tuple[str, ...]) -> float:
        for fault in self.injected.active(kind):
            with self._lock:
                self._nth[(kind, *call)] += 1
                nth = self._nth[(kind, *call)]
            if f.chance(self.injected.seed, kind, *call, nth) < fault.rate:
                self.injected.count(kind)
                return f.chance(self.injected.seed, kind, "seconds", *call, nth) * fault.count
        return 0.0

    def _stall(self, seconds: float, *, overlap: bool = False) -> None:
        """The pass waits ``seconds`` of virtual time: the world moves on; with ``overlap``, each pass due meanwhile
        (one pass interval after this one started, and so on) runs beside it."""
        if seconds <= 0:
            return
        clock = self.world.clock
        end = clock() + seconds
        if overlap:
            self._overlapping = True
            try:
                due = self._pass_at + self.cron_s
                while due < end:
                    self.world.advance_to(max(due, clock()))
                    self.beside(clock())
                    due += self.cron_s
            finally:
                self._overlapping = False
        self.world.advance_to(max(end, clock()))


class SlowCloud(f.FaultyCloud):
    """The faulty cloud whose calls may take virtual time, and whose node_operations listings may fail or lag."""

    def __init__(self, inner: NodeProvider, injected: f.Injected, death: f.Death, now: Callable[[], float],
                 more: More) -> None:
        super().__init__(inner, injected, death, now)
        self.more = more
        self._operations: dict[tuple[str, str], list[Operation]] = {}

    def _fail(self, *call: str) -> None:
        super()._fail(*call)
        self.more.api_call(*call)

    def node_operations(self, zone: str, name: str) -> list[Operation]:
        self._fail("operations", zone, name)
        for fault in self.injected.active(f.API_OPERATIONS):
            if fault.arg == "lag":
                self.injected.count(f.API_OPERATIONS)
                return list(self._operations.get((zone, name), []))
        if self.injected.hits((f.API_OPERATIONS,), "operations", zone, name):
            raise TransientError(f"simulated: the Cloud TPU API answered 503 to the operations of {name}")
        found = super().node_operations(zone, name)
        self._operations[(zone, name)] = found
        return found


class SlowStore(f.FaultyStore):
    """The faulty store whose reads and writes may take virtual time."""

    def __init__(self, inner: Store, injected: f.Injected, death: f.Death, more: More) -> None:
        super().__init__(inner, injected, death)
        self.more = more

    def _read(self, method: str, key: str) -> None:
        super()._read(method, key)
        self.more.store_call(method, key)

    def _write(self, method: str, key: str) -> None:
        super()._write(method, key)
        self.more.store_call(method, key)
