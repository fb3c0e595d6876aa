"""Play one seed, and many: the real controller over the simulated world, with the seed's faults, checked.

``run_seed`` draws the seed's scenario (``tpuops.sim.swarm.draw``), builds a ``Simulation`` in a scratch folder,
and hands the real ``Controller`` (a Fleet on the ledger, the sweep step) the faulty views of the cloud and the
store (``tpuops.sim.swarm.faults``). Then pass after pass on the virtual clock: the user's commands and the
garbles due are applied to the clean store, the world moves to the pass's time, the controller passes (a
killed one is replaced by a fresh process, a rival one passes beside it), and the ``AFTER_PASS`` invariants
are checked. Once the faults are over and nothing is left to do (or ``MAX_HOURS`` of virtual time) the
``AT_END`` invariants are checked. A seed with a sweep (``tpuops.sim.swarm.sweeps``) declares it beside its runs
and plays ``Scenario.played()``: its faults and its ``stop --sweep`` among the others. ``run_many`` spreads seeds
over processes and sums what they found.
"""

from __future__ import annotations

import contextvars
import json
import multiprocessing
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuops import runs
from tpuops.config import load_settings
from tpuops.controller.probes import PROBE_SUFFIX
from tpuops.core import guards
from tpuops.core.errors import NotFound, TpuopsError
from tpuops.core.kinds import Capacity
from tpuops.launch.provision import plan_up
from tpuops.notify.wire import wired
from tpuops.providers.cloud_model import CloudModel, ScriptedStockout
from tpuops.runs import NodeSpec, RunKind, RunRecord, layout
from tpuops.sim.engine import START, Simulation, scratch_parent
from tpuops.sim.swarm import extra
from tpuops.sim.swarm import faults as f
from tpuops.sim.swarm import receivers as r
from tpuops.sim.swarm.draw import ZONES, Scenario, draw
from tpuops.sim.swarm.invariants import AFTER_PASS, AT_END, Checker, none_left
from tpuops.sim.swarm.sweeps import STOP_SWEEP, SweepWatch
from tpuops.sim.swarm.sweeps import declare as declare_sweep
from tpuops.sim.swarm.trace import Send, Trace

KINDS = f.KINDS + r.KINDS
"""Every fault kind the swarm injects: the ones a seed's main stream draws, then the receivers' (their own stream)."""

MAX_HOURS = 48.0
"""Virtual hours after which a seed is cut off (its unfinished runs are a liveness violation)."""


@dataclass
class SeedResult:
    """What one seed did and found."""

    seed: int
    violations: list[tuple[str, str]] = field(default_factory=list)
    """(invariant, what broke), first of each kind per pass."""
    injected: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    passes: int = 0
    simulated_h: float = 0.0
    cpu_s: float = 0.0
    guards_off: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations

    def replay(self) -> str:
        """The one command that replays this seed exactly."""
        off = "".join(f" --guard-off {name}" for name in self.guards_off)
        return f"python -m tpuops.sim.swarm --seed {self.seed}{off}"

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "ok": self.ok, "violations": [list(v) for v in self.violations],
                "injected": dict(self.injected), "checks": sum(self.checks.values()), "passes": self.passes,
                "simulated_hours": round(self.simulated_h, 3), "cpu_s": round(self.cpu_s, 4),
                "replay": self.replay()}


def _record(settings: Any, plan: Any) -> tuple[RunRecord, dict[str, Any]]:
    capacity = Capacity.SPOT if plan.spot else Capacity.ON_DEMAND
    up = plan_up(settings, plan.run_id, accelerator=plan.accelerator, capacity=capacity, zone=None,
                 run_id=plan.run_id)
    record = RunRecord(run_id=plan.run_id, kind=RunKind.TRAIN, node=NodeSpec.of(up.request, up.zones),
                       budget_usd=plan.budget_usd)
    return record, {"run_id": plan.run_id}


