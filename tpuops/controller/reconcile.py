"""One reconcile pass: read desired and actual state, decide per run, apply, remember.

Desired state is the runs the store indexes as unfinished (``tpuops.runs``, ``index/active/``):
a pass never lists a run's history, so its cost grows with the runs still going. Actual state is
one ListNodes per zone (and page) whatever the number of runs, through the one node engine
(``Fleet.list_zones``: ledger sightings and closed intervals included), plus one call per
action and one GetOperation per create still in flight. A replacement (a dead node deleted and
its successor created in the same pass) also polls its delete until it completes: the run waits
for it (milliseconds on the emulator, the delete's duration on Cloud TPU, at most
``REPLACE_WAIT_S``), and the create goes out within about one round trip of the completion instead
of a pass interval later. Every node is created through
``Fleet.create`` (the ledger has it before anyone waits), from the request frozen in the
run's record: tpuops.toml changes never change a declared run's node.

What a long-lived controller (``watch``) does not read again, so that a steady pass costs one
listing of the index and the node listings, not a round trip per run:

- a run's record: written once, read once per controller (a targeted pass reads it afresh);
- its memory, and with it the run's stop request (``tpuops stop``, honoured by ``decide``): only
  this lease holder writes the memory, so the copy it read or wrote is current for as long as it
  keeps the lease (same tenure) and the run's index marker is unchanged (``reopen``, ``declare``
  and a stop request rewrite it);
- the agent's status: re-read when the node is not READY, its state changed, no agent status was
  seen yet, in a targeted pass, and otherwise at most every ``status_refresh_s`` (default
  ``min(hang_after_s, boot_timeout_s) / 12``, spread over passes per run). An agent that ends
  lets its node delete itself (the node's state changes), so only hang detection and a kept
  node's end wait for the refresh.

The reads a pass does need (first passes, changed runs) go through a thread pool.

Concurrency: every run is decided in the pass's thread when observing it needs no I/O (its status
is cached, no create operation to ask about, no budget to read from the ledger), and a run so
decided with no action and nothing to save is done there: a steady pass starts no worker for its
runs. The others are acted on concurrently, ``MAX_ACTING`` at a time, so one run's slow delete
holds up no other run's actions, replacements included; the pass ends when the last of them is
done. A controller built with ``threads=False`` (the simulator's: its store and cloud answer at once, so
workers would only cost CPU time and make the order of calls vary) does the same work in its own thread,
run after run in index order. A worker touches only its own run: its ``_seen`` entry, its node's Fleet and ledger
state (keyed by node; the ledger opens a connection per call), its memory's compare-and-swap. It
reports through its own ``_Outcome``, which the pass's thread merges into the ``PassReport`` in
index order, so the report reads as a sequential pass's would; progress lines go through a lock,
each whole, in the order things happened.

Safe to kill at any line: nodes are named after their run, so a create repeated after a crash
meets ALREADY_EXISTS and adopts; memory is written with compare-and-swap after the actions,
so a pass that died before writing it is simply redone from what the cloud shows. A run is taken
out of the index only once its memory says finished and its node is gone.

Notifications (``tpuops.notify``): what a run's decision is worth telling is decided with it (pure rules),
written with its memory (the write-ahead), and sent after the run's actions, a short timeout per target and
one budget for the whole pass (``outbox.Round``); then the memory is written again with each delivery's
state. A finished run whose messages are not all delivered or given up stays in the index, so that later
passes retry them.

Two controllers: a run is acted on only under its lease, renewed as each call of an action goes out
(``Leases.acting``), and only when its memory is still the one read before this pass listed the
nodes; otherwise another controller acted since, our listing may predate that, and the run waits a pass.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Collection
from datetime import datetime

from tpuops import runs
from tpuops.billing.observer import BillingObserver
from tpuops.config import Settings
from tpuops.controller import orphans
from tpuops.controller.damaged import damaged_verdict, stuck_for
from tpuops.controller.decide import Action, ActionKind, Observed, Policy, decide
from tpuops.controller.passes import (
    _DEFERRED,
    _LEASED,
    _NOTHING,
    PassReport,
    PassStep,
    _asks,
    _Decided,
    _find,
    _inline_or_pooled,
    _memory_at,
    _one_at_a_time,
    _Outcome,
    _Pass,
    _Run,
    _Seen,
    _Skip,
    _spent,
    _status_or_damage,
    _unless,
)
from tpuops.controller.preemptions import carried, labelled
from tpuops.controller.probes import apply_probe, probe_observed
from tpuops.core.clock import UTC, Clock, system_clock
from tpuops.core.create_result import CreateResult
from tpuops.core.errors import (
    AlreadyExists,
    DamagedDocument,
    NotFound,
    PreconditionFailed,
    TpuopsError,
    UsageError,
)
from tpuops.core.naming import RUN_KEY
from tpuops.core.notices import Notice
from tpuops.fleet import Fleet, Listing
from tpuops.notify import outbox
from tpuops.notify.rules import RunFacts, run_notices
from tpuops.providers.nodes import NodeInfo, NodeState
from tpuops.runs import AgentStatus, Memory, RunRecord
from tpuops.store import Store
from tpuops.store.lease import Leases, new_holder_id

REPLACE_WAIT_S = 300.0
"""How long a pass waits for the delete of a node it replaces; past that, a later pass creates."""

MAX_ACTING = 16
"""How many runs a pass acts on at once.

