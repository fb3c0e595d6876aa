"""The swarm's sweeps: a seed's sweep, drawn from a stream of its own, declared as ``sweep start`` declares one,
played beside the seed's runs under the same faults, and the user's ``stop --sweep`` at a drawn moment.

Some seeds (``SHARE``) draw one sweep (``SwarmSweep``): a few to 20 trials, 1 to 5 at a time, the random or the
TPE sampler, the median pruner or none, spot or on-demand, single hosts, slices, or elastic trials
(``accelerator: [v2-32, v2-8]``: the trial runs on v2-8 while v2-32 is stocked out in every zone, and moves up
when a probe finds it again, ``tpuops.controller.decide``), sometimes a budget, sometimes the user's
``tpuops stop --sweep`` at a drawn moment. Its own faults target its trials: an agent's fate in a trial's
attempt, a controller killed at a trial run's writes or at the sweep's own documents (its journal, its state:
``faults.CONTROLLER_KILL`` with no run), a trial's status, stop request or lease garbled, a slice trial's
worker unhealthy, and, for elastic trials, the largest size stocked out in every zone for a while.

Independence: the sweep is drawn from ``random.Random(f"swarm/{seed}/sweeps")``, never from the seed's main
stream (``tpuops.sim.swarm.draw``), so every seed draws exactly the runs, commands and faults it drew before
sweeps existed (the regression seeds of ``tests/sim/swarm_seeds.toml`` replay by number); the scenario only
gains its ``sweep``. The runner plays ``Scenario.played()``: the seed's faults and commands with the sweep's
after them, so the sweep's faults go through the same faulty cloud and store as every other.

Declaring: the sweep's record (``SweepRecord``: the spec and a frozen trial template) is built here from the
simulation's settings, as ``sweep start`` plans one from an experiment file (the swarm's runs are declared from
a node request the same way, without an experiment file); then the record, the study and the active marker
are written by the real ``tpuops.sweeps.ops`` and ``tpuops.sweeps.studies``, and every pass after that is the
real sweep pass of the real controller. The trials' agents evaluate on the simulation's synthetic surface
(``tpuops.sim.agent.surface``), so the sampler and the pruner have something to work on.

``SweepWatch`` is what the sweep's invariants (``tpuops.sim.swarm.sweep_invariants``) read besides the store:
the plan, when the user stopped the sweep and how many trials its study held then.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpuops import runs
from tpuops.billing.cost import catalog_for
from tpuops.contract.runspec import DatasetSpec, FeatureSpec, RunSpec, TrainSpec
from tpuops.core.clock import UTC
from tpuops.core.errors import TpuopsError
from tpuops.core.kinds import Capacity
from tpuops.launch.provision import NodeBasis
from tpuops.providers.cloud_model import ScriptedStockout
from tpuops.providers.registry import provider_class
from tpuops.runs import RunKind, RunRecord
from tpuops.sim.swarm import faults as f
from tpuops.sweeps import ops as sweep_ops
from tpuops.sweeps import studies
from tpuops.sweeps.models import SweepRecord, SweepState
from tpuops.sweeps.spec import SweepSpec
from tpuops.sweeps.template import TrialTemplate, trial_run_id

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tpuops.sim.engine import Simulation

NAME = "sw"
"""The sweep's name: its trials are the runs ``sw-t0000``, ``sw-t0001``, ..."""
SHARE = 0.3
"""The share of seeds that draw a sweep."""
STOP_SWEEP = "stop --sweep"
"""The user's command (``Command.what``) that stops the sweep: ``tpuops stop --sweep sw``."""
LARGEST, SMALLER = "v2-32", "v2-8"
"""An elastic trial's sizes, largest first."""
MAX_WAVE_HOURS = 6.0
"""A sweep's waves of trials (trials / parallel, times the job's length) fit in this many hours: it runs while the
faults do (``draw.FAULT_HOURS``), and ends well inside the runner's ``MAX_HOURS``."""
TRIAL_HOURS = 8.0
"""A sweep's trials times the job's length stay under this many hours (but for its first three trials): 20 trials
of a quarter-hour job, three of a four-hour one. What a seed costs grows with its runs' passes."""
METRIC = "accuracy"
PER_REPLICA = 8


