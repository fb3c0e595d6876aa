"""The simulation loop: the real controller and sweep passes over the simulated cloud, in virtual time.

One ``Simulation`` wires what production wires (a store, a ledger, a ``Fleet``, a ``Controller``)
around one ``SimWorld`` (``tpuops.sim.world``: the simulated cloud and its agents on one virtual
clock), in a scratch directory; the control plane sees only the world's node provider. Each step moves the
clock to the next pass (every ``cron_s``, as ``tpuops schedule`` runs ``reconcile``, and, with a
``WakeUp``, when a preempted agent's wake marker would bring one sooner), applies what
the cloud did meanwhile (boots, notices, preemptions, jobs that ended), lets every running agent
write its heartbeat, and runs one real pass: ``decide`` for every run, the sweep pass (Optuna's
sampler and pruner on the store journal), the Fleet's ledger dating. Nothing is patched; the only
stand-ins are the cloud and the agent.

Invariant: every random draw comes from the seed (the cloud's and the agents' own generators), and
the clock starts at ``START`` (2030-01-01 UTC), so a seed reproduces a run's timeline exactly.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tpuops import runs
from tpuops.billing.cost import catalog_for, ready_intervals, spent
from tpuops.billing.ledger import Ledger
from tpuops.billing.pricing import Catalog
from tpuops.config import Settings
from tpuops.controller.reconcile import Controller, PassReport
from tpuops.core.clock import UTC
from tpuops.core.notices import NotifySettings
from tpuops.fleet import Fleet
from tpuops.providers.base import NodeProvider
from tpuops.providers.cloud_model import CloudModel
from tpuops.providers.simulated import Billed
from tpuops.runs import RunRecord
from tpuops.sim.model import AgentModel
from tpuops.sim.world import SimWorld
from tpuops.store import LocalStore, Store
from tpuops.sweeps.advance import SweepStep

START = datetime(2030, 1, 1, tzinfo=UTC).timestamp()
"""Where every simulation's clock starts."""

MEMORY_FS = Path("/dev/shm")
"""A file system in memory, where the machine has one (Linux)."""


def scratch_parent() -> str | None:
    """Where a simulation's scratch folder goes: a file system in memory when there is one with room (1 GiB) and
    the user named no ``TMPDIR``, else the usual temporary folder (None). A 1,000-trial sweep writes its store's
    objects some 10,000 times; each write's open, rename and stamp cost the process about 10 % more CPU time on a
    disk's file system."""
    if os.environ.get("TMPDIR") or not (MEMORY_FS.is_dir() and os.access(MEMORY_FS, os.W_OK)):
        return None
    return str(MEMORY_FS) if shutil.disk_usage(MEMORY_FS).free >= 1 << 30 else None

Say = Callable[[str], None]


def _quiet(_text: str) -> None:
    return None


@dataclass(frozen=True)
class WakeUp:
    """The wake-up (``tpuops.agent.wake``, ``tpuops.controller.wake``) as the simulation models it.

    The agent writes its marker ``save_s`` after the notice when its save fits in the notice (else it is
    killed first and there is none); the first hurried pass comes ``delay_s`` later (``watch`` lists the
    markers every second; a Cloud Run job takes its start-up time), then one every ``pace_s``. Only the
    first of those passes at or after the node's end is simulated: the ones before it see the node READY
    and do nothing but read.
    """

    delay_s: float = 1.0
    pace_s: float = 2.0

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.pace_s <= 0:
            raise ValueError(f"a wake-up needs a delay >= 0 and a pace > 0, got {self.delay_s} and {self.pace_s}")

    def pass_at(self, notice: float, end: float, save_s: float) -> float | None:
        """When the hurried pass that recovers a node preempted at ``end`` comes; None: no marker."""
        if save_s > end - notice:
            return None
        first = notice + save_s + self.delay_s
        return first + math.ceil(max(0.0, end - first) / self.pace_s) * self.pace_s


@dataclass(frozen=True)
class RunResult:
    """One run as the simulation ended it."""

    run_id: str
    outcome: str
    preemptions: int
    hours_to_result: float | None
    """From the simulation's start to the agent's success; None when it did not succeed."""
    usd: float
    """The simulated cloud's billing truth."""
    ledger_usd: float
    """What tpuops's ledger says the run cost (dated by the Fleet from what the passes saw)."""

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "outcome": self.outcome, "preemptions": self.preemptions,
                "hours_to_result": self.hours_to_result, "usd": round(self.usd, 6),
                "ledger_usd": round(self.ledger_usd, 6)}