class _Play:
    """One scenario being played in ``workdir`` (see the module docstring)."""

    def __init__(self, scenario: Scenario, workdir: Path) -> None:
        self.scenario = scenario
        config = workdir / "tpuops.toml"
        config.write_text(r.config_text(scenario.seed, scenario.notify))  # the receivers' targets, if any
        environ = {"TPUOPS_HOME": str(workdir / "home"), "TPUOPS_ZONES": ",".join(ZONES),
                   **r.environ(scenario.seed, scenario.notify)}
        settings = load_settings(config_path=config, environ=environ)
        hazard = max((x.rate for x in scenario.faults if x.kind == f.API_PREEMPTION), default=0.0)
        stockouts = tuple(ScriptedStockout(x.arg, x.start, x.end - x.start) for x in scenario.faults
                          if x.kind == f.API_STOCKOUT) + (scenario.sweep.cloud_stockouts() if scenario.sweep else ())
        cloud = CloudModel(spot_hazard_per_hour=hazard, stockouts=stockouts)
        self.sim = Simulation(settings, workdir / "world", cloud, scenario.job, cron_s=scenario.cron_s,
                              seed=scenario.seed, notify=bool(scenario.notify.targets))
        self.sim.world.agents.fates = scenario.fates()
        self.sim.world.hold_self_deletes(self._answers_at)
        self.sim.declare(_record(self.sim.settings, plan) for plan in scenario.runs)
        clock = self.sim.world.clock
        self.injected = f.Injected(scenario.seed, scenario.faults, lambda: clock() - START)
        self.death = f.Death()
        self.more = extra.More(self.sim, scenario.faults, self.injected, scenario.cron_s, self._beside)
        self.store = extra.SlowStore(self.sim.store, self.injected, self.death, self.more)
        self.cloud = extra.SlowCloud(self.sim.world.provider, self.injected, self.death, clock, self.more)
        self.cloud.before_acting = self.store.run_meanwhile
        self.cloud.sent = self._sent
        self._senders: list[str] = []  # the holders of the passes under way, innermost last
        self.controller = self.sim.controller_over(self.store, self.cloud, "watch")
        self.receivers = r.Receivers(scenario.seed, scenario.notify, config, environ, self.injected, clock, START)
        self.trace = Trace(scenario, self.sim, self.cloud.creates, receivers=self.receivers)
        if scenario.sweep is not None:
            self.trace.sweep = SweepWatch(self.sim, scenario.sweep, declare_sweep(self.sim, scenario.sweep))
        self.result = SeedResult(scenario.seed)
        self._due = sorted([(c.at, "command", c) for c in scenario.commands] +
                           [(x.start, x.kind, x) for x in scenario.faults
                            if x.kind in (f.STORE_GARBLE, f.CONTROLLER_KILL, f.CONTROLLER_RIVAL)],
                           key=lambda item: item[0])
        self._rivalling: list[f.Fault] = []
        self._slips = sorted((x for x in scenario.faults if x.kind in (f.CLOCK_LATE, f.CLOCK_EARLY, f.CLOCK_SKIPPED)),
                             key=lambda x: x.start)
        self.faults_end = max([x.end for x in scenario.faults] + [c.at for c in scenario.commands] + [0.0])

    def _answers_at(self, at: float) -> float:
        """When a node's own DELETE made at ``at`` gets through: after every outage (or near-total error rate) that
        covers it; the VM retries until then."""
        offset, moved = at - START, True
        while moved:  # in offsets: START + end - START need not be end again in floating point
            moved = False
            for fault in self.scenario.faults:
                if fault.kind in (f.API_OUTAGE, f.API_ERRORS) and fault.rate >= 0.9 and fault.covers(offset):
                    offset, moved = fault.end, True
        return max(at, START + offset)

    # -- what happens between passes --------------------------------------------------------------

    def _apply(self, offset: float) -> tuple[f.Fault | None, list[f.Fault]]:
        """Apply the commands and garbles due by ``offset``; the kill to arm and the rival passes due (one for each
        rival whose window began by ``offset`` and has not ended, or began since the pass before)."""
        kill, rivals = None, [x for x in self._rivalling if offset < x.end]
        while self._due and self._due[0][0] <= offset:
            _, kind, item = self._due.pop(0)
            if kind == "command":
                self._command(item)
            elif kind == f.STORE_GARBLE:
                self._garble(item)
            elif kind == f.CONTROLLER_KILL:
                kill = kill or item
            else:
                rivals.append(item)
                self._rivalling.append(item)
        return kill, rivals

    def _command(self, command: Any) -> None:
        store, now = self.sim.store, self.sim.world.clock()
        if command.what == STOP_SWEEP and self.trace.sweep is not None:
            self.trace.stops.update(dict.fromkeys(self.trace.sweep.stop(now), now))
            return
        try:
            if command.what == "resume":  # drops the stop request whether or not the run had finished yet
                runs.reopen(store, command.run, "train --resume")
                self.trace.resumed[command.run] = now
                self.trace.stops.pop(command.run, None)
            else:
                runs.request_stop(store, command.run, f"{command.what} by the user", now)
                self.trace.stops[command.run] = now
        except TpuopsError:
            return  # the command failed (a garbled memory): the user saw its error, nothing changed
        self.trace.orders.append((START + command.at, command.run, command.what))

    def _garble(self, fault: f.Fault) -> None:
        doc, how = fault.arg.split(":")
        key = {"memory": layout.memory_key, "status": layout.status_key, "stop": layout.stop_key,
               "run": layout.record_key, "lease": lambda run: f"leases/{run}"}[doc](fault.run)
        store = self.sim.store
        try:
            data = store.read_bytes(key)
        except NotFound:
            return  # nothing there to garble (no stop request, no lease yet): the fault injects nothing
        store.write_bytes(key, f.garbled(data, how))
        self.injected.count(f.STORE_GARBLE)
        self.trace.garbled.setdefault(fault.run, set()).add(doc)
        if doc in ("memory", "run"):
            self.trace.poisoned.add(fault.run)

    # -- a pass -------------------------------------------------------------------------------------

    def _start(self, holder: str) -> Any:
        """A fresh controller process: it reads the config as its environment is now (a target whose url_env is
        malformed held back); None when it refused it and exited."""
        started, notify = self.receivers.starts()
        return self.sim.controller_over(self.store, self.cloud, holder, notify) if started else None

    def _pass(self, controller: Any, now: float | None) -> bool:
        """One pass of ``controller`` at ``now`` (None: its exit, dropping its leases); False when it died in it."""
        if controller is None:  # a process that refused its config: no pass
            return True
        self.receivers.begin_pass()
        try:
            if now is None:
                controller.release()
            else:
                self._senders.append(controller.leases.holder)
                try:
                    report = controller.run_pass(now=now)
                finally:
                    self._senders.pop()
                self.trace.errors.update(report.errors)
        except f.Killed:
            return False
        except TpuopsError as err:
            if not err.retryable:
                self.trace.pass_errors.append(f"{type(err).__name__}: {err}")
            # a retryable failure of the store or the API ended the pass early: as safe as a kill (the next redoes it)
        except Exception as err:  # anything else that escapes a pass is what liveness.pass_completes reports
            self.receivers.reached_pass(err)
            where = traceback.extract_tb(err.__traceback__)[-1]
            at = f"{Path(where.filename).name}:{where.lineno}"
            self.trace.pass_errors.append(f"{type(err).__name__}: {err} (at {at})")
        finally:
            self.receivers.end_pass()
        return True

    def _sent(self, verb: str, node: str) -> None:
        """A create or delete reached the cloud: note who sent it and whom its run's lease named then (from the clean
        store: what a third party would read). A node with no lease of its own is its run's probe; one of a run with
        no lease at all (an orphan the reaper deletes) is no run's business here."""
        for run in dict.fromkeys((node, node.removesuffix(PROBE_SUFFIX))):
            try:
                body = json.loads(self.sim.store.read_bytes(f"leases/{run}"))
                holder, expires = str(body["holder"]), float(body.get("expires", 0))
            except NotFound:
                continue
            except (ValueError, TypeError, KeyError, AttributeError):
                holder, expires = None, 0.0
            sender = self._senders[-1] if self._senders else "?"
            self.trace.sends.append(Send(self.sim.world.clock(), sender, verb, node, holder, expires))
            return

    def _beside(self, now: float) -> None:
        """One pass of a second controller process at ``now`` (a cron ``reconcile`` beside the ``watch``), then its
        exit, dropping its leases; its death is its own (the watch's process lives on)."""
        dead = self.death.dead
        rival = self._start("cron")  # None: it refused its config and exited 2 (what bad_url_held_back reports)
        alone = contextvars.Context()  # its own process: none of the watch's state (the deadline of its call)
        alone.run(self._pass, rival, now)
        alone.run(self._pass, rival, None)
        self.death.dead = dead

    def _rival(self) -> None:
        """The drawn rival (``controller.rival``): a cron pass beside the watch, now on the world's clock."""
        self._beside(self.sim.world.clock())
        self.injected.count(f.CONTROLLER_RIVAL)

    def _check(self, checkers: dict[str, Checker]) -> None:
        for name, checker in checkers.items():
            self.result.checks[name] += 1
            for line in checker(self.trace)[:3]:
                self.result.violations.append((name, line))

    def play(self) -> SeedResult:
        with wired(self.receivers):  # deliveries reach the simulated receivers, in virtual time
            return self._play()

    def _play(self) -> SeedResult:
        world, clock = self.sim.world, self.sim.world.clock
        now = START
        while True:
            offset = now - START
            kill, rivals = self._apply(offset)
            self.more.until(now)
            world.advance_to(now)
            if self.controller is not None and self.receivers.fixed(self.controller.settings.notify):
                self._pass(self.controller, None)  # the user fixed the url_env and restarts the watch that held it
                self.controller = self._start("watch")
            before = sum(self.injected.counts.values())
            self.trace.errors, self.trace.sends = {}, []
            if kill is not None:
                self.store.arm(kill)
            self.result.passes += 1
            self.more.passing(now)
            if self.controller is None:  # a restarted watch that exited on its config: its supervisor starts it again
                self.controller = self._start("watch")
            if rivals:  # the first passes in the middle of the watch's pass, the others after it
                self.store.meanwhile = self._rival
            self.trace.passes.append(now)
            passed = self._pass(self.controller, now)
            if clock() > now:  # slow calls, an overrun: the pass acted late
                self.trace.stalls.append((now, clock()))
            if not passed:
                self.death.dead = False
                self.controller = self._start("watch")  # a fresh process
            later = rivals[1:] if self.store.meanwhile is None else rivals
            self.store.meanwhile = None
            for _ in later:
                self._rival()
            self.trace.now = clock()
            self.trace.clean_pass = sum(self.injected.counts.values()) == before and not rivals
            self._check(AFTER_PASS)
            if offset >= self.faults_end and self._settled():
                break
            if offset >= MAX_HOURS * 3600:
                break
            now = max(self._next(now), clock())  # a pass that took virtual time (slow calls) delays the next
        self._pass(self.controller, None)
        self._check(AT_END)
        self.result.injected.update(self.injected.counts)
        self.result.injected[f.API_PREEMPTION] += sum(1 for b in world.ready_intervals() if b.reason == "preempted")
        for agent in world.agents.by_run.values():
            for attempt, fate in agent.fates.items():
                if attempt <= agent.attempts:  # the fated attempt ran
                    self.result.injected[f"agent.{fate.kind.value.replace('-', '_')}"] += 1
        self.result.simulated_h = (now - START) / 3600
        return self.result

    def _settled(self) -> bool:
        """Nothing is left to happen: no run or sweep active (but the poisoned), no node in the cloud, in any state.

        Not only READY ones: a poisoned run's PREEMPTED or TERMINATED node bills nothing, but the controller still
        has it to delete (``damaged.damaged_verdict``), and ``nodes.none_left``, asked here, judges every node
        left. Ending the seed while one stands judged the controller a pass too early (the swarm's seed 5300: the
        pass after a long outage lost its write-ahead to the garble, as it must, and the seed ended before the next
        pass, which reads the damaged memory and deletes the TERMINATED node)."""
        active = set(runs.active_run_ids(self.sim.store)) - self.trace.poisoned
        sweeping = self.trace.sweep is not None and self.trace.sweep.active()
        return not active and not sweeping and not none_left(self.trace) and self.sim.world.next_event() is None

    def _next(self, now: float) -> float:
        """The next pass's time: one pass interval on, as the clock faults due move it."""
        cron = self.scenario.cron_s
        due = now + cron
        while self._slips and self._slips[0].start <= due - START:
            slip = self._slips.pop(0)
            self.injected.count(slip.kind)
            if slip.kind == f.CLOCK_SKIPPED:
                due += cron
            elif slip.kind == f.CLOCK_LATE:
                due += slip.rate * cron
            else:
                due = max(now + 1.0, due - slip.rate * cron)
        return due