@dataclass(frozen=True)
class SwarmSweep:
    """One seed's sweep (module docstring): its spec's choices, the user's stop, and its own faults."""

    trials: int
    parallel: int
    sampler: str
    pruner: str
    accelerator: str
    elastic: bool = False
    spot: bool = True
    budget_usd: float | None = None
    elastic_wait_s: float = 0.0
    probe_every_s: float = 600.0
    stop_at: float | None = None
    """When the user runs ``tpuops stop --sweep`` (seconds from the start); None: never."""
    stockouts: tuple[tuple[str, float, float], ...] = ()
    """(zone, start, end): the largest size out of capacity there (an elastic sweep's), the smaller size not."""
    faults: tuple[f.Fault, ...] = ()

    def run_ids(self) -> list[str]:
        return [trial_run_id(NAME, number) for number in range(self.trials)]

    def parts(self) -> int:
        """Its droppable parts (the shrinker's): the sweep itself, its stop, each stockout, each fault."""
        return 1 + (self.stop_at is not None) + len(self.stockouts) + len(self.faults)

    def without(self, index: int) -> SwarmSweep | None:
        """The plan without its ``index``-th part (0: the whole sweep, None)."""
        if index == 0:
            return None
        index -= 1
        if self.stop_at is not None:
            if index == 0:
                return dataclasses.replace(self, stop_at=None)
            index -= 1
        if index < len(self.stockouts):
            return dataclasses.replace(self, stockouts=self.stockouts[:index] + self.stockouts[index + 1:])
        index -= len(self.stockouts)
        return dataclasses.replace(self, faults=self.faults[:index] + self.faults[index + 1:])

    def cloud_stockouts(self) -> tuple[ScriptedStockout, ...]:
        return tuple(ScriptedStockout(zone, start, end - start, LARGEST) for zone, start, end in self.stockouts)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stockouts"] = [list(s) for s in self.stockouts]
        data["faults"] = [x.to_json() for x in self.faults]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SwarmSweep:
        return cls(**{**data, "stockouts": tuple(tuple(s) for s in data.get("stockouts", ())),
                      "faults": tuple(f.Fault(**x) for x in data.get("faults", ()))})


# -- drawing ------------------------------------------------------------------------------------------


def _fault(rng: random.Random, plan: SwarmSweep, fault_hours: float) -> f.Fault:
    """One fault aimed at the sweep: at a trial's attempt, its run's writes or documents, or the sweep's own."""
    at = rng.uniform(0, fault_hours * 3600)
    run = trial_run_id(NAME, rng.randrange(plan.trials))
    kind = rng.choice((f.AGENT_CRASH, f.AGENT_USER_ERROR, f.AGENT_NAN, f.AGENT_HANG, f.AGENT_SAVE_FAILS,
                       f.CONTROLLER_KILL, f.CONTROLLER_KILL, f.STORE_GARBLE, f.API_UNHEALTHY_WORKER))
    if kind == f.CONTROLLER_KILL:  # no run: the count-th write of the sweep's own documents (journal, state)
        return f.Fault(kind, at, at, run=rng.choice((run, "")), count=rng.randint(1, 6))
    if kind == f.STORE_GARBLE:  # never its memory or record: a trial nobody can judge holds the sweep forever
        return f.Fault(kind, at, at, run=run, arg=f"{rng.choice(('status', 'stop', 'lease'))}:{rng.choice(f.GARBLES)}")
    if kind == f.API_UNHEALTHY_WORKER:
        return f.Fault(kind, at, at + rng.uniform(60, 2 * 3600), run=run)
    attempt = 1 if kind == f.AGENT_USER_ERROR else rng.randint(1, 2)
    return f.Fault(kind, 0.0, 0.0, rate=rng.uniform(0, 1800), run=run, count=attempt)


