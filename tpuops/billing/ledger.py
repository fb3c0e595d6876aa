"""The local ledger: the nodes tpuops created and the state transitions it saw, in SQLite.

The cost tracker builds node intervals from it (a node accrues while READY, from one
transition to the next). It is a ledger, not the source of truth (docs/design.md): everything
in it can be rebuilt from the Cloud TPU API and the store, so losing it costs history, not
control.

Invariants:

- A node *incarnation* is one node the API created. Names are reused (a preempted node is
  deleted and recreated under the same name), so rows are keyed by (project, zone, name, uid)
  where uid is the API's node id. A node recorded before its uid is known gets the uid when
  it is recorded again with one. A new uid for a name whose previous incarnation is still
  open closes that one first: the API holds one node per name at a time.
- Without ``uid``, ``observe``, ``transitions`` and ``mark_deleted`` act on the latest
  incarnation of the name.
- A transition is stored only when the state differs from the incarnation's last one, inside
  one write transaction, so repeated or concurrent observations of the same state add one row.
  Transitions are kept in the order they were observed. ``mark_deleted`` also appends a final
  ``DELETED`` transition, so every interval has an end.
- A closed incarnation (``deleted_at`` set) takes no further transition: a node the API deleted never comes back
  (the name's next node is another incarnation), so a sighting older than its end (a listing that lags) changes
  nothing. Appended, a READY after the end opened an interval nothing closed again, and the ledger billed hours
  the cloud never did (the swarm's seeds 615 and 762).
- Times are stored as UTC ISO-8601 with microseconds (they sort as text); callers pass
  timezone-aware datetimes or ``None`` for now. A transition's time is when the state began as
  well as the observer can tell (``Fleet`` dates it between two sightings, or from the
  delete operation), which is what the cost tracker bills from.

Concurrency: each thread has its own connection, kept for the ``Ledger``'s life (so a ``Ledger``
is safe to share between threads; a connection whose thread ended is closed when another thread
opens one, and all of them by ``close`` or when the ``Ledger`` goes). Keeping them open is what
makes a call cheap: SQLite checkpoints and removes the write-ahead log whenever the last connection
to the file closes, which made every call of a controller pass pay an fsync. The database is in
WAL mode, and writers take the write lock up front (``BEGIN IMMEDIATE``) and wait up to
``busy_timeout_s`` for it, so two processes writing at once serialise instead of failing or losing
rows. The schema version is ``PRAGMA user_version``; migrations run in order when a ledger is opened.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path

from tpuops.core.clock import UTC
from tpuops.core.errors import NotFound, UsageError
from tpuops.core.guards import Guard

DELETED = "DELETED"
"""The state ``mark_deleted`` appends: the end of an incarnation's last interval."""

CLOSED_STAYS_CLOSED = Guard("ledger.closed_stays_closed", "an incarnation whose end the ledger holds takes no further "
                            "transition: a sighting older than that end (a listing that lags) changes nothing")
"""Asked here (a closed row takes no transition) and by ``BillingObserver._ended_before`` (nor is such a sighting
dated, which would take the evidence meant for the name's next incarnation)."""

_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE nodes (
        id          INTEGER PRIMARY KEY,
        project     TEXT NOT NULL,
        zone        TEXT NOT NULL,
        name        TEXT NOT NULL,
        uid         TEXT,
        accelerator TEXT NOT NULL,
        capacity    TEXT NOT NULL,
        run_id      TEXT,
        sweep_id    TEXT,
        created_at  TEXT NOT NULL,
        deleted_at  TEXT,
        UNIQUE (project, zone, name, uid)
    );
    CREATE INDEX nodes_by_name ON nodes (project, zone, name, id);
    CREATE TABLE transitions (
        id      INTEGER PRIMARY KEY,
        node_id INTEGER NOT NULL REFERENCES nodes (id),
        state   TEXT NOT NULL,
        at      TEXT NOT NULL
    );
    CREATE INDEX transitions_by_node ON transitions (node_id, id);
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)


@dataclass(frozen=True)
class NodeRecord:
    """One incarnation of a node."""

    id: int
    project: str
    zone: str
    name: str
    uid: str | None
    accelerator: str
    capacity: str
    run_id: str | None
    sweep_id: str | None
    created_at: datetime
    deleted_at: datetime | None


