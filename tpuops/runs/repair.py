"""A damaged run: what is wrong with it, what can be rebuilt, and how it is forgotten (``tpuops runs repair`` and
``tpuops runs forget``; the service calls that find its node and delete it are ``tpuops.api.repair`` / ``forget``).

A run's documents (``layout``) are rebuilt as far as the rest of the world allows:

- ``run.json`` is written once at launch and is the only copy of the node request frozen then (its rendered
  startup script included): it cannot be rebuilt. Such a run can only be forgotten.
- ``memory.json`` is the controller's, and is rebuilt as a missing one is recovered: from the agent's status
  (its attempt, a final exit), the run's node in the cloud (its zone) and the run's active marker (an unfinished
  run has one). The counters and the event log it held are lost; ``Memory.event`` says so in its first event.
- ``status.json`` is the agent's, rewritten whole at its next heartbeat: a damaged one is set aside, and until
  then the run reads as one whose agent has not written yet.

Whatever is replaced is first copied next to it as ``<name>.damaged`` (``DAMAGED_SUFFIX``), so a repair loses no
bytes. The memory is written with compare-and-swap on the damaged copy's generation, so a repair racing anything
that wrote the memory meanwhile changes nothing. No lease is taken: no controller can write a memory it cannot
read, and a ``watch`` that deleted the damaged run's node may hold the run's lease until it exits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuops.core.errors import DamagedDocument, NotFound, PreconditionFailed, TpuopsError
from tpuops.providers.nodes import NodeInfo
from tpuops.runs import layout
from tpuops.runs.memory import Memory
from tpuops.runs.ops import drop_active, load_memory, mark_active, read_record, read_status
from tpuops.runs.outcome import Outcome
from tpuops.store import Store

DAMAGED_SUFFIX = ".damaged"
"""A damaged document is kept under its own key plus this suffix before it is replaced."""


@dataclass(frozen=True)
class Diagnosis:
    """What is wrong with one run's documents, and what the world says about it."""

    run_id: str
    damage: dict[str, str]
    """Document name (``run.json``, ``memory.json``, ``status.json``) -> what is wrong with it."""
    node: NodeInfo | None
    """The run's node in the cloud (found by its run label), if it has one."""
    active: bool
    """Whether the run is indexed as unfinished."""

    @property
    def damaged(self) -> bool:
        return bool(self.damage)

    @property
    def repairable(self) -> bool:
        """Whether ``repair`` leaves the run whole (everything but run.json can be rebuilt)."""
        return layout.RECORD not in self.damage

    def repairs(self) -> list[str]:
        """What ``repair`` does (or, for run.json, cannot do), one line per damaged document."""
        said = {
            layout.RECORD: "run.json cannot be rebuilt (it is the only copy of the node request frozen at launch): "
                           f"'tpuops runs forget {self.run_id}' deletes its node and removes it from the index",
            layout.MEMORY: "memory.json is rebuilt from the agent's status, the node and the active index "
                           f"(the damaged one is kept as memory.json{DAMAGED_SUFFIX})",
            layout.STATUS: f"status.json is set aside as status.json{DAMAGED_SUFFIX}; the agent writes a new one "
                           "at its next heartbeat",
        }
        return [said[name] for name in (layout.RECORD, layout.MEMORY, layout.STATUS) if name in self.damage]

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "damaged": self.damage, "active": self.active,
                "node": self.node.to_json() if self.node else None, "repairs": self.repairs(),
                "repairable": self.repairable}


def diagnose(store: Store, run_id: str, node: NodeInfo | None = None) -> Diagnosis:
    """Read each of the run's documents and say which are damaged (``node``: the run's, if the caller looked);
    ``UsageError`` when there is no such run (``read_record``: no run.json at all)."""
    damage: dict[str, str] = {}
    for name, read in ((layout.RECORD, lambda: read_record(store, run_id)),
                       (layout.MEMORY, lambda: load_memory(store, run_id)),
                       (layout.STATUS, lambda: read_status(store, run_id))):
        try:
            read()
        except DamagedDocument as err:
            damage[name] = str(err)
    return Diagnosis(run_id, damage, node, store.exists(layout.INDEX_ACTIVE + run_id))