@dataclass
class Footprint:
    """What a simulation asked of the cloud and left in the store."""

    api_calls: int = 0
    peak_calls_per_minute: int = 0
    """Cloud TPU API calls in the busiest virtual minute."""
    peak_creates_per_minute: int = 0
    """CreateNode calls in the busiest virtual minute for creates."""
    store_objects: int = 0
    journal_bytes: int = 0
    """Size of the sweeps' Optuna journals in the store (0 without a sweep)."""


@dataclass
class SimReport:
    """What one simulation did, and what it cost to simulate."""

    footprint: Footprint = field(default_factory=Footprint)
    simulated_s: float = 0.0
    wall_s: float = 0.0
    """What simulating took, on this machine."""
    cpu_s: float = 0.0
    """The CPU time this process spent simulating (every thread): what the simulation costs apart from
    the machine's other load and its disk."""
    passes: int = 0
    run_passes: int = 0
    """The simulated work: the runs going, summed over the passes (what ``max_run_passes`` bounds)."""
    slowest_pass_s: float = 0.0
    """The longest real controller pass (wall time)."""
    peak_pass_s: float = 0.0
    """The median wall time of the passes that saw the most runs going (the fleet at its peak)."""
    ended: bool = False
    """Every run and sweep finished within the simulated time allowed."""
    stopped_by: str = "ended"
    """What ended the simulation: ``ended`` (nothing active), ``horizon`` (``max_hours`` of virtual time),
    ``work`` (``max_run_passes`` of simulated work) or ``time`` (the wall-clock guard: the machine, not the
    model, limited it)."""
    runs: list[RunResult] = field(default_factory=list)
    unrecorded_nodes: int = 0
    """Billed READY intervals (the simulated cloud's) that no READY time of the same node in the ledger overlaps:
    nodes the ledger missed, whose cost no budget saw (0 is the goal)."""

    @property
    def speedup(self) -> float:
        return self.simulated_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def usd(self) -> float:
        return sum(run.usd for run in self.runs)

    @property
    def ledger_usd(self) -> float:
        return sum(run.ledger_usd for run in self.runs)

    def to_json(self) -> dict[str, Any]:
        return {"simulated_hours": round(self.simulated_s / 3600, 4), "wall_s": round(self.wall_s, 3),
                "speedup": round(self.speedup, 1), "cpu_s": round(self.cpu_s, 3),
                "cpu_speedup": round(self.simulated_s / self.cpu_s, 1) if self.cpu_s > 0 else 0.0,
                "passes": self.passes, "run_passes": self.run_passes,
                "slowest_pass_s": round(self.slowest_pass_s, 4), "peak_pass_s": round(self.peak_pass_s, 4),
                "api_calls": self.footprint.api_calls,
                "peak_api_calls_per_minute": self.footprint.peak_calls_per_minute,
                "peak_creates_per_minute": self.footprint.peak_creates_per_minute,
                "store_objects": self.footprint.store_objects, "journal_bytes": self.footprint.journal_bytes,
                "ended": self.ended, "stopped_by": self.stopped_by, "usd": round(self.usd, 6),
                "ledger_usd": round(self.ledger_usd, 6), "unrecorded_nodes": self.unrecorded_nodes,
                "runs": [run.to_json() for run in self.runs]}