A run's actions wait on the Cloud TPU API (a replacement waits for its delete: tens of seconds to
minutes), so runs are acted on concurrently: one slow delete holds up no other run. The bound keeps
a pass with hundreds of actions (a zone-wide preemption) from sending them all at once into the
project's API rate quota; past it, runs wait for a free worker, not for the next pass.
"""


class Controller:
    """Reconciles the runs of one store against one project's nodes (its ``Fleet``, and the billing observer that
    fleet reports to, which keeps the ledger).

    ``sweeps`` must be named: the step that advances the store's sweeps at each full pass (``PassStep``;
    ``tpuops.api.controller`` and the simulator give ``tpuops.sweeps.advance.SweepStep``), or None for a
    controller that advances none: its passes reconcile every run, trials included, and leave each sweep
    as it is (no trial launched, told or stopped; ``report.sweeps`` empty) until a controller with a step passes.
    """

    def __init__(self, settings: Settings, store: Store, fleet: Fleet, *, billing: BillingObserver,
                 sweeps: PassStep | None, holder: str | None = None, progress: Callable[[str], None] | None = None,
                 status_refresh_s: float | None = None, clock: Clock = system_clock, threads: bool = True) -> None:
        self.settings = settings
        self.threads = threads
        self.clock = clock
        """The time every decision is taken at when a pass is not given one (``tpuops.core.clock``)."""
        self.store = store
        self.nodes = fleet
        self.billing = billing
        """What dates the nodes' costs in the ledger: the observer the ``fleet`` reports to, handed in by whoever
        built both (``tpuops.api.controller``, the simulator), so that the controller never reaches into its fleet."""
        self.ledger = self.billing.ledger
        self.leases = Leases(store, holder or new_holder_id(), ttl_s=settings.lease_ttl_s, clock=clock)
        self.progress = _one_at_a_time(progress or (lambda _text: None))
        self._held: set[str] = set()
        self._records: dict[str, RunRecord] = {}  # run.json is written once: read once per controller
        self._seen: dict[str, _Seen] = {}
        self._stuck: dict[str, tuple[tuple[int, int], float]] = {}  # a damaged run's agent: (attempt, step), since
        self._round = outbox.Round(settings.notify.deliver_budget_s)
        self.sweeps = sweeps
        self.status_refresh_s = (min(settings.hang_after_s, settings.boot_timeout_s) / 12
                                 if status_refresh_s is None else status_refresh_s)

    def release(self) -> None:
        """Drop the leases this controller took, so that the next controller need not wait for them to expire.

        A one-shot pass (``reconcile``, ``train --detach``) and a loop that ends (``watch``, ``train``)
        call it on the way out; a controller that dies keeps them until they expire.
        """
        for run_id in sorted(self._held):
            self.leases.release(run_id)
        self._held.clear()

    def _record(self, run_id: str, fresh: bool) -> RunRecord:
        if fresh or run_id not in self._records:
            self._records[run_id] = runs.read_record(self.store, run_id)
        return self._records[run_id]

    def _cached(self, run_id: str, marker: int | None) -> _Run | None:
        """Record and memory from this controller's copies, when they are still good (no I/O)."""
        seen, record = self._seen.get(run_id), self._records.get(run_id)
        if (marker is not None and record is not None and seen is not None and seen.marker == marker
                and seen.tenure is not None and seen.tenure == self.leases.tenure(run_id)):
            return _Run(record, seen.memory, seen.generation)
        return None

    def _read(self, run_id: str, marker: int | None) -> _Run | TpuopsError | None:
        """Record and memory of a run, read from the store.

        None: the index names a run whose record is gone (it is dropped from the index); an error
        is this run's alone, reported, and the next pass tries again.
        """
        fresh = marker is None
        try:
            try:
                record = self._record(run_id, fresh)
            except UsageError as err:
                if runs.run_exists(self.store, run_id):
                    raise
                self.progress(f"{run_id}: indexed but its record is gone ({err}); dropping it from the index")
                runs.drop_active(self.store, run_id)
                return None
            memory, generation = runs.load_memory(self.store, run_id)
            stop = runs.read_stop(self.store, run_id) if not memory.finished else None
        except TpuopsError as err:
            return err
        self._remember(run_id, memory, generation, marker, None, stop.reason if stop else None)
        return _Run(record, memory, generation)

    def _damaged(self, damaged: list[str], listed: Listing, now: float, report: PassReport) -> None:
        """Runs whose memory or record cannot be read: nothing is created for them, and a READY node of theirs is
        deleted, under the run's lease, once its agent has exited or gone silent (``damaged.damaged_verdict``)."""
        for run_id in damaged:
            node = next((n for zone in listed.values() for n in zone.values()
                         if n.managed and n.labels.get(RUN_KEY) == run_id), None)
            if node is None:
                continue
            read = _status_or_damage(self.store, run_id)
            record = self._records.get(run_id)  # honoured when only the memory is damaged
            policy = Policy.of(self.settings, record, zones=(node.zone,))
            status = None if isinstance(read, DamagedDocument) else read
            budget = None if record is None or record.budget_usd is None else \
                (_spent(self.ledger, self.settings, run_id, self.clock), record.budget_usd)  # honoured damaged or not
            why = damaged_verdict(node.state, status, node.age_s(datetime.fromtimestamp(now, UTC)), now, policy,
                                  stuck_s=stuck_for(self._stuck, run_id, status, now), budget=budget)
            if why is None:
                continue
            try:
                if not self.leases.acquire(run_id):
                    report.skipped_leased.append(run_id)
                    continue
                self._held.add(run_id)
                with self.leases.acting(run_id):  # LeaseLost: not ours any more
                    self.nodes.delete(node.zone, node.name)
            except TpuopsError as err:
                report.errors[run_id] = f"{report.errors.get(run_id, '')}; its node could not be deleted: {err}"
                continue
            report.acted.append((run_id, ActionKind.DELETE.value, node.zone))
            self.progress(f"{run_id}: damaged, and {why}: deleted its node {node.name} in {node.zone}")

    def _remember(self, run_id: str, memory: Memory, generation: int, marker: int | None,
                  tenure: int | None, stop: str | None) -> None:
        seen = self._seen.get(run_id)
        status = (seen.status, seen.status_state, seen.status_due) if seen else (None, None, 0.0)
        self._seen[run_id] = _Seen(marker if marker is not None else (seen.marker if seen else -1), tenure,
                                   memory, memory.to_bytes(), generation, *status, stop=stop)

    def run_pass(self, only: str | Collection[str] | None = None, now: float | None = None) -> PassReport:
        """One pass over every unfinished run in the store (or only the run or runs ``only`` names, read afresh).

        A full pass first runs the sweep step (``PassStep``: every unfinished sweep advanced), so that the
        trials it launches get their nodes, and the trials it stops lose theirs, in this same pass. Then its
        phases, in this order, each handing the next what it learned (``_Pass``): read the runs, observe their
        nodes and statuses, decide for each run this controller holds, act on the decisions (each run's own
        messages are sent right after its actions), reap orphaned nodes, and notify what the sweeps decided.
        """
        passing = _Pass(self.clock() if now is None else now, only, self.sweeps if only is None else None)
        self._round = outbox.Round(self.settings.notify.deliver_budget_s)  # this pass's deliveries: one bound
        self._phase_read(passing)
        self._phase_observe(passing)
        self._phase_decide(passing)
        self._phase_act(passing)
        self._phase_reap(passing)
        self._phase_notify(passing)
        return passing.report

    def _phase_read(self, passing: _Pass) -> None:
        """Read: the sweep step first (a full pass), whose runs this pass then reads with the others; then the runs
        of the index (or those named), from this controller's copies or the store, in a pool."""
        if passing.stepping is not None:
            passing.report.sweeps = passing.stepping.run(
                passing.now, settings=self.settings, store=self.store, fleet=self.nodes, leases=self.leases,
                held=self._held, progress=self.progress)
        only = passing.only
        index: dict[str, int | None] = (dict(runs.active_index(self.store)) if only is None else
                                        dict.fromkeys([only] if isinstance(only, str) else only))
        read = _inline_or_pooled(list(index), lambda run_id: self._cached(run_id, index[run_id]),
                                 lambda run_id: self._read(run_id, index[run_id]), threads=self.threads)
        passing.states = {run_id: state for run_id, state in read.items() if isinstance(state, _Run)}
        passing.damaged = [run_id for run_id, err in read.items() if isinstance(err, DamagedDocument)]
        for run_id, err in read.items():
            if isinstance(err, DamagedDocument):
                passing.report.errors[run_id] = str(err)
                self.progress(f"{run_id}: {err}; nothing is created for it until it is repaired "
                              f"({runs.repair_hint(run_id)})")
            elif isinstance(err, TpuopsError):
                passing.report.errors[run_id] = str(err)
                self.progress(f"{run_id}: {err}; the next pass tries again")

    def _phase_observe(self, passing: _Pass) -> None:
        """Observe: list the zones (deleting, as each listing comes in, the nodes of runs their agent ended), deal
        with the nodes of damaged runs, and refresh the statuses this pass needs."""
        report, states, fresh = passing.report, passing.states, passing.only is not None
        zones = list(self.settings.zones)
        for state in states.values():
            zones.extend(z for z in (*state.record.zones, state.memory.zone) if z)
            pending = state.memory.pending_create
            if pending is not None and pending.operation and pending.error is None:
                self.billing.expect(pending.zone, state.record.node_name, pending.operation)
        refreshed: set[str] = set()
        ended: list[tuple[str, str]] = []
        passing.listed, passing.failed = self.nodes.list_zones(
            zones, lambda zone, found: self._end_finished(zone, found, states, fresh, refreshed, ended))
        report.acted.extend((run_id, ActionKind.DELETE, zone) for run_id, zone in ended)
        for zone, err in passing.failed.items():
            report.unlisted_zones.append(zone)
            self.progress(f"cannot list {zone} this pass ({err}); its runs wait for the next one")
        self._damaged(passing.damaged, passing.listed, passing.now, report)
        passing.nodes = {run_id: _find(passing.listed, state.record.node_name) for run_id, state in states.items()}
        self._refresh_statuses({run_id: state for run_id, state in states.items() if run_id not in refreshed},
                               passing.nodes, fresh=fresh)

    def _phase_decide(self, passing: _Pass) -> None:
        """Decide: drop the runs that are over from the index (``_unlisted_node``), take the others' leases, and decide
        for every run held whose observation needs no I/O (the others are decided as they are acted on)."""
        states, report = passing.states, passing.report
        for run_id, state in states.items():
            told = not outbox.waiting(state.memory.notices) or not outbox.KEPT_UNTIL_TOLD.on
            if not (state.memory.finished and passing.nodes[run_id] is None) or not told:
                passing.live.append(run_id)
            elif passing.only is None and not passing.failed:
                try:
                    node = self._unlisted_node(run_id, state.record)
                except TpuopsError:
                    continue  # no evidence either way: it stays indexed, and the next pass asks again
                if node is not None:  # a listing that lags did not show it: it is deleted as any ended run's
                    passing.nodes[run_id] = node
                    passing.live.append(run_id)
                    continue
                runs.drop_active(self.store, run_id)
                self._seen.pop(run_id, None)
        taken = _inline_or_pooled(passing.live, lambda run_id: self._kept(run_id, states[run_id]),
                                  lambda run_id: self._take(run_id, states[run_id]), threads=self.threads)
        for run_id in passing.live:
            took = taken[run_id]
            report.runs += 1
            if isinstance(took, TpuopsError):
                passing.outcomes[run_id] = _Outcome(error=self._failed(run_id, took))
            elif took is _LEASED:
                report.skipped_leased.append(run_id)
            elif took is _DEFERRED:
                report.deferred.append(run_id)
            else:
                passing.held[run_id] = took
        nodes, listed, now = passing.nodes, passing.listed, passing.now
        passing.decided = {run_id: self._decide(run_id, states[run_id].record, memory, nodes[run_id], listed, now)
                           for run_id, (memory, _) in passing.held.items()
                           if self._offline(run_id, states[run_id].record, memory, nodes[run_id], now)}

    def _unlisted_node(self, run_id: str, record: RunRecord) -> NodeInfo | None:
        """The ended run's node the listing did not show (it may lag), looked up before the run leaves the index: a
        run ended meanwhile was dropped with its node READY, billed for hours (the swarm's seed 150). None: gone."""
        found = (self.nodes.find(zone, record.node_name) for zone in record.zones)
        return next((node for node in found if node is not None and node.labels.get(RUN_KEY) == run_id
                     and node.state is not NodeState.DELETING), None)

    def _phase_act(self, passing: _Pass) -> None:
        """Act: runs decided with nothing to do are passing inline, the others acted on concurrently, ``MAX_ACTING``
        at a time (one run's slow replacement holds up no other's); their outcomes go into the report in index
        order, as a sequential pass's would."""
        held, states, nodes = passing.held, passing.states, passing.nodes
        stop = threading.Event()
        try:
            passing.outcomes.update(_inline_or_pooled(
                list(held), lambda run_id: self._settled(passing.decided.get(run_id), held[run_id][0]),
                lambda run_id: self._act(run_id, states[run_id].record, *held[run_id], nodes[run_id], passing.listed,
                                         passing.now, passing.decided.get(run_id), stop), workers=MAX_ACTING,
                threads=self.threads))
        except BaseException:
            stop.set()  # Ctrl-C: no run is started any more, and the workers waiting on a delete give up
            raise
        for run_id in passing.live:
            outcome = passing.outcomes.get(run_id, _NOTHING)
            if outcome is _NOTHING:
                continue
            passing.report.acted.extend((run_id, kind, zone) for kind, zone in outcome.acted)
            if outcome.finished is not None:
                passing.report.finished[run_id] = outcome.finished
            if outcome.error is not None:
                passing.report.errors[run_id] = outcome.error

    def _phase_reap(self, passing: _Pass) -> None:
        """Reap: a full pass deletes the nodes labelled as a run's that no run claims (past a grace)."""
        if passing.only is None:
            passing.report.reaped.extend(orphans.reap(
                self.nodes, self.store, self.leases, self._held, passing.listed, set(passing.states),
                self.settings.orphan_grace_s, self.progress, passing.now))

    def _phase_notify(self, passing: _Pass) -> None:
        """Notify: the sweeps' messages, after the runs' actions (``tpuops.notify``; each run's own went out after
        its actions, in the act phase), so that no receiver holds up a run's recovery or teardown."""
        if passing.stepping is not None:
            passing.stepping.tell(passing.now, self._round)

    def _refresh_statuses(self, states: dict[str, _Run], nodes: dict[str, NodeInfo | None], fresh: bool) -> None:
        """Read, in parallel, the statuses this pass needs afresh (see the module docstring)."""
        clock = time.monotonic()

        def due(run_id: str) -> bool:
            seen, node = self._seen.get(run_id), nodes[run_id]
            state = node.state if node else None
            return (fresh or seen is None or seen.status is None or state is not NodeState.READY
                    or seen.status_state is not state or clock >= seen.status_due)

        wanted = [run_id for run_id, state in states.items() if not (state.memory.finished and nodes[run_id] is None)
                  and due(run_id)]

        def read_one(run_id: str) -> AgentStatus | DamagedDocument | None:
            return _status_or_damage(self.store, run_id)

        found = runs.parallel_map(read_one, wanted) if self.threads else [read_one(run_id) for run_id in wanted]
        for run_id, read in zip(wanted, found, strict=True):
            seen = self._seen.get(run_id)
            if seen is None:
                continue
            if isinstance(read, DamagedDocument):  # no news: keep the last status read, and read again next pass
                if seen.status_damage is None:
                    self.progress(f"{run_id}: {read}; the next pass reads it again")
                seen.status_damage = str(read)
                continue
            node = nodes[run_id]
            seen.status, seen.status_state, seen.status_damage = read, node.state if node else None, None
            seen.status_due = clock + self.status_refresh_s * (0.5 + (zlib.crc32(run_id.encode()) % 512) / 1024)

    def _end_finished(self, zone: str, found: dict[str, NodeInfo], states: dict[str, _Run], fresh: bool,
                      refreshed: set[str], ended: list[tuple[str, str]]) -> None:
        """As soon as ``zone``'s listing is in (``Fleet.list_zones``), refresh the statuses of the runs whose node
        it shows, and delete the node of every run whose agent ended it for good since that node was created
        (unless the run keeps its node), under the run's lease like every other action (a run another controller
        holds is left to it): they go into ``refreshed`` and ``ended``.

        The node deletes itself too (the dead-man's switch), but under a failing API its own delete may fail for
        a while, and a finished node bills until someone's delete starts: that delete waits neither for another
        zone's listing, which may be retrying, nor for the rest of the pass. The node leaves this pass's listing,
        so ``decide`` finishes the run without a second delete. A delete that fails is left to ``decide``.
        """
        here = {run_id: state for run_id, state in states.items() if state.record.node_name in found}
        if not here:
            return
        nodes: dict[str, NodeInfo | None] = {run_id: found[state.record.node_name] for run_id, state in here.items()}
        self._refresh_statuses(here, nodes, fresh)
        refreshed.update(here)
        for run_id, state in here.items():
            seen, node = self._seen.get(run_id), found[state.record.node_name]
            status = seen.status if seen is not None else None
            finished_at = status.ended_at if status is not None and status.final else None
            if (finished_at is None or state.memory.finished or state.record.keep
                    or node.state is NodeState.DELETING or status.attempt <= state.memory.handled_agent_attempt
                    or (node.create_time is not None and finished_at < node.create_time)):
                continue
            try:
                if not self.leases.acquire(run_id):
                    continue  # another controller drives the run: the delete is its to make
                self._held.add(run_id)
                with self.leases.acting(run_id):
                    self.nodes.delete(zone, node.name)
            except TpuopsError as err:
                self.progress(f"{run_id}: its agent ended, but deleting {node.name} failed ({err}); "
                              "the pass tries again")
                continue
            del found[node.name]
            ended.append((run_id, zone))
            self.progress(f"{run_id}: its agent ended: deleted {node.name} in {zone}")

    def _kept(self, run_id: str, state: _Run) -> tuple[Memory, int] | None:
        """The run's memory when its lease is known to be ours and the memory was read under it (no I/O)."""
        seen = self._seen.get(run_id)
        if (self.leases.known(run_id) and seen is not None and seen.tenure is not None
                and seen.tenure == self.leases.tenure(run_id)):
            self._held.add(run_id)
            return state.memory, state.generation
        return None

    def _take(self, run_id: str, state: _Run) -> tuple[Memory, int] | _Skip | TpuopsError:
        """Take (or keep) the run's lease and make sure its memory is still the one this pass read.

        Runs in the pass's thread pool: a one-shot pass pays these round trips in parallel.
        """
        try:
            seen = self._seen.get(run_id)
            if not self.leases.acquire(run_id):
                self._seen.pop(run_id, None)
                return _LEASED
            self._held.add(run_id)
            tenure = self.leases.tenure(run_id)
            if seen is None or seen.tenure is None or seen.tenure != tenure:
                current = runs.load_memory(self.store, run_id)[1]
                if current != state.generation:  # another controller acted since: our listing may predate it
                    self._seen.pop(run_id, None)
                    return _DEFERRED
            if seen is not None:
                seen.tenure = tenure  # nobody else may write the memory while this tenure lasts
            return state.memory, state.generation
        except TpuopsError as err:
            return err

    def _offline(self, run_id: str, record: RunRecord, memory: Memory, node: NodeInfo | None, now: float) -> bool:
        """Whether ``_observe`` needs no I/O for the run: its status is cached, no create operation
        is to be asked about, no budget makes it read its spending from the ledger, no notice is due."""
        return (run_id in self._seen and not _asks(memory, node) and record.budget_usd is None
                and memory.probe is None and not outbox.due(memory.notices, now))

    def _observe(self, run_id: str, record: RunRecord, memory: Memory, node: NodeInfo | None,
                 listed: Listing) -> Observed:
        zones = set(record.zones) | ({memory.zone} if memory.zone else set())
        seen = self._seen.get(run_id)
        read = _status_or_damage(self.store, run_id) if seen is None else seen.status
        status = None if isinstance(read, DamagedDocument) else read
        damaged = isinstance(read, DamagedDocument) or (seen is not None and seen.status_damage is not None)
        stop = seen.stop if seen is not None else None
        result, message = None, ""
        pending = memory.pending_create
        if node is None and pending is not None and pending.error is not None:
            result, message = pending.error, pending.message
        elif pending is not None and _asks(memory, node):
            try:
                operation = self.nodes.operation(pending.zone, pending.operation)
                result, message = operation.result, operation.message
            except NotFound:
                result = CreateResult.OK
            except TpuopsError:
                result = CreateResult.RUNNING
        spent = None if record.budget_usd is None else _spent(self.ledger, self.settings, run_id, self.clock)
        probe = probe_observed(self.nodes, record, memory, listed)
        return Observed(listed=node is not None or zones <= set(listed), node_state=node.state if node else None,
                        node_zone=node.zone if node else None, node_uid=node.uid or None if node else None,
                        node_capacity=node.capacity if node else None,
                        unhealthy_workers=node.unhealthy_workers if node else (), status=status, create_result=result,
                        create_message=message, spent_usd=spent, budget_usd=record.budget_usd, stop=stop,
                        status_damaged=damaged, node_accelerator=node.accelerator if node else None,
                        **labelled(node.labels if node else {}),
                        node_created=node.create_time.timestamp() if node and node.create_time else None, **probe)

    def _decide(self, run_id: str, record: RunRecord, memory: Memory, node: NodeInfo | None, listed: Listing,
                now: float) -> _Decided:
        """Observe the run and decide: ``memory`` takes the decision, the actions are still to be applied."""
        observed = self._observe(run_id, record, memory, node, listed)
        seen = self._seen.get(run_id)
        unchanged = seen.saved if seen is not None and seen.memory is memory else memory.to_bytes()
        before = len(memory.events)
        decision = decide(memory, observed, now, Policy.of(self.settings, record))
        notices = self._worth_telling(run_id, record, memory, observed, before, now)
        return _Decided(decision, before, unchanged, notices)

    @staticmethod
    def _settled(decided: _Decided | None, memory: Memory) -> _Outcome | None:
        """The outcome of a run decided with nothing to do (no I/O); None when it must be acted on."""
        if decided is None or not decided.quiet(memory):
            return None
        return _Outcome(finished=str(memory.outcome or "")) if memory.finished else _NOTHING

    def _act(self, run_id: str, record: RunRecord, memory: Memory, generation: int, node: NodeInfo | None,
             listed: Listing, now: float, decided: _Decided | None, stop: threading.Event) -> _Outcome:
        """Apply the run's decision (taken here if observing needed I/O) and save its memory.

        Runs in a worker of the pass's pool, concurrently with other runs: it touches only this
        run's entry of ``_seen``, the Fleet's and the ledger's state of this run's node
        (both thread-safe) and reports through its ``_Outcome`` and the locked ``progress``.
        """
        acted: list[tuple[str, str]] = []
        finished = error = None
        try:
            decided = decided or self._decide(run_id, record, memory, node, listed, now)
            if (written := decided.write_ahead(self.store, self._seen, run_id, generation)) is None:  # a conflict
                return _NOTHING
            actions, generation = decided.decision.actions, written
            for index, action in enumerate(actions):
                replacing = any(later.kind is ActionKind.CREATE for later in actions[index + 1:])
                acted.append((action.kind, action.zone))
                with self.leases.acting(run_id, _memory_at(self.store, run_id, generation)):  # renewed, or LeaseLost
                    if not self._apply(run_id, record, memory, action, now, replacing=replacing, stop=stop):
                        break
            for event in memory.events[decided.before:]:
                self.progress(f"{run_id}: {event['kind']}: {event['message']}")
            if memory.finished:
                finished = str(memory.outcome or "")
            self._priced(run_id, decided.notices)
            self._save(run_id, memory, generation, decided.unchanged)  # the notices' write-ahead, with the decision
            self._tell(run_id, memory, now)
        except TpuopsError as err:
            error = self._failed(run_id, err)
        return _Outcome(tuple(acted), finished, error)

    def _save(self, run_id: str, memory: Memory, generation: int, unchanged: bytes) -> None:
        """Write the run's memory if the pass changed it, compare-and-swap on the generation it was read at."""
        after = memory.to_bytes()
        if after == unchanged:
            return
        seen = self._seen.get(run_id)
        try:
            saved = runs.save_memory(self.store, run_id, memory, generation)
        except PreconditionFailed:
            self._seen.pop(run_id, None)
            self.progress(f"{run_id}: its memory changed under us; the next pass redoes this one")
            return
        if seen is not None:
            seen.memory, seen.saved, seen.generation = memory, after, saved

    # ----- notifications (tpuops.notify): decided with the run, written before they are sent, sent last -----

    def _worth_telling(self, run_id: str, record: RunRecord, memory: Memory, observed: Observed, before: int,
                       now: float) -> list[Notice]:
        """Queue in ``memory`` what the pass's decision is worth telling (pure: ``notify.rules``)."""
        config = self.settings.notify
        targets, kinds = config.chosen(record.notify)
        facts = RunFacts(run_id, tuple(targets), frozenset(kinds), config.stalled_after_s, sweep=record.sweep,
                         deadline_at=record.deadline_at, status=observed.status)
        notices = run_notices(facts, memory, memory.events[before:], now)
        outbox.queue(memory.notices, notices, lambda kind, message: memory.event(now, kind, message))
        return notices

    def _priced(self, run_id: str, notices: list[Notice]) -> None:
        """The cost so far and the dashboard link of notices just decided, before they are written."""
        if not notices:
            return
        cost = _spent(self.ledger, self.settings, run_id, self.clock)
        link = self.settings.notify.dashboard_url
        for notice in notices:
            notice.cost_usd = round(cost, 2)
            notice.link = f"{link.rstrip('/')}/runs/{run_id}" if link else None

    def _tell(self, run_id: str, memory: Memory, now: float) -> None:
        """Deliver the run's due notices after its actions and their write-ahead, then write the marks.

        Only after a write-ahead this controller made under the run's lease (its ``_seen`` holds the memory
        just saved): a pass whose save lost the compare-and-swap sends nothing.
        """
        seen = self._seen.get(run_id)
        written = seen is not None and seen.memory is memory
        if (not written and outbox.WRITE_AHEAD.on) or not outbox.due(memory.notices, now):
            return
        first = len(memory.events)
        if outbox.deliver(memory.notices, self.settings.notify, now,
                          lambda kind, message: memory.event(now, kind, message), self._round):
            for event in memory.events[first:]:
                self.progress(f"{run_id}: {event['kind']}: {event['message']}")
            if written and seen is not None:  # (with the guard off, nothing was written to mark)
                self._save(run_id, memory, seen.generation, seen.saved)

    def _failed(self, run_id: str, err: TpuopsError) -> str:
        """Forget what this controller knew of a run a pass could not finish; why, for the report."""
        self._seen.pop(run_id, None)
        self.progress(f"{run_id}: {err}; the next pass tries again")
        return str(err)

    def _apply(self, run_id: str, record: RunRecord, memory: Memory, action: Action, now: float, *,
               replacing: bool, stop: threading.Event) -> bool:
        """Carry out one action; False when the ones after it must not run.

        A delete that a create follows (a replacement, ``decide``) is waited for, closely, so that
        the create goes out within about one round trip of its completion: the name is free only
        then. If the wait fails, or ``stop`` is set (the pass was interrupted), the create is left
        to the next pass, as a create that failed.
        """
        name = record.node_name
        if action.kind in (ActionKind.PROBE, ActionKind.UNPROBE):
            apply_probe(self.nodes, record, memory, action, now)
            return True
        if action.kind is ActionKind.DELETE:
            if not replacing:
                self.nodes.delete(action.zone, name)
                return True
            try:
                self.nodes.delete(action.zone, name, wait=True, closely=True, on_poll=_unless(stop),
                                  timeout_s=min(REPLACE_WAIT_S, self.settings.operation_timeout_s))
            except TpuopsError as err:
                memory.event(now, "create-failed", f"the node it replaces is not deleted yet: {err}")
                if memory.pending_create is not None:
                    memory.pending_create.error, memory.pending_create.message = CreateResult.RETRY, str(err)
                return False
            return True
        request = record.sizes[min(memory.size, len(record.sizes) - 1)]  # an elastic run's size (decide)
        if memory.capacity is not None:  # moved by a capacity rule or a sweep's endgame (the record stays as declared)
            request = request.model_copy(update={"capacity": memory.capacity})
        # the attempt and the preemptions count go with the node, ahead of the memory write (preemptions.carried)
        request = request.model_copy(update={"labels": {**request.labels, **carried(memory)}})
        try:
            operation = self.nodes.create(action.zone, request)
        except AlreadyExists:
            memory.event(now, "adopted", f"{name} already exists in {action.zone}")
            memory.pending_create = None  # the node there is the run's: the next pass judges its state
            return True
        except TpuopsError as err:
            memory.event(now, "create-failed", str(err))
            if memory.pending_create is not None:  # decided on by the next pass
                memory.pending_create.error, memory.pending_create.message = CreateResult.of(err), str(err)
            return True
        if memory.pending_create is not None:
            memory.pending_create.operation = operation.name
        return True

    def reap_orphans_now(self) -> list[str]:
        """``tpuops down --orphans``: reap without waiting for the grace period."""
        listed, _ = self.nodes.list_zones(self.settings.zones)
        return orphans.reap(self.nodes, self.store, self.leases, self._held, listed,
                            set(runs.active_run_ids(self.store)), 0.0, self.progress)
