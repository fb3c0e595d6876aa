"""The sweep pass: every unfinished sweep, advanced by one step, inside the controller's reconcile pass.

For each sweep on the active list, under the sweep's lease (``leases/sweeps/<sweep>``): load its
study exclusively, read the runs of its RUNNING trials only (finished trials cost no reads), let
``decide`` plan, and apply in this order:

1. report new intermediate values (step order, above each trial's high-water mark);
2. tell trials whose runs finished;
3. ask the pruner about running trials with new values; stop the pruned ones, then tell them PRUNED;
4. stop what the plan stops (sweep stopped, budget reached, too many preemptions), then tell;
5. endgame: move the leading trials to on-demand (record first, then the node goes at a checkpoint);
6. adopt RUNNING trials without a run (declare it; params drawn now if the ask died before them), and those
   whose run no controller has driven yet (its index markers written again: ``decide``);
7. launch: ask -> (the journal has it) -> set the trial's run id -> declare the run if absent.

A trial's run comes from the sweep's frozen template (``SweepRecord.template.for_trial``), never
from this pass's ``Settings`` (which serve cost accounting only). A run is stopped or promoted by
its memory's own transitions (``Memory.finish``, ``Memory.promote``), applied with
compare-and-swap under the run's lease; then its index marker is rewritten so that a controller's
cached copy is read again. After a stop, the run pass that follows in the same reconcile pass
deletes its node, which sends the agent the preemption notice, so it checkpoints on the way out.
New runs get their nodes from that same run pass. Killed at any line, the next pass redoes what
is missing: the journal is written before the run is declared, a declared run is never declared
twice, and a trial is asked only when the plan counts a free slot after adopting every RUNNING
trial. A pass batches its journal appends (``StoreJournal.batched``: one segment for the pass,
flushed before any run is declared), and a controller that runs pass after pass keeps each sweep's
study open between them for as long as it keeps the sweep's lease (``studies.KeptStudies``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpuops import runs
from tpuops.billing import deadline
from tpuops.billing.cost import catalog_for, spent_by_run
from tpuops.billing.ledger import Ledger
from tpuops.billing.pricing import Catalog
from tpuops.core.clock import UTC
from tpuops.core.errors import DamagedDocument, NotFound, PreconditionFailed, StudyError, TpuopsError, UsageError
from tpuops.core.kinds import Capacity
from tpuops.notify import outbox
from tpuops.notify.rules import sweep_notice
from tpuops.runs import ExitClass, Memory, Outcome
from tpuops.store import Store
from tpuops.store.lease import Leases
from tpuops.sweeps import hparams, studies
from tpuops.sweeps import ops as sweep_ops
from tpuops.sweeps.decide import (
    Plan,
    RunView,
    Stop,
    SweepView,
    Tell,
    TrialState,
    TrialView,
    decide,
    tell_for,
)
from tpuops.sweeps.models import SweepOutcome, SweepPhase, SweepRecord, SweepState
from tpuops.sweeps.spec import SweepSpec
from tpuops.sweeps.template import trial_run_id
from tpuops.sweeps.trials import FAILURE_ATTR, PassStudy, state_of

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tpuops.config import Settings
    from tpuops.fleet import Fleet



@dataclass
class SweepPassReport:
    advanced: list[str] = field(default_factory=list)
    skipped_leased: list[str] = field(default_factory=list)
    launched: list[str] = field(default_factory=list)  # run ids declared this pass
    told: dict[str, TrialState] = field(default_factory=dict)  # run id -> state
    stopped: dict[str, Outcome] = field(default_factory=dict)  # run id -> outcome
    promoted: list[str] = field(default_factory=list)  # run ids moved to on-demand (endgame)
    ended: dict[str, SweepOutcome] = field(default_factory=dict)  # sweep -> outcome
    errors: dict[str, str] = field(default_factory=dict)  # sweep -> why
    unlisted: str = ""  # why the active sweeps could not be listed this pass (none was advanced)


def lease_name(sweep: str) -> str:
    return f"sweeps/{sweep}"


def run_view(store: Store, run_id: str, metric: str, cost_usd: float, catalog: Catalog) -> RunView | None:
    """What a trial's run shows (its node priced by ``catalog``): None when it was never declared."""
    try:
        record = runs.read_record(store, run_id)
    except DamagedDocument:  # a trial the sweep cannot judge holds its slot until repaired or forgotten
        return RunView(finished=False, reason="its run.json is damaged")
    except UsageError:
        if runs.run_exists(store, run_id):
            raise
        return None
    status, memory, damage = runs.read_state(store, run_id)  # damaged: not finished, as far as the sweep can tell
    evals = tuple((point.step, point.metrics[metric]) for point in (status.evals if status else [])
                  if metric in point.metrics)
    final = status.eval_metric(metric) if status and status.exit_class == ExitClass.SUCCEEDED else None
    capacity = memory.capacity or record.node.capacity
    zone = memory.zone or (record.zones[0] if record.zones else "")
    hourly = catalog.price_per_hour(record.node.accelerator, capacity, zone) if zone else 0.0
    return RunView(finished=memory.finished, outcome=memory.outcome,
                   reason=memory.reason or "", step=status.step if status else 0, evals=evals, final=final,
                   work_done=status is not None and status.work_done,
                   preemptions=memory.preemptions, cost_usd=cost_usd, on_demand=capacity is Capacity.ON_DEMAND,
                   promoted=memory.capacity is not None, usd_per_hour=hourly,
                   driven=memory.attempts > 0 or bool(memory.events) or bool(damage))  # damaged: holds its slot