@dataclass(frozen=True)
class Sighting:
    """A node as one listing saw it; ``uid`` tells incarnations of one name apart."""

    project: str
    zone: str
    name: str
    accelerator: str
    capacity: str
    state: str
    uid: str | None = None
    run_id: str | None = None
    sweep_id: str | None = None
    at: datetime | None = None
    """When the node entered ``state``, as well as the observer can tell; None: when the listing was recorded."""
    created_at: datetime | None = None
    """The API's create time of the node, when the listing says it: a node first recorded from a
    listing is dated from its create, not from the sighting (the first-minute rule counts from it)."""


@dataclass(frozen=True)
class Transition:
    state: str
    at: datetime


@dataclass(frozen=True)
class NodeHistory:
    """One incarnation with every transition observed, in order: what the cost tracker prices."""

    node: NodeRecord
    transitions: tuple[Transition, ...]


def _stamp(at: datetime | None) -> str:
    if at is None:
        at = datetime.now(UTC)
    elif at.tzinfo is None:
        raise ValueError(f"ledger times must be timezone-aware, got naive {at.isoformat()}")
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _text(value: str | Enum) -> str:
    return str(value.value) if isinstance(value, Enum) else value


_NODE_FIELDS = (
    "project", "zone", "name", "uid", "accelerator", "capacity", "run_id", "sweep_id", "created_at",
)
_NODE_COLUMNS = ", ".join(("id", *_NODE_FIELDS, "deleted_at"))
_INSERT_NODE = f"INSERT INTO nodes ({', '.join(_NODE_FIELDS)}) VALUES ({', '.join('?' * len(_NODE_FIELDS))})"


def _close_all(connections: dict[threading.Thread, sqlite3.Connection]) -> None:
    for conn in connections.values():
        conn.close()
    connections.clear()


def _node_filter(**filters: str | None) -> tuple[str, list[str]]:
    """A WHERE clause on ``nodes`` (and its parameters) matching every filter that is not None."""
    given = {column: value for column, value in filters.items() if value is not None}
    return " AND ".join(["1", *(f"{column} = ?" for column in given)]), list(given.values())


def _node(row: sqlite3.Row) -> NodeRecord:
    times = {"created_at": _time(row["created_at"]), "deleted_at": _time(row["deleted_at"])}
    return NodeRecord(**{**dict(row), **times})


