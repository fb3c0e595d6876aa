"""The billing truth: every interval a node spent READY, kept in ``<state-dir>/billing.json``.

Cloud TPU bills a node while it is READY; tpuops's cost tracker estimates that from what it
observes, and tests compare the estimate against this record. The file is rewritten
atomically at every change and reloaded at start, so it outlives the emulator process.
Intervals a crashed emulator left open are closed at load time, at its last heartbeat (the
last moment it is known to have been alive, at most a few seconds off), with reason
``emulator-lost``.

Each interval also says what Cloud TPU would charge for it: ``billed_seconds`` is its seconds, or 0
with ``free`` true for a spot or preemptible node preempted within a minute of its create
(``tpuops.providers.cloud_tpu.billing_rules``, the definition the cost tracker applies too).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tpuops.emulator.cloud.wire import rfc3339
from tpuops.emulator.fsutil import read_json, write_json_atomic
from tpuops.providers.cloud_tpu.billing_rules import billed_seconds, preemption_is_free

BILLING_FILE = "billing.json"
HEARTBEAT_FILE = "emulator.heartbeat"


class BillingLedger:
    """READY intervals of every node. Thread-safe."""

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / BILLING_FILE
        self._heartbeat = state_dir / HEARTBEAT_FILE
        self._lock = threading.Lock()
        self._intervals: list[dict[str, Any]] = read_json(self._path, [])
        lost_at = self._heartbeat.stat().st_mtime if self._heartbeat.exists() else time.time()
        if self._close_open(lost_at, "emulator-lost"):
            self._save()
        self.heartbeat()

    def heartbeat(self) -> None:
        """Record that the emulator is alive (called every second or so)."""
        self._heartbeat.touch()

    def open(self, *, uid: str, name: str, zone: str, accelerator_type: str, capacity: str,
             created_epoch: float) -> None:
        """Start an interval for node ``uid`` (which must not have one open), created at ``created_epoch``."""
        now = time.time()
        with self._lock:
            self._intervals.append(
                {
                    "node_uid": uid,
                    "node": name,
                    "zone": zone,
                    "accelerator_type": accelerator_type,
                    "capacity": capacity,
                    "created_epoch": created_epoch,
                    "start": rfc3339(now),
                    "start_epoch": now,
                    "end": None,
                    "end_epoch": None,
                    "end_reason": None,
                    "seconds": None,
                    "billed_seconds": None,
                    "free": False,
                }
            )
            self._save()

    def close(self, uid: str, reason: str) -> None:
        """End the open interval of node ``uid``, if any, because of ``reason``."""
        now = time.time()
        with self._lock:
            for interval in self._intervals:
                if interval["node_uid"] == uid and interval["end_epoch"] is None:
                    _finish(interval, now, reason)
                    self._save()
                    return

    def close_all(self, reason: str) -> None:
        with self._lock:
            if self._close_open(time.time(), reason):
                self._save()

    def records(self) -> list[dict[str, Any]]:
        """Every interval; an open one shows the seconds so far and ``end`` null."""
        now = time.time()
        with self._lock:
            out = [dict(interval) for interval in self._intervals]
        for interval in out:
            if interval["end_epoch"] is None:
                interval["seconds"] = now - interval["start_epoch"]
                interval["billed_seconds"] = _billed(interval, now, preempted=False)
        return out

    def _close_open(self, at: float, reason: str) -> bool:
        open_intervals = [interval for interval in self._intervals if interval["end_epoch"] is None]
        for interval in open_intervals:
            _finish(interval, max(at, interval["start_epoch"]), reason)
        return bool(open_intervals)

    def _save(self) -> None:
        write_json_atomic(self._path, self._intervals)


def _finish(interval: dict[str, Any], at: float, reason: str) -> None:
    interval["end"] = rfc3339(at)
    interval["end_epoch"] = at
    interval["end_reason"] = reason
    interval["seconds"] = at - interval["start_epoch"]
    interval["free"] = reason == "preempted" and preemption_is_free(interval["capacity"], _created(interval), at)
    interval["billed_seconds"] = _billed(interval, at, preempted=reason == "preempted")


def _created(interval: dict[str, Any]) -> float:
    return interval.get("created_epoch", interval["start_epoch"])  # records from before the rule: their start


def _billed(interval: dict[str, Any], end: float, *, preempted: bool) -> float:
    """The interval's billed seconds up to ``end`` (``billing_rules``: the one rule the cost tracker and the
    simulated cloud apply too)."""
    return billed_seconds(interval["capacity"], _created(interval), interval["start_epoch"], end, preempted=preempted)