def _rewrite(store: Store, leases: Leases, run_id: str, change: Callable[[Memory], bool]) -> bool:
    """Change the run's controller memory under its lease (compare-and-swap); False if this pass cannot.

    The run's index marker is rewritten after, so a controller holding a copy of the memory reads it afresh.
    """
    if not leases.acquire(run_id):
        return False
    memory, generation = runs.load_memory(store, run_id)
    if memory.finished or not change(memory):
        return False
    try:
        runs.save_memory(store, run_id, memory, generation)
    except PreconditionFailed:
        return False
    runs.mark_active(store, run_id)
    return True


def stop_run(store: Store, leases: Leases, run_id: str, outcome: Outcome, reason: str, now: float) -> bool:
    """Finish the run (its node is deleted by the run pass, so the agent checkpoints on the notice).

    False if this pass cannot, or the run ended on its own meanwhile (the next pass tells it as it ended).
    """
    def finish(memory: Memory) -> bool:
        memory.finish(now, outcome, reason)
        return True

    return _rewrite(store, leases, run_id, finish)


def promote_run(store: Store, fleet: Fleet, leases: Leases, run_id: str, now: float) -> bool:
    """Endgame: recreate the run's node on-demand. The memory says so first (what the next create asks
    for, and that the node goes on purpose), then the node the run recorded is deleted through the
    fleet, which dates the end of its billing in the ledger: the agent checkpoints on the notice and
    the run pass recreates it from its checkpoint. False if this pass cannot, or if the agent has ended or trained
    every step since the pass read its status (``AgentStatus.work_done``): the run pass reads its exit next."""
    record = runs.read_record(store, run_id)
    if record.node.capacity is Capacity.ON_DEMAND:
        return False
    status = runs.read_state(store, run_id)[0]  # a damaged status reads as none: no word that the work is done
    if status is not None and status.work_done:
        return False
    if not _rewrite(store, leases, run_id,
                    lambda memory: memory.promote(now, deadline.endgame(), record.node.capacity)):
        return False
    zone = runs.load_memory(store, run_id)[0].zone
    if zone:
        with contextlib.suppress(NotFound):  # gone already: the run pass recreates it all the same
            fleet.delete(zone, record.node_name)
    return True


def _pace(last_pass: str | None, now: float) -> float:
    """The gap since the sweep's last pass: how long the next one is likely to be away (0 for a first pass)."""
    if not last_pass:
        return 0.0
    try:
        return max(0.0, now - datetime.fromisoformat(last_pass).timestamp())
    except ValueError:
        return 0.0