class Ledger:
    """The ledger file at ``path``, created with its folder on first use."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._connections: dict[threading.Thread, sqlite3.Connection] = {}
        self._connections_lock = threading.Lock()
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _close_all, self._connections)
        self._migrate()

    def close(self) -> None:
        """Close every connection (a later call opens its thread's again)."""
        with self._connections_lock:
            _close_all(self._connections)

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection (see the module docstring); a forked child opens its own."""
        me = threading.current_thread()
        with self._connections_lock:
            if self._pid != os.getpid():  # inherited through a fork: SQLite forbids using them here
                self._connections.clear()
                self._pid = os.getpid()
            conn = self._connections.get(me)
            if conn is not None:
                return conn
            for thread in [t for t in self._connections if not t.is_alive()]:
                self._connections.pop(thread).close()
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)  # only its thread uses it; any thread may close it
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._connections[me] = conn
            return conn

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        try:
            yield conn
        finally:
            if conn.in_transaction:  # a call that failed half way leaves nothing open for the next
                conn.execute("ROLLBACK")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the write lock from its first statement."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _journal_mode(self) -> str:
        with self._connect() as conn:
            return conn.execute("PRAGMA journal_mode").fetchone()[0]

    def _enable_wal(self) -> None:
        """Switch the file to WAL once (it stays so): readers then never block the writer.

        Two processes opening a new ledger at once race for the switch. SQLite fails the loser
        at once instead of making it wait (the switch takes an exclusive lock, and even reading
        the mode can fail while the winner holds it), so the loser polls until the file is in
        WAL mode, within the same deadline as any other wait for the lock.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                if self._journal_mode() == "wal":
                    return
                with self._connect() as conn:
                    conn.execute("PRAGMA journal_mode = WAL")
                return  # a file system without WAL keeps its rollback journal, which also works
            except sqlite3.OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
            except sqlite3.DatabaseError as err:
                raise UsageError(f"{self.path} is not a tpuops ledger (SQLite says: {err})") from err

    def _migrate(self) -> None:
        self._enable_wal()
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise UsageError(f"ledger {self.path} has schema {version}, newer than this tpuops knows "
                                 f"({SCHEMA_VERSION}): upgrade tpuops")
            for target, script in enumerate(_MIGRATIONS[version:], start=version + 1):
                for statement in filter(str.strip, script.split(";")):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {target}")

    @staticmethod
    def _incarnation(
        conn: sqlite3.Connection, project: str, zone: str, name: str, uid: str | None
    ) -> sqlite3.Row | None:
        """The row of ``uid``, or without one the latest incarnation of the name."""
        query = f"SELECT {_NODE_COLUMNS} FROM nodes WHERE project = ? AND zone = ? AND name = ?"
        if uid is None:
            return conn.execute(query + " ORDER BY id DESC LIMIT 1", (project, zone, name)).fetchone()
        return conn.execute(query + " AND uid = ?", (project, zone, name, uid)).fetchone()

    @staticmethod
    def _append(conn: sqlite3.Connection, node_id: int, state: str, at: str) -> bool:
        last = conn.execute("SELECT state FROM transitions WHERE node_id = ? ORDER BY id DESC LIMIT 1",
                            (node_id,)).fetchone()
        if last is not None and last["state"] == state:
            return False
        conn.execute("INSERT INTO transitions (node_id, state, at) VALUES (?, ?, ?)", (node_id, state, at))
        return True

    def _close(self, conn: sqlite3.Connection, node_id: int, at: str) -> None:
        conn.execute("UPDATE nodes SET deleted_at = ? WHERE id = ?", (at, node_id))
        self._append(conn, node_id, DELETED, at)

    def record_node(
        self,
        project: str,
        zone: str,
        name: str,
        accelerator: str,
        capacity: str | Enum,
        run_id: str | None = None,
        sweep_id: str | None = None,
        uid: str | None = None,
        *,
        at: datetime | None = None,
    ) -> NodeRecord:
        """Record that tpuops created (or is creating) a node; idempotent per incarnation.

        Returns the existing record when this incarnation is known already: the row of ``uid``,
        or, without a uid, the name's open incarnation. A uid-less open incarnation adopts ``uid``, with the
        accelerator and capacity given with it (the node's own, as a sighting shows them);
        an open incarnation with another uid is closed first (that node is gone: a name holds one node).
        """
        with self._write() as conn:
            return self._record(conn, project, zone, name, accelerator, capacity, run_id, sweep_id, uid, _stamp(at))

    def _record(
        self, conn: sqlite3.Connection, project: str, zone: str, name: str, accelerator: str,
        capacity: str | Enum, run_id: str | None, sweep_id: str | None, uid: str | None, stamp: str,
        created: str | None = None,
    ) -> NodeRecord:
        if uid is not None and (known := self._incarnation(conn, project, zone, name, uid)) is not None:
            return _node(known)
        latest = self._incarnation(conn, project, zone, name, None)
        if latest is not None and latest["deleted_at"] is None:
            if uid is None:
                return _node(latest)
            if latest["uid"] is None:  # its shape and capacity as the node shows them: the record may be of a create
                # that never made a node (its answer lost), taken by a later create of the name on other capacity
                conn.execute("UPDATE nodes SET uid = ?, accelerator = ?, capacity = ? WHERE id = ?",
                             (uid, accelerator, _text(capacity), latest["id"]))
                return _node(self._incarnation(conn, project, zone, name, uid))
            self._close(conn, latest["id"], created or stamp)  # its name was free again by the new one's create
        values = (project, zone, name, uid, accelerator, _text(capacity), run_id, sweep_id, created or stamp)
        conn.execute(_INSERT_NODE, values)
        return _node(self._incarnation(conn, project, zone, name, None))

    def observe_nodes(self, seen: Iterable[Sighting], at: datetime | None = None) -> int:
        """Record many nodes seen in one listing, in one transaction; return how many transitions.

        Each node is recorded first if the ledger does not know it yet (a node of ours that
        another machine created), so a ``status`` pass costs one write however many nodes it saw.
        """
        stamp = _stamp(at)
        changed = 0
        with self._write() as conn:
            for s in seen:
                created = None if s.created_at is None else _stamp(s.created_at)
                record = self._record(conn, s.project, s.zone, s.name, s.accelerator, s.capacity, s.run_id,
                                      s.sweep_id, s.uid, stamp, created)
                if record.deleted_at is not None and CLOSED_STAYS_CLOSED.on:
                    continue  # closed: the sighting is older than the incarnation's end (module docstring)
                changed += self._append(conn, record.id, _text(s.state), stamp if s.at is None else _stamp(s.at))
        return changed

    def observe(
        self, project: str, zone: str, name: str, state: str | Enum, at: datetime | None = None, *,
        uid: str | None = None,
    ) -> bool:
        """Note that the node was seen in ``state``; return whether that was a transition (never one of a closed
        incarnation: module docstring).

        Raises:
            NotFound: the ledger has no such node (``record_node`` it first).
        """
        stamp = _stamp(at)
        with self._write() as conn:
            node = self._require(conn, project, zone, name, uid)
            closed = node["deleted_at"] is not None and CLOSED_STAYS_CLOSED.on
            return not closed and self._append(conn, node["id"], _text(state), stamp)

    def mark_deleted(
        self, project: str, zone: str, name: str, at: datetime | None = None, *, uid: str | None = None
    ) -> bool:
        """Close the incarnation (``deleted_at`` and a final ``DELETED`` transition).

        Returns whether anything changed: deleting an unknown or already deleted node is a no-op.
        """
        stamp = _stamp(at)
        with self._write() as conn:
            node = self._incarnation(conn, project, zone, name, uid)
            if node is None or node["deleted_at"] is not None:
                return False
            self._close(conn, node["id"], stamp)
            return True

    def transitions(self, project: str, zone: str, name: str, *, uid: str | None = None) -> list[Transition]:
        """The incarnation's transitions in the order observed (empty for an unknown node)."""
        with self._connect() as conn:
            node = self._incarnation(conn, project, zone, name, uid)
            if node is None:
                return []
            rows = conn.execute("SELECT state, at FROM transitions WHERE node_id = ? ORDER BY id",
                                (node["id"],)).fetchall()
        return [Transition(state=row["state"], at=datetime.fromisoformat(row["at"])) for row in rows]

    def nodes(
        self,
        project: str | None = None,
        zone: str | None = None,
        *,
        name: str | None = None,
        run_id: str | None = None,
        sweep_id: str | None = None,
        open_only: bool = False,
    ) -> list[NodeRecord]:
        """Recorded incarnations matching every filter given, oldest first."""
        where, params = _node_filter(project=project, zone=zone, name=name, run_id=run_id, sweep_id=sweep_id)
        if open_only:
            where += " AND deleted_at IS NULL"
        with self._connect() as conn:
            return [_node(row) for row in conn.execute(
                f"SELECT {_NODE_COLUMNS} FROM nodes WHERE {where} ORDER BY id", params)]

    def histories(
        self,
        project: str | None = None,
        *,
        run_id: str | None = None,
        sweep_id: str | None = None,
        alive_since: datetime | None = None,
    ) -> list[NodeHistory]:
        """Incarnations matching every filter given, oldest first, each with its transitions.

        ``alive_since`` leaves out incarnations deleted before that time. Nodes and transitions
        are read in one read transaction, so they are one consistent snapshot.
        """
        where, params = _node_filter(project=project, run_id=run_id, sweep_id=sweep_id)
        if alive_since is not None:
            where += " AND (deleted_at IS NULL OR deleted_at >= ?)"
            params.append(_stamp(alive_since))
        with self._connect() as conn:
            conn.execute("BEGIN")
            nodes = [_node(row) for row in conn.execute(
                f"SELECT {_NODE_COLUMNS} FROM nodes WHERE {where} ORDER BY id", params)]
            by_node: dict[int, list[Transition]] = {node.id: [] for node in nodes}
            rows = conn.execute(f"SELECT node_id, state, at FROM transitions WHERE node_id IN "
                                f"(SELECT id FROM nodes WHERE {where}) ORDER BY node_id, id", params)
            for row in rows:
                by_node[row["node_id"]].append(Transition(state=row["state"], at=datetime.fromisoformat(row["at"])))
            conn.execute("COMMIT")
        return [NodeHistory(node=node, transitions=tuple(by_node[node.id])) for node in nodes]

    def _require(
        self, conn: sqlite3.Connection, project: str, zone: str, name: str, uid: str | None
    ) -> sqlite3.Row:
        node = self._incarnation(conn, project, zone, name, uid)
        if node is None:
            which = f"{project}/{zone}/{name}" + (f" (uid {uid})" if uid is not None else "")
            raise NotFound(f"the ledger has no node {which}: record_node must come first")
        return node
