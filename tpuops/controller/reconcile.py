"""One reconcile pass: read desired and actual state, decide per run, apply, remember.

Cost of a pass: one ListNodes per zone (and page) whatever the number of runs, plus one call
per action and one GetOperation per create still in flight. Store reads per run: its record,
its memory, its status and its lease.

Safe to kill at any line: nodes are named after their run, so a create repeated after a crash
meets ALREADY_EXISTS and adopts; memory is written with compare-and-swap after the actions,
so a pass that died before writing it is simply redone from what the cloud shows.

Two controllers: a run is acted on only under its lease, and only when its memory is still the
one read before this pass listed the nodes; otherwise another controller acted since, our
listing may predate that, and the run waits for the next pass.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpuops import naming
from tpuops.config import Settings
from tpuops.controller import memory as memories
from tpuops.controller.decide import Action, Observed, Policy, decide
from tpuops.controller.lease import Leases, new_holder_id
from tpuops.errors import (
    AlreadyExists,
    CapacityError,
    NotFound,
    PreconditionFailed,
    Timeout,
    TpuopsError,
    TransientError,
)
from tpuops.jobs import node_request, read_status
from tpuops.ledger import Ledger
from tpuops.provision import Provisioner
from tpuops.store import Store
from tpuops.tpu import NodeInfo, TpuApi


@dataclass
class PassReport:
    runs: int = 0
    acted: list[tuple[str, str, str]] = field(default_factory=list)  # (run, action, zone)
    skipped_leased: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # another controller acted on it during this pass
    errors: dict[str, str] = field(default_factory=dict)  # run -> why this pass could not finish it
    reaped: list[str] = field(default_factory=list)
    unlisted_zones: list[str] = field(default_factory=list)
    finished: dict[str, str] = field(default_factory=dict)


class Controller:
    """Reconciles the runs of one store against one project's nodes."""

    def __init__(self, settings: Settings, store: Store, api: TpuApi, ledger: Ledger, *,
                 holder: str | None = None, progress: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.store = store
        self.api = api
        self.ledger = ledger
        self.provisioner = Provisioner(api, settings, ledger)
        self.leases = Leases(store, holder or new_holder_id(), ttl_s=settings.lease_ttl_s)
        self.progress = progress or (lambda _text: None)
        self._held: set[str] = set()

    def release(self) -> None:
        """Drop the leases this controller took, so that the next controller need not wait for them to expire.

        A one-shot pass (``reconcile``, ``train --detach``) and a loop that ends (``watch``, ``train``)
        call it on the way out; a controller that dies keeps them until they expire.
        """
        for run_id in sorted(self._held):
            self.leases.release(run_id)
        self._held.clear()

    def policy(self, record: dict[str, Any]) -> Policy:
        s = self.settings
        return Policy(zones=tuple(record.get("zones") or s.zones), max_crashes=s.max_restarts,
                      hang_after_s=s.hang_after_s, boot_timeout_s=s.boot_timeout_s,
                      stockout_backoff_s=s.stockout_backoff_s, keep_node=bool(record.get("keep")))

    def _records(self, only: str | None) -> dict[str, dict[str, Any]]:
        if only is not None:
            return {only: json.loads(self.store.read_bytes(f"runs/{only}/run.json"))}
        records = {}
        for obj in self.store.list("runs/"):
            parts = obj.key.split("/")
            if len(parts) == 3 and parts[2] == "run.json":
                records[parts[1]] = json.loads(self.store.read_bytes(obj.key))
        return records

    def _listing(self, zones: list[str], report: PassReport) -> dict[str, dict[str, NodeInfo]]:
        listed: dict[str, dict[str, NodeInfo]] = {}
        for zone in zones:
            try:
                listed[zone] = {n.name: n for n in self.api.list_nodes(zone)}
            except TpuopsError as err:
                report.unlisted_zones.append(zone)
                self.progress(f"cannot list {zone} this pass ({err}); its runs wait for the next one")
        self.provisioner.observe(*(n for nodes in listed.values() for n in nodes.values()))
        self._close_unlisted(listed)
        return listed

    def _close_unlisted(self, listed: dict[str, dict[str, NodeInfo]]) -> None:
        """End, in the ledger, the nodes a zone's listing no longer shows: they stopped costing.

        Without this a node that went between two passes (its dead-man's switch, a vanished
        preemption) would stay READY in the ledger and be billed up to now, forever.
        """
        project = self.settings.project
        for zone, nodes in listed.items():
            for record in self.ledger.nodes(project, zone, open_only=True):
                if record.name not in nodes:
                    self.ledger.mark_deleted(project, zone, record.name)

    def run_pass(self, only: str | None = None, now: float | None = None) -> PassReport:
        """One pass over every run in the store (or only ``only``)."""
        report = PassReport()
        records = self._records(only)
        states = {run_id: memories.load(self.store, run_id) for run_id in records}
        zones = list(self.settings.zones)
        for run_id, record in records.items():
            for zone in [*record.get("zones", []), states[run_id][0].zone]:
                if zone and zone not in zones:
                    zones.append(zone)
        listed = self._listing(zones, report)
        for run_id, record in records.items():
            memory, generation = states[run_id]
            node = self._find(listed, record["node"])
            if memory.phase == "finished" and node is None:
                continue
            report.runs += 1
            try:
                self._under_lease(run_id, record, generation, node, listed, report, now)
            except TpuopsError as err:
                report.errors[run_id] = str(err)
                self.progress(f"{run_id}: {err}; the next pass tries again")
        if only is None:
            self._reap_orphans(records, listed, report)
        return report

    def _under_lease(self, run_id: str, record: dict[str, Any], generation: int, node: NodeInfo | None,
                     listed: dict[str, dict[str, NodeInfo]], report: PassReport, now: float | None) -> None:
        if not self.leases.acquire(run_id):
            report.skipped_leased.append(run_id)
            return
        self._held.add(run_id)
        memory, current = memories.load(self.store, run_id)
        if current != generation:
            report.deferred.append(run_id)
            return
        self._reconcile_run(run_id, record, memory, generation, node, listed, report,
                            time.time() if now is None else now)

    @staticmethod
    def _find(listed: dict[str, dict[str, NodeInfo]], name: str) -> NodeInfo | None:
        for nodes in listed.values():
            if name in nodes:
                return nodes[name]
        return None

    def _observe(self, run_id: str, record: dict[str, Any], memory: memories.Memory, node: NodeInfo | None,
                 listed: dict[str, dict[str, NodeInfo]]) -> Observed:
        zones = set(record.get("zones") or self.settings.zones) | ({memory.zone} if memory.zone else set())
        status = read_status(self.store, run_id)
        result, message = None, ""
        pending = memory.pending_create
        if node is None and pending and pending.get("error"):
            result, message = pending["error"], pending.get("message", "")
        elif node is None and pending and pending.get("operation"):
            try:
                result, message = self.api.operation_result(pending["zone"], pending["operation"])
            except NotFound:
                result = "ok"
            except TpuopsError:
                result = "running"
        budget = record.get("budget_usd")
        spent = None
        if budget is not None:  # a project budget is enforced at launch; a run's, also while it runs
            from tpuops.cost import catalog_for
            from tpuops.cost import spent as spent_usd

            spent = spent_usd(self.ledger, catalog_for(self.settings), project=self.settings.project, run_id=run_id)
        return Observed(listed=node is not None or zones <= set(listed), node_state=node.state if node else None,
                        node_zone=node.zone if node else None, status=status, create_result=result,
                        create_message=message, spent_usd=spent, budget_usd=budget)

    def _reconcile_run(self, run_id: str, record: dict[str, Any], memory: memories.Memory, generation: int,
                       node: NodeInfo | None, listed: dict[str, dict[str, NodeInfo]], report: PassReport,
                       now: float) -> None:
        observed = self._observe(run_id, record, memory, node, listed)
        unchanged = memory.to_bytes()
        before = len(memory.events)
        decision = decide(memory, observed, now, self.policy(record))
        for action in decision.actions:
            self._apply(run_id, record, memory, action, now)
            report.acted.append((run_id, action.kind, action.zone))
        for event in memory.events[before:]:
            self.progress(f"{run_id}: {event['kind']}: {event['message']}")
        if memory.phase == "finished":
            report.finished[run_id] = memory.outcome or ""
        if memory.to_bytes() == unchanged:
            return
        try:
            memories.save(self.store, run_id, memory, generation)
        except PreconditionFailed:
            self.progress(f"{run_id}: its memory changed under us; the next pass redoes this one")

    def _apply(self, run_id: str, record: dict[str, Any], memory: memories.Memory, action: Action,
               now: float) -> None:
        name = record["node"]
        if action.kind == "delete":
            self.api.delete_node(action.zone, name)
            return
        request = node_request(self.settings, self.store, record)
        try:
            operation = self.api.create_node(action.zone, request)
        except AlreadyExists:
            memory.event(now, "adopted", f"{name} already exists in {action.zone}")
            return
        except TpuopsError as err:
            memory.event(now, "create-failed", str(err))
            if memory.pending_create is not None:  # decided on by the next pass
                memory.pending_create.update(error=_create_error(err), message=str(err))
            return
        if memory.pending_create is not None:
            memory.pending_create["operation"] = operation.operation.name
        self.ledger.record_node(self.settings.project, action.zone, name, request.accelerator,
                                request.capacity.value, run_id=run_id,
                                sweep_id=request.labels.get(naming.SWEEP_KEY))

    def _reap_orphans(self, records: dict[str, dict[str, Any]], listed: dict[str, dict[str, NodeInfo]],
                      report: PassReport, grace_s: float | None = None) -> None:
        """Delete nodes labelled as a run's whose run the store does not know, once past the grace period."""
        grace = self.settings.orphan_grace_s if grace_s is None else grace_s
        for nodes in listed.values():
            for node in nodes.values():
                run = node.labels.get(naming.RUN_KEY)
                if not node.managed or run is None or run in records:
                    continue
                age = node.age_s()
                if age is not None and age < grace:
                    continue
                self.progress(f"reaping orphan {node.name} in {node.zone} (run {run} is not in the store)")
                self.api.delete_node(node.zone, node.name)
                report.reaped.append(node.name)

    def reap_orphans_now(self) -> list[str]:
        """``tpuops down --orphans``: reap without waiting for the grace period."""
        report = PassReport()
        records = self._records(None)
        self._reap_orphans(records, self._listing(list(self.settings.zones), report), report, grace_s=0.0)
        return report.reaped


def _create_error(err: TpuopsError) -> str:
    """How ``decide`` treats a refused create request: fail over, try again, or give up (quota, 403, invalid)."""
    if isinstance(err, CapacityError):
        return "capacity"
    if isinstance(err, TransientError | Timeout):
        return "retry"
    return "failed"