class SweepPass:
    """Advances every active sweep of one store, once; a controller's pass runs one (``SweepStep``) before its runs."""

    def __init__(self, settings: Settings, store: Store, ledger: Ledger, leases: Leases, *,
                 held: set[str], progress: Callable[[str], None], fleet: Fleet | None = None,
                 environ: Mapping[str, str] | None = None, kept: studies.KeptStudies | None = None) -> None:
        self.settings = settings
        self.kept = kept or studies.KeptStudies()
        """The studies kept open from earlier passes of the same controller (a one-shot pass keeps none)."""
        self.fleet = fleet
        self.store = store
        self.ledger = ledger
        self.leases = leases
        self.held = held
        self.progress = progress
        self.environ = environ
        self.catalog = catalog_for(settings)
        self.to_tell: list[tuple[str, SweepState, int]] = []
        """Sweeps whose notices are due, with the state and generation their write-ahead left: ``tell`` sends
        them after the run pass, so that no receiver holds up the trials' teardown."""

    def run(self, now: float | None = None) -> SweepPassReport:
        """Advance every active sweep; one sweep's failure is that sweep's error in the report, never the pass's.

        Optuna's exceptions (a sampler's or pruner's, a journal entry it cannot read) share no base class and
        come through every call of a sweep's step, so they are converted here, once, to ``StudyError``; the
        sweep's state is not written, and the next pass tries it again. KeyboardInterrupt and SystemExit are
        not failures of a sweep: they end the pass. A store that cannot list the active sweeps fails no run: the
        report says why in ``unlisted``, and the run pass that follows reconciles the trials' runs as it finds
        them (no trial is asked or stopped, so none is duplicated or orphaned); the next pass lists again."""
        report = SweepPassReport()
        try:
            names = sweep_ops.active_sweeps(self.store)
        except TpuopsError as err:
            report.unlisted = str(err)
            self.progress(f"cannot list the active sweeps this pass ({err}); runs are reconciled, "
                          "sweeps wait for the next pass")
            return report
        for name in names:
            try:
                self._advance(name, report, time.time() if now is None else now)
            except Exception as err:
                self.kept.forget(name)
                failure = err if isinstance(err, TpuopsError) else StudyError(
                    f"its study failed ({type(err).__name__}: {err})")
                report.errors[name] = str(failure)
                self.progress(f"sweep {name}: {failure}; the next pass tries again")
            except BaseException:
                self.kept.forget(name)  # what it kept may hold half a pass
                raise
        return report

    def _read_sweep(self, name: str) -> SweepRecord:
        """The sweep's record; one of the older format is upgraded first with the config's project and store root
        (``sweeps.ops.upgrade_sweep``), so that a sweep started by an older version goes on."""
        try:
            return sweep_ops.read_sweep(self.store, name)
        except DamagedDocument:  # read again: damaged for good, it says so then
            settings = self.settings
            sweep_ops.upgrade_sweep(self.store, name, project=settings.project, store_root=settings.store_root)
        return sweep_ops.read_sweep(self.store, name)

    def _advance(self, name: str, report: SweepPassReport, now: float) -> None:
        state, generation = sweep_ops.load_state(self.store, name)
        if state.finished and outbox.waiting(state.notices):  # over, its messages not all delivered yet
            if self.leases.acquire(lease_name(name), now):
                self.held.add(lease_name(name))
                self.to_tell.append((name, state, generation))
            return
        if state.finished:
            sweep_ops.save_state(self.store, name, state, generation)  # drops the stale active marker
            return
        if not self.leases.acquire(lease_name(name), now):
            report.skipped_leased.append(name)
            return
        self.held.add(lease_name(name))
        sweep = self._read_sweep(name)
        spec = sweep.spec
        storage, journal = self.kept.open(spec, self.store, self.leases.tenure(lease_name(name)), self.environ)
        study = PassStudy(spec, storage, journal)
        costs = spent_by_run(self.ledger, self.catalog, project=self.settings.project, sweep_id=name,
                             now=datetime.fromtimestamp(now, UTC))
        views = self._views(spec, study.trials(), costs)
        spent_usd = sum(costs.values())
        plan = decide(SweepView(
            trials=tuple(views.values()), wanted=spec.trials, parallel=spec.parallel,
            max_preemptions=spec.max_preemptions, max_failures=spec.max_failures,
            objective_step=spec.objective.step, stopping=state.phase is SweepPhase.STOPPING,
            budget_usd=spec.budget_usd, spent_usd=spent_usd, projected_usd=sweep.projected_usd,
            maximize=spec.objective.direction == "maximize",
            endgame=spec.endgame if self.fleet is not None else None,
            promoted=len(state.promoted), pace_s=_pace(state.last_pass, now)))
        with journal.batched() if journal is not None else contextlib.nullcontext():
            self._apply(sweep, study, views, plan, report, now)
        report.advanced.append(name)
        state.promoted = sorted({*state.promoted, *(int(r.rsplit("-t", 1)[1]) for r in report.promoted
                                                   if r.startswith(f"{name}-t"))})
        if journal is not None:
            journal.compact()
        state.passes += 1
        state.last_pass = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")
        state.waiting = plan.waiting_reason
        if plan.ended is not None:
            state.finish(*plan.ended)
            self._worth_telling(spec, study, state, spent_usd, now)
            self.kept.forget(name)
            report.ended[name] = plan.ended[0]
            self.progress(f"sweep {name}: {state.outcome}: {state.reason}")
        try:
            generation = sweep_ops.save_state(self.store, name, state, generation)  # the notices' write-ahead too
        except PreconditionFailed:
            self.progress(f"sweep {name}: its state changed during the pass ('sweep stop'); the next pass sees it")
            return
        if outbox.due(state.notices, now):
            self.to_tell.append((name, state, generation))

    # ----- notifications (tpuops.notify): decided with the sweep's ending, written first, sent after the runs -----

    def _worth_telling(self, spec: SweepSpec, study: PassStudy, state: SweepState, spent_usd: float,
                       now: float) -> None:
        """Queue in ``state`` the message the sweep's ending is worth, with its best trial (``notify.rules``)."""
        config = self.settings.notify
        targets, kinds = config.chosen(spec.notify)
        done = [(t.number, t.value) for t in study.trials()
                if state_of(t) is TrialState.COMPLETE and t.value is not None]
        pick = max if spec.objective.direction == "maximize" else min
        best = pick(done, key=lambda pair: pair[1]) if done else None
        notice = sweep_notice(spec.name, tuple(targets), frozenset(kinds), (str(state.outcome), state.reason or ""),
                              best, spec.objective.metric, spent_usd, now)
        if notice is None:
            return
        notice.link = f"{config.dashboard_url.rstrip('/')}/sweeps/{spec.name}" if config.dashboard_url else None
        outbox.queue(state.notices, [notice], lambda kind, text: self.progress(f"sweep {spec.name}: {kind}: {text}"))

    def tell(self, now: float, round_: outbox.Round | None = None) -> None:
        """Deliver the due notices of the sweeps this pass advanced or found waiting, then write the marks;
        within the controller pass's ``round_`` of deliveries (its time bound) when given."""
        for name, state, generation in self.to_tell:
            if outbox.deliver(state.notices, self.settings.notify, now,
                              lambda kind, text, name=name: self.progress(f"sweep {name}: {kind}: {text}"), round_):
                with contextlib.suppress(PreconditionFailed):  # 'sweep stop' wrote it: the next pass tries again
                    sweep_ops.save_state(self.store, name, state, generation)
        self.to_tell.clear()

    def _views(self, spec: SweepSpec, trials: list[FrozenTrial], costs: Mapping[str, float]) -> dict[int, TrialView]:
        views = {}
        for trial in trials:
            run = None
            state = state_of(trial)
            if state is TrialState.RUNNING:
                run_id = trial_run_id(spec.name, trial.number)
                run = run_view(self.store, run_id, spec.objective.metric, costs.get(run_id, 0.0), self.catalog)
            reported = max(trial.intermediate_values, default=-1)
            views[trial.number] = TrialView(trial.number, state, reported=reported,
                                            failure=bool(trial.user_attrs.get(FAILURE_ATTR)), run=run)
        return views

    def _apply(self, sweep: SweepRecord, study: PassStudy, views: dict[int, TrialView], plan: Plan,
               report: SweepPassReport, now: float) -> None:
        spec, name = sweep.spec, sweep.name
        for number, step, value in plan.reports:
            study.report(number, step, value)
        for tell in plan.tells:
            self._tell(study, spec, tell, report)
        stops = list(plan.stops)
        for number in plan.prune_candidates:
            judged = study.pruned_at(number)
            if judged is not None:
                step, value = judged
                why = f"pruned at step {step} ({spec.objective.metric} {value:.4g})"
                stops.append(Stop(number, Outcome.PRUNED, why))
        for stop in stops:
            run_id = trial_run_id(name, stop.number)
            if not stop_run(self.store, self.leases, run_id, stop.outcome, stop.why, now):
                continue
            self.held.add(run_id)
            report.stopped[run_id] = stop.outcome
            self.progress(f"sweep {name}: trial {stop.number} {stop.outcome}: {stop.why}")
            view = views[stop.number]
            run = RunView(finished=True, outcome=stop.outcome, reason=stop.why)
            has_values = view.reported >= 0 or any(r[0] == stop.number for r in plan.reports)
            self._tell(study, spec, tell_for(stop.number, run, spec.objective.step, has_values), report)
        for number in plan.promote:
            run_id = trial_run_id(name, number)
            if self.fleet is not None and promote_run(self.store, self.fleet, self.leases, run_id, now):
                self.held.add(run_id)
                report.promoted.append(run_id)
                self.progress(f"sweep {name}: trial {number} promoted to on-demand (endgame)")
        for number in plan.adopt:
            self._declare(sweep, study, number, report, adopted=True)
        for _ in range(plan.launch):
            self._declare(sweep, study, study.ask(), report, adopted=False)

    def _tell(self, study: PassStudy, spec: SweepSpec, tell: Tell, report: SweepPassReport) -> None:
        study.tell(tell.number, tell.state, tell.value, tell.why, tell.failure)
        report.told[trial_run_id(spec.name, tell.number)] = tell.state
        self.progress(f"sweep {spec.name}: trial {tell.number} {tell.state}"
                      + (f" {spec.objective.metric}={tell.value:.4g}" if tell.value is not None else f" ({tell.why})"))
        self._to_tensorboard(study, spec, tell)

    def _to_tensorboard(self, study: PassStudy, spec: SweepSpec, tell: Tell) -> None:
        """The told trial as a TensorBoard HParams session (``tpuops.sweeps.hparams``). The tell stands either
        way: a failed write costs the trial its place in TensorBoard, not the pass, and is said."""
        trial = study.frozen(tell.number)
        started = trial.datetime_start.timestamp() if trial.datetime_start else time.time()
        try:
            hparams.write_trial(self.store, spec.name, tell.number, studies.trial_params(trial.params),
                                spec.objective.metric, tell.value, max(trial.intermediate_values, default=0),
                                tell.state, started, time.time())
        except TpuopsError as err:
            self.progress(f"sweep {spec.name}: trial {tell.number} not written for TensorBoard: {err}")

    def _declare(self, sweep: SweepRecord, study: PassStudy, number: int, report: SweepPassReport, *,
                 adopted: bool) -> None:
        run_id = trial_run_id(sweep.name, number)
        params = study.params(number, run_id)
        study.durable()  # the journal holds the trial before its run exists
        if sweep_ops.declare_trial_run(self.store, sweep, number, params):
            report.launched.append(run_id)
            verb = "adopted trial" if adopted else "trial"
            self.progress(f"sweep {sweep.name}: {verb} {number} -> run {run_id} {params}")