def run_seed(seed: int, *, scenario: Scenario | None = None, guards_off: Iterable[str] = ()) -> SeedResult:
    """Play ``seed`` (or ``scenario``, a shrunk one) with the named guards off; what it found."""
    off = tuple(sorted(guards_off))
    cpu = time.process_time()
    with guards.off(*off), tempfile.TemporaryDirectory(prefix="tpuops-swarm-", dir=scratch_parent()) as scratch:
        try:
            result = _Play((scenario or draw(seed)).played(), Path(scratch)).play()
        except Exception as err:  # the swarm's own failure is a finding too, never a lost seed
            where = traceback.extract_tb(err.__traceback__)[-1]
            result = SeedResult(seed, violations=[("swarm.harness", f"{type(err).__name__}: {err} (at "
                                                                    f"{Path(where.filename).name}:{where.lineno})")])
    result.guards_off = off
    result.cpu_s = time.process_time() - cpu
    return result


def _one(job: tuple[int, tuple[str, ...]]) -> SeedResult:
    return run_seed(job[0], guards_off=job[1])


def run_many(seeds: Iterable[int], *, workers: int = 1, guards_off: Iterable[str] = ()) -> Iterator[SeedResult]:
    """Each seed's result as it comes (in seed order with one worker; as they finish with more)."""
    off = tuple(sorted(guards_off))
    jobs = [(seed, off) for seed in seeds]
    if workers <= 1:
        yield from map(_one, jobs)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap_unordered(_one, jobs, chunksize=4)