class Simulation:
    """One simulated world in ``workdir``: store, ledger, cloud, agents, and the real controller over them."""

    def __init__(self, settings: Settings, workdir: Path, cloud: CloudModel, agent: AgentModel, *,
                 cron_s: float = 300.0, seed: int = 0, progress: Say = _quiet, wake: WakeUp | None = None,
                 notify: bool = False) -> None:
        """``notify``: keep the settings' ``[notify]`` targets; by default a simulation (a forecast, a dry run)
        tells nobody anything, whatever tpuops.toml configures."""
        if cron_s <= 0:
            raise ValueError(f"the pass interval must be > 0 s, got {cron_s}")
        self.wake = wake
        workdir.mkdir(parents=True, exist_ok=True)
        # The simulator is the only controller: its leases (on the virtual clock) outlast the gap between two
        # passes, as a ``watch`` keeps its own, so it keeps each sweep's study open (``KeptStudies``) instead of
        # replaying the journal every pass (a sixth of a 1,000-trial sweep's CPU time when cron_s > the TTL).
        self.settings = settings.model_copy(update={"store": str(workdir / "store"), "home": workdir,
                                                    "node_provider": "simulated",
                                                    "notify": settings.notify if notify else NotifySettings(),
                                                    "lease_ttl_s": max(settings.lease_ttl_s, 3 * cron_s)})
        self.cron_s = cron_s
        self.progress = progress
        self.store = LocalStore(workdir / "store", durable=False)  # scratch: nothing in it outlives the simulation
        self.ledger = Ledger(workdir / "ledger.sqlite")
        self.world = SimWorld(self.settings.project, cloud, agent, self.store, start=START, seed=seed)
        self.controller = self.controller_over(self.store, self.world.provider, "simulator")
        self.catalog: Catalog = catalog_for(self.settings)

    def controller_over(self, store: Store, provider: NodeProvider, holder: str,
                        notify: NotifySettings | None = None) -> Controller:
        """A fresh controller process of this world, as production wires one (a Fleet on the ledger, the sweep
        step), over ``store`` and ``provider``: the world's own, or the fault swarm's faulty views of them.
        ``notify``: the ``[notify]`` this process read, when its environment differs from the world's (a target
        held back)."""
        # One thread: the store and the cloud answer at once, so workers would only cost CPU time (a third of a
        # 1,000-trial sweep's), and the order of every call, hence the timeline, would vary from run to run.
        settings = self.settings if notify is None else self.settings.model_copy(update={"notify": notify})
        fleet = Fleet(provider, settings, self.ledger, clock=self.world.clock, threads=False)
        return Controller(settings, store, fleet, billing=fleet.billing, sweeps=SweepStep(), holder=holder,
                          status_refresh_s=0.0, clock=self.world.clock, threads=False)

    def declare(self, records: Iterable[tuple[RunRecord, dict[str, Any]]]) -> list[str]:
        """Declare runs (record and agent spec), as ``train --detach`` does; their ids."""
        declared = []
        for record, spec in records:
            runs.declare(self.store, record, spec)
            declared.append(record.run_id)
        return declared

    def run(self, *, max_hours: float, every_passes: int = 100, max_run_passes: int | None = None,
            wall_budget_s: float | None = None, quiet_skip_s: float = 0.0) -> SimReport:
        """Pass after pass until nothing is active (no run, no sweep), ``max_hours`` of virtual time,
        ``max_run_passes`` of simulated work (the runs going, summed over the passes: what a pass costs grows
        with them), or ``wall_budget_s`` of real time. The first three depend on the inputs alone, so the same
        inputs stop at the same pass; the last depends on the machine and is a last resort, reported as
        ``stopped_by="time"``. What has not ended when one of them stops it is reported unfinished.

        ``quiet_skip_s`` > 0 is the fast path of long studies: after a pass that acted on nothing while every
        active run has a READY node, the passes before the cloud's next event are skipped, up to ``quiet_skip_s``
        of virtual time; the pass after the event is still the first one on the ``cron_s`` grid, so every event
        is seen when cron would see it. What the skipped passes would have seen is only time passing: a rule that
        acts on time alone (the deadline policy's return to spot) acts up to ``quiet_skip_s`` later."""
        from tpuops.sweeps.ops import active_sweeps

        report = SimReport()
        started, cpu = time.perf_counter(), time.process_time()
        now = next_cron = START
        horizon = START + max_hours * 3600
        passes: list[tuple[int, float]] = []  # (runs going, wall seconds) of every pass
        work = 0
        while True:
            self.world.advance_to(now)
            before = time.perf_counter()
            passed = self.controller.run_pass(now=now)
            took = time.perf_counter() - before
            report.slowest_pass_s = max(report.slowest_pass_s, took)
            report.passes += 1
            going = len(runs.active_run_ids(self.store))
            passes.append((going, took))
            work += going
            if not going and not active_sweeps(self.store):
                report.ended = True
                break
            if now >= horizon:
                report.stopped_by = "horizon"
                break
            if max_run_passes is not None and work >= max_run_passes:
                report.stopped_by = "work"
                break
            if wall_budget_s is not None and time.perf_counter() - started >= wall_budget_s:
                report.stopped_by = "time"
                break
            if report.passes % every_passes == 0:
                self.progress(f"simulated {(now - START) / 3600:,.1f} h in {time.perf_counter() - started:,.1f} s: "
                              f"{going} runs going")
            while next_cron <= now:
                next_cron += self.cron_s
            if quiet_skip_s > 0:
                next_cron += self._skip(now, passed, quiet_skip_s) - self.cron_s
            now = min(self._next_pass(now, next_cron), horizon)  # a skip never leaps past it (nor out of dates)
        self.controller.release()
        report.wall_s, report.cpu_s = time.perf_counter() - started, time.process_time() - cpu
        report.run_passes = work
        report.simulated_s = now - START
        peak = max(going for going, _ in passes)
        report.peak_pass_s = statistics.median(took for going, took in passes if going == peak)
        objects = self.store.list("")
        report.footprint = Footprint(api_calls=sum(self.world.calls.values()),
                                     peak_calls_per_minute=max(self.world.calls.values(), default=0),
                                     peak_creates_per_minute=max(self.world.creates.values(), default=0),
                                     store_objects=len(objects),
                                     journal_bytes=sum(o.size for o in objects if "/journal/" in o.key))
        report.runs = self._results(now)
        report.unrecorded_nodes = self._unrecorded(now)
        return report

    def _skip(self, now: float, passed: PassReport, quiet_skip_s: float) -> float:
        """How far the next pass is: one ``cron_s``, or past a quiet stretch (see ``run``)."""
        quiet = not (passed.acted or passed.finished or passed.errors or any(passed.sweeps.values()))
        if not quiet or self.world.ready_nodes() < len(runs.active_run_ids(self.store)):
            return self.cron_s
        upcoming = self.world.next_event()
        until = min(quiet_skip_s, (upcoming - now) if upcoming is not None else quiet_skip_s)
        return max(self.cron_s, math.ceil(until / self.cron_s) * self.cron_s)

    def _next_pass(self, now: float, next_cron: float) -> float:
        """The next pass: the next on the ``cron_s`` grid, or the first hurried pass a wake marker brings if
        sooner. A marker written before the grid's next pass replaces that pass with its hurried one when
        that comes within one ``pace_s`` of it (``watch`` hurries instead of its regular passes; the
        hurried passes before the node's end are not simulated, so a recovery further off, a notice of
        30 s on Cloud TPU, keeps the grid, which then also stands for them)."""
        if self.wake is None:
            return next_cron
        save_s = self.world.agents.model.segments.save_s
        woken: float | None = None
        hurrying = False
        for notice, end in self.world.notices_ahead():
            at = self.wake.pass_at(notice, end, save_s)
            if at is None or at <= now:
                continue
            woken = at if woken is None else min(woken, at)
            hurrying = hurrying or notice + save_s < next_cron
        if woken is None:
            return next_cron
        return woken if hurrying and woken <= next_cron + self.wake.pace_s else min(next_cron, woken)

    def _unrecorded(self, now: float) -> int:
        """How many billed READY intervals of the simulated cloud no READY interval of the ledger's overlaps."""
        end = datetime.fromtimestamp(now, UTC)
        seen: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for history in self.ledger.histories(self.settings.project):
            key = (history.node.zone, history.node.name)
            seen.setdefault(key, []).extend((i.start.timestamp(), i.end.timestamp())
                                            for i in ready_intervals(history.transitions, end))
        billed = self.world.billed_intervals()
        return sum(1 for b in billed if not any(start < (b.end or now) and stop > b.start
                                                for start, stop in seen.get((b.zone, b.name), ())))

    def _price(self, interval: Billed) -> float:
        return self.catalog.price_per_hour(interval.accelerator, interval.capacity, interval.zone)

    def _results(self, now: float) -> list[RunResult]:
        billed = self.world.billed(self._price)
        end = datetime.fromtimestamp(now, UTC)
        results = []
        for run_id in runs.all_run_ids(self.store):
            memory, _ = runs.load_memory(self.store, run_id)
            agent = self.world.agents.by_run.get(run_id)
            finished = agent.finished_at if agent is not None else None
            results.append(RunResult(
                run_id=run_id, outcome=str(memory.outcome or "unfinished"), preemptions=memory.preemptions,
                hours_to_result=None if finished is None else (finished - START) / 3600,
                usd=billed.get(run_id, 0.0),
                ledger_usd=spent(self.ledger, self.catalog, project=self.settings.project, run_id=run_id, now=end)))
        return results