class SweepStep:
    """The sweeps' part of a controller's passes (the controller's ``PassStep``): one ``SweepPass`` per full pass,
    over the pass's own leases and Fleet, with the studies kept open from one pass to the next.

    Whoever builds a controller hands it one (``tpuops.api.controller``, the simulator), so that every pass a
    user runs advances the sweeps while the controller imports none of this package; the studies it keeps
    live as long as it does (one per controller, as ``KeptStudies`` asks: they are good for one lease holder).
    """

    def __init__(self) -> None:
        self.kept = studies.KeptStudies()
        self._last: SweepPass | None = None  # the pass just run, until its notices are sent

    def run(self, now: float, *, settings: Settings, store: Store, fleet: Fleet, leases: Leases,
            held: set[str], progress: Callable[[str], None]) -> dict[str, Any]:
        """Advance every active sweep (``SweepPass.run``); what it did, as the controller's report holds it."""
        self._last = SweepPass(settings, store, fleet.billing.ledger, leases, held=held, progress=progress,
                               fleet=fleet, kept=self.kept)
        return asdict(self._last.run(now))

    def tell(self, now: float, round_: outbox.Round | None = None) -> None:
        """Send what the pass just run queued (``SweepPass.tell``), after the runs' actions, within ``round_``."""
        if self._last is not None:
            self._last.tell(now, round_)
            self._last = None