def draw_sweep(seed: int, job_hours: float, zones: tuple[str, ...], fault_hours: float) -> SwarmSweep | None:
    """The seed's sweep, or None (most seeds): from the seed's sweep stream alone (module docstring)."""
    rng = random.Random(f"swarm/{seed}/sweeps")
    if rng.random() >= SHARE:
        return None
    trials = rng.randint(3, max(3, min(20, int(TRIAL_HOURS / job_hours))))
    parallel = rng.randint(1, min(trials, 5))
    waves = max(1, int(MAX_WAVE_HOURS // job_hours))
    parallel = max(parallel, -(-trials // waves))  # so many trials at a time that the waves fit
    elastic = rng.random() < 0.35
    accelerator = LARGEST if elastic else rng.choice(("v3-8", "v3-8", LARGEST))
    plan = SwarmSweep(trials=trials, parallel=min(parallel, trials), sampler=rng.choice(("random", "tpe")),
                     pruner=rng.choice(("none", "median")), accelerator=accelerator, elastic=elastic,
                     spot=rng.random() < 0.7, budget_usd=rng.choice((None, None, None, None, 5.0, 20.0)),
                     elastic_wait_s=rng.choice((0.0, 600.0)), probe_every_s=rng.choice((600.0, 1800.0)))
    length_s = -(-trials // plan.parallel) * job_hours * 3600  # its waves, when nothing goes wrong
    stop_at = rng.uniform(0, length_s) if rng.random() < 0.3 else None
    stockouts: list[tuple[str, float, float]] = []
    if elastic and rng.random() < 0.8:
        for _ in range(rng.randint(1, 2)):  # while its trials run: a creates meets it, then a probe
            start = rng.uniform(0, min(fault_hours * 3600, 0.6 * length_s))
            end = start + rng.uniform(1800, 4 * 3600)
            stockouts.extend((zone, start, end) for zone in zones)  # stocked out everywhere: the run goes down
    plan = dataclasses.replace(plan, stop_at=stop_at, stockouts=tuple(stockouts))
    return dataclasses.replace(plan, faults=tuple(_fault(rng, plan, fault_hours) for _ in range(rng.randint(0, 4))))


# -- declaring and the user's stop ---------------------------------------------------------------------


def _spec(plan: SwarmSweep, eval_every_steps: int) -> SweepSpec:
    space = {"learning_rate": {"type": "float", "low": 0.0001, "high": 0.3, "log": True},
             "filters": {"type": "int", "low": 4, "high": 64, "step": 4}}
    return SweepSpec.model_validate({
        "name": NAME, "experiment": "swarm.yaml", "space": space,
        "objective": {"metric": METRIC, "direction": "maximize"},
        "sampler": {"type": plan.sampler, "seed": 7, "startup_trials": 3},
        "pruner": {"type": plan.pruner, "startup_trials": 2, "warmup_steps": eval_every_steps},
        "trials": plan.trials, "parallel": plan.parallel, "budget_usd": plan.budget_usd,
        "capacity": (Capacity.SPOT if plan.spot else Capacity.ON_DEMAND).value, "accelerator": plan.accelerator})


def _template(sim: Simulation, plan: SwarmSweep, eval_every_steps: int) -> TrialTemplate:
    """Trial 0's run as ``sweep start`` freezes it: its node per size, and a run spec keeping one global batch."""
    settings, run_id = sim.settings, trial_run_id(NAME, 0)
    basis = NodeBasis.of_settings(settings, accelerator=plan.accelerator,
                                  capacity=Capacity.SPOT if plan.spot else Capacity.ON_DEMAND, sweep_id=NAME)
    bundle = "0" * 64
    node = basis.run_node(run_id, RunKind.TRAIN, store_uri=sim.store.uri, bundle_sha256=bundle).frozen()
    smaller = [basis.at_size(settings, SMALLER).run_node(run_id, RunKind.TRAIN, store_uri=sim.store.uri,
                                                         bundle_sha256=bundle).frozen()] if plan.elastic else []
    record = RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=node, sweep=NAME, bundle_sha256=bundle,
                       created=datetime.now(UTC).isoformat(timespec="seconds"), smaller=smaller,
                       elastic_wait_s=plan.elastic_wait_s if plan.elastic else 0.0,
                       probe_every_s=plan.probe_every_s)
    replicas = provider_class(settings.node_provider).offers.shape(plan.accelerator).replicas
    job = sim.world.agents.model
    spec = RunSpec(run_id=run_id, store_root=sim.store.uri, entry_point="model:build",
                   dataset=DatasetSpec(features={"x": FeatureSpec("float32", (4,)), "y": FeatureSpec("int64", ())},
                                       label="y"),
                   train=TrainSpec(per_replica_batch_size=PER_REPLICA, steps=job.total_steps,
                                   global_batch=PER_REPLICA * replicas if plan.elastic else None,
                                   eval_every_steps=eval_every_steps))
    return TrialTemplate(record=record, spec=spec, project=settings.project, store_root=settings.store_root)


def declare(sim: Simulation, plan: SwarmSweep) -> SweepRecord:
    """Declare the sweep in the simulation's store as ``sweep start`` does (its study created, on the active list)."""
    job = sim.world.agents.model
    spec = _spec(plan, job.eval_every_steps)
    template = _template(sim, plan, job.eval_every_steps)
    hourly = catalog_for(sim.settings).price_per_hour(template.record.node.accelerator, template.record.node.capacity,
                                                      template.record.node.zones[0])
    budget = plan.budget_usd
    projected = hourly * job.length_s / 3600
    if budget is not None and projected > budget:  # plan_sweep refuses a budget that cannot pay for one trial
        spec = spec.model_copy(update={"budget_usd": None})
    record = SweepRecord(spec=spec, template=template, projected_usd=projected, experiment="swarm.yaml",
                         created=datetime.now(UTC).isoformat(timespec="seconds"))
    storage = studies.open_storage(spec, sim.store)
    sweep_ops.declare_sweep(sim.store, record)
    studies.create_study(spec, storage)
    sweep_ops.mark_active(sim.store, NAME)
    return record


class SweepWatch:
    """The seed's sweep as its invariants see it beside the store: its plan, the user's stop, the study's trials."""

    def __init__(self, sim: Simulation, plan: SwarmSweep, record: SweepRecord) -> None:
        self.sim = sim
        self.plan = plan
        self.record = record
        self.stopped_at: float | None = None
        """When the user's ``stop --sweep`` was recorded (its sweep still unfinished then)."""
        self.asked_at_stop = 0
        """How many trials the study held when it was stopped: no later one may be asked."""
        self.params: dict[int, dict[str, Any]] = {}
        """By trial number: the params its declared run holds (its spec.json's hparams), read once."""
        self.duplicates_checked = False
        """Whether the study's draws were checked for duplicates (once, after the pass that found it over)."""
        self._final: tuple[list[FrozenTrial], list[dict[str, Any]]] | None = None

    @property
    def spec(self) -> SweepSpec:
        return self.record.spec

    def stop(self, now: float) -> list[str]:
        """The user's ``tpuops stop --sweep sw``, as ``tpuops.api.control.stop`` records it: the sweep's unfinished
        runs, the sweep's stop (no new trial), then each run's stop request; the runs it stopped. The passes that
        follow carry it through (as for every recorded stop)."""
        store = self.sim.store
        try:
            found = [run.run_id for run in runs.list_runs(store, active_only=True) if run.record.sweep == NAME]
            state = sweep_ops.request_stop(store, NAME)
        except TpuopsError:
            return []  # the command failed: the user saw its error, nothing changed
        if not state.finished and self.stopped_at is None:
            self.stopped_at = now
            self.asked_at_stop = len(self.study()[0])
        for run_id in found:
            runs.request_stop(store, run_id, "tpuops stop --sweep", now)
        return found

    def study(self) -> tuple[list[FrozenTrial], list[dict[str, Any]]]:
        """The study's trials as its journal in the store holds them now, and the journal's every log."""
        storage, journal = studies.open_journaled(self.spec, self.sim.store)
        trials = studies.load_study(self.spec, storage).get_trials(deepcopy=False)
        return trials, journal.read_logs(0) if journal is not None else []

    def final(self) -> tuple[list[FrozenTrial], list[dict[str, Any]]] | None:
        """The study and its journal's logs once the sweep is over (read once: nothing changes them after); None
        while it is not (or its state cannot be read)."""
        if self._final is None:
            state = self.state()
            if state is not None and state.finished:
                self._final = self.study()
        return self._final

    def state(self) -> SweepState | None:
        """The sweep's state as the store holds it; None when it cannot be read."""
        try:
            return sweep_ops.load_state(self.sim.store, NAME)[0]
        except TpuopsError:
            return None

    def active(self) -> bool:
        """Whether the sweep is still on the passes' list."""
        return NAME in sweep_ops.active_sweeps(self.sim.store)