@dataclass
class Summary:
    """What many seeds found, summed."""

    seeds: int = 0
    failed: list[SeedResult] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def add(self, result: SeedResult) -> None:
        self.seeds += 1
        self.injected.update(result.injected)
        self.checks.update(result.checks)
        self.violations.update(name for name, _ in result.violations)
        self.cpu_s += result.cpu_s
        if not result.ok:
            self.failed.append(result)

    def to_json(self) -> dict[str, Any]:
        per_min = self.seeds / (self.wall_s / 60) if self.wall_s > 0 else 0.0
        return {"seeds": self.seeds, "failed_seeds": sorted(r.seed for r in self.failed),
                "injected": {k: self.injected[k] for k in KINDS},
                "checks": dict(self.checks), "violations": dict(self.violations),
                "wall_s": round(self.wall_s, 2), "cpu_s": round(self.cpu_s, 2),
                "seeds_per_minute": round(per_min, 1),
                "cpu_s_per_seed": round(self.cpu_s / self.seeds, 4) if self.seeds else 0.0,
                "failures": [r.to_json() for r in sorted(self.failed, key=lambda r: r.seed)]}


def sweep(seeds: Iterable[int], *, workers: int = 1, guards_off: Iterable[str] = (),
          on_result: Callable[[SeedResult], None] | None = None) -> Summary:
    """Run every seed and sum them; ``on_result`` sees each one as it comes (a progress bar)."""
    summary = Summary()
    started = time.perf_counter()
    for result in run_many(seeds, workers=workers, guards_off=guards_off):
        summary.add(result)
        if on_result is not None:
            on_result(result)
    summary.wall_s = time.perf_counter() - started
    return summary