def rebuild_memory(diagnosis: Diagnosis, status_attempt: int, final: Outcome | None, now: float) -> Memory:
    """The memory a run would have had, as far as the world says (pure).

    ``status_attempt`` is the agent's last attempt (0: no readable status), ``final`` how it ended when it said so.
    A run that is not indexed as active had ended; an active one goes on with its node, or with a create at the
    next pass when it has none (``deleting``: no preemption is counted for it). The agent's last exit, if any, is
    news to the rebuilt memory, so the next pass acts on it as it would have (a crash restarts the run).
    """
    memory = Memory()
    node = diagnosis.node
    memory.event(now, "repaired", f"memory.json was damaged ({diagnosis.damage.get(layout.MEMORY, 'unreadable')}); "
                                  "rebuilt from the agent's status, the node and the active index: its earlier "
                                  "counters and events are lost")
    if final is not None:
        memory.finish(now, final, f"the agent ended it (attempt {status_attempt}), as its status says")
    elif not diagnosis.active:
        memory.finish(now, Outcome.FAILED, "it had ended before its memory was damaged; how is not known")
    else:
        memory.attempts = max(status_attempt, 1 if node is not None else 0)
        memory.handled_agent_attempt = max(status_attempt - 1, 0)
        memory.zone = node.zone if node is not None else None
        memory.deleting = node is None and memory.attempts > 0
    return memory


def repair(store: Store, diagnosis: Diagnosis, now: float) -> list[str]:
    """Rebuild the run's memory and set its status aside, as ``Diagnosis.repairs`` says; what was done.

    run.json is left as it is: when it is damaged the run stays so (``Diagnosis.repairable``), and only
    ``forget`` helps.
    """
    run_id, done = diagnosis.run_id, []
    if layout.STATUS in diagnosis.damage:
        _set_aside(store, layout.status_key(run_id))
        store.delete(layout.status_key(run_id))
        done.append(f"status.json set aside as status.json{DAMAGED_SUFFIX}")
    if layout.MEMORY in diagnosis.damage:
        status = read_status(store, run_id)  # whole now: a damaged one was set aside above
        ended = status.exit_class if status is not None and status.final else None
        memory = rebuild_memory(diagnosis, status.attempt if status is not None else 0,
                                Outcome.of_exit(ended) if ended is not None else None, now)
        key = layout.memory_key(run_id)
        exists = store.exists(key)  # else the damaged memory is the legacy one, and memory.json is new
        generation = _set_aside(store, key if exists else layout.run_key(run_id, layout.LEGACY_MEMORY))
        try:
            store.write_if_generation_match(key, memory.to_bytes(), generation if exists else 0)
        except PreconditionFailed:
            raise TpuopsError(f"run {run_id}: its memory changed while it was repaired; run the repair again") from None
        if memory.finished:
            done.append(f"memory.json rebuilt: the run had ended ({memory.outcome})")
        else:
            mark_active(store, run_id)  # a controller holding a copy of this run reads it afresh
            where = f"its node in {memory.zone}" if memory.zone else "a new node at the next pass"
            done.append(f"memory.json rebuilt: active, attempt {memory.attempts}, on {where}")
    return done


def _set_aside(store: Store, key: str) -> int:
    """Copy the damaged object at ``key`` to ``key + DAMAGED_SUFFIX``; the generation of the copied bytes."""
    try:
        data, generation = store.read_versioned(key)
    except NotFound:
        return 0
    store.write_bytes(key + DAMAGED_SUFFIX, data)
    return generation


def forget(store: Store, run_id: str) -> None:
    """Take the run out of both indexes (its files stay, as every run's do): ``tpuops runs`` no longer lists it and
    no pass looks at it. Its node, if any, is the caller's to delete first (``tpuops.api.forget``)."""
    drop_active(store, run_id)
    store.delete(layout.INDEX_RUNS + run_id)
