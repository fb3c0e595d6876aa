"""An Optuna journal kept in the store: no database server, shared by every machine that reaches the bucket.

Layout under ``sweeps/<sweep>/journal/``::

    seg-0000000000.json   the logs of one ``append_logs`` call (a JSON list), written with
    seg-0000000001.json   compare-and-swap on generation 0: of two writers racing for number N,
    ...                   exactly one wins; the loser reads N and tries N+1
    snap-0000000256.jsonl every log of segments [0, 256), one per line (a compaction)
    head.json             {"snapshot": 256}: where a reader starts (absent: at segment 0)

Invariants:

- Segment numbers are gap-free: a writer tries N only after it has read every segment below N,
  so the journal's order is the order of the numbers, the same for every reader. Segments are
  never deleted, so a number once taken stays taken.
- A write is one object write (atomic in both stores): a writer SIGKILLed mid-write leaves the
  segment whole or absent, never torn.
- A snapshot ``snap-K`` holds exactly the logs of segments [0, K) and is written before
  ``head.json`` points at it. A load reads the head, the snapshot and the segments from K on:
  its cost grows with the segments written since the last compaction, not with the study.
- ``exclusive``: the caller holds the sweep's lease, so nobody else writes. Reads then never go
  back to the store after the load (``catch_up`` does, when asked), and a lost compare-and-swap
  means the lease was lost: ``JournalConflict``, the pass stops for that sweep and the next one
  starts afresh.
- ``batched`` (exclusive holders only): the appends of a block become one segment, written by
  ``flush`` or when the block ends; this process reads them at once. Optuna appends once per
  call (a report, an attribute, a tell), about 20 segments a pass at 50 trials in parallel: one
  store write each, and one read each for every later load until the next compaction. A holder
  killed inside a block loses its unwritten appends, which a sweep pass tolerates: it flushes
  before it declares a trial's run, and whatever else it did is redone by the next pass from
  what the journal and the runs show.

What Optuna's journal backends promise, this one keeps: many threads may share one backend
(every read and append holds its lock, so the logs read and the next segment number move
together), many processes may append at once (the compare-and-swap above), and it pickles (the
store and the prefix travel; the unpickled copy loads the journal afresh, with a lock of its own).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

from optuna.storages.journal import BaseJournalBackend

from tpuops.core.errors import NotFound, PreconditionFailed, TpuopsError
from tpuops.store import Store

SEGMENT = "seg-"
SNAPSHOT = "snap-"
HEAD = "head.json"
COMPACT_AFTER = 256
"""Segments since the last snapshot after which ``compact`` writes a new one."""


class JournalConflict(TpuopsError):
    """Another writer appended to a journal this process held exclusively (its lease was lost)."""


class StoreJournal(BaseJournalBackend):
    """``BaseJournalBackend`` over a ``Store`` prefix (see the module docstring)."""

    def __init__(self, store: Store, prefix: str, *, exclusive: bool = False) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/") + "/"
        self.exclusive = exclusive
        self._lock = threading.RLock()
        self._logs: list[dict[str, Any]] = []
        self._next = 0  # the next segment number
        self._base = 0  # the snapshot the load started from
        self._pending: list[dict[str, Any]] | None = None  # batched appends not written yet (None: not batching)
        self._load()

    def __reduce__(self) -> tuple[Any, ...]:
        return _reopen, (self.store, self.prefix, self.exclusive)

    def _key(self, kind: str, number: int) -> str:
        return f"{self.prefix}{kind}{number:010d}.{'jsonl' if kind == SNAPSHOT else 'json'}"

    def _load(self) -> None:
        try:
            head = json.loads(self.store.read_bytes(self.prefix + HEAD))
        except NotFound:
            head = {"snapshot": 0}
        if head["snapshot"]:
            text = self.store.read_bytes(self._key(SNAPSHOT, head["snapshot"])).decode()
            self._logs = [json.loads(line) for line in text.splitlines() if line]
            self._next = self._base = int(head["snapshot"])
        self.catch_up()

    def catch_up(self) -> None:
        """Read the segments written since we last looked (one read that misses when there are none)."""
        while True:
            try:
                data = self.store.read_bytes(self._key(SEGMENT, self._next))
            except NotFound:
                return
            self._logs.extend(json.loads(data))
            self._next += 1

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        with self._lock:
            if not self.exclusive:
                self.catch_up()
            return self._logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        with self._lock:
            if self._pending is not None:
                self._logs.extend(logs)
                self._pending.extend(logs)
                return
            self._append(json.dumps(logs, separators=(",", ":")).encode(), logs)

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Make the appends inside one segment, written by ``flush`` or when the block ends (see the
        module docstring); exclusive holders only."""
        if not self.exclusive:
            raise ValueError("only the holder of the sweep's lease batches its appends")
        with self._lock:
            self._pending = []
        try:
            yield
        finally:
            with self._lock:
                try:
                    self.flush()
                finally:
                    self._pending = None

    def flush(self) -> None:
        """Write the appends batched so far as one segment (nothing when there are none)."""
        with self._lock:
            if self._pending:
                self._append(json.dumps(self._pending, separators=(",", ":")).encode(), [])
                self._pending.clear()

    def _append(self, body: bytes, logs: list[dict[str, Any]]) -> None:
        while True:
            try:
                self.store.write_if_generation_match(self._key(SEGMENT, self._next), body, 0)
            except PreconditionFailed:
                if self.exclusive:
                    raise JournalConflict(f"another process wrote {self.store.uri_of(self.prefix[:-1])} while this "
                                          "one held the sweep's lease; the next pass starts afresh") from None
                self.catch_up()
                continue
            self._logs.extend(logs)
            self._next += 1
            return

    @property
    def segments_total(self) -> int:
        return self._next

    @property
    def segments_since_snapshot(self) -> int:
        return self._next - self._base

    def compact(self) -> bool:
        """Write a snapshot of everything read and point the head at it (exclusive holders only).

        Returns whether it compacted (only past ``COMPACT_AFTER`` segments since the last snapshot).
        """
        with self._lock:
            if not self.exclusive or self.segments_since_snapshot < COMPACT_AFTER:
                return False
            self._snapshot()
            return True

    def _snapshot(self) -> None:
        body = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in self._logs).encode()
        # A snapshot already there was written by a pass that died before moving the head: the same logs.
        with contextlib.suppress(PreconditionFailed):
            self.store.write_if_generation_match(self._key(SNAPSHOT, self._next), body, 0)
        self.store.write_bytes(self.prefix + HEAD, json.dumps({"snapshot": self._next}).encode())
        self._base = self._next


def _reopen(store: Store, prefix: str, exclusive: bool) -> StoreJournal:
    """How a pickled journal comes back: loaded afresh from its store (see the module docstring)."""
    return StoreJournal(store, prefix, exclusive=exclusive)
