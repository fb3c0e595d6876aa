"""The wake-up on the control plane's side: hurry when a preempted agent left its marker.

After its save on a preemption notice the agent writes ``wake/<run>`` (``tpuops.contract.wake``;
layout in ``tpuops.runs.layout``) and, on Google Cloud, starts the reconcile Cloud Run job. The
node is still READY then: it turns PREEMPTED when the notice ends (on the emulator, once the
agent's process group is gone), and only then is it replaced. So a marker does not call for one
pass but for passes at ``WAKE_PACE_S`` until the run is handled, at most ``WAKE_WINDOW_S`` after
the marker:

- ``tpuops watch`` lists ``wake/`` every ``POLL_S`` between its regular passes (one listing call;
  each marker is read once) and hurries as soon as one is there;
- ``tpuops reconcile`` (cron, the Cloud Run job the agent starts) hurries after its pass when it
  finds a fresh marker; a marker older than the window is deleted unread by the next listing.

A run is handled once its memory says finished, it has left the active index, or it holds a
create event dated from the marker on (less ``CLOCK_SKEW_S``: the marker is dated by the VM's
clock). Its marker is deleted then; a controller that hurries for a run another controller holds
stops when that controller's create shows in the run's memory. Hurrying only calls passes sooner:
what a pass decides is unchanged, so a marker that lies (or a lost one) costs API calls, never a
wrong action.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tpuops import runs
from tpuops.contract.wake import marker_at
from tpuops.controller.reconcile import Controller, PassReport
from tpuops.core.errors import DamagedDocument, NotFound, TpuopsError
from tpuops.runs import layout
from tpuops.store import Store

WAKE_PACE_S = 2.0
"""Seconds between two passes while hurrying: a few API calls a pass, for a minute at most per notice."""
WAKE_WINDOW_S = 60.0
"""How long after its marker a run is hurried for: the 30-s notice, then margin for a loaded API."""
POLL_S = 1.0
"""How often ``watch`` lists ``wake/`` between passes (locally a directory listing; on Cloud Storage
one class A operation a second, about USD 0.43 a day)."""
CLOCK_SKEW_S = 5.0
"""How far the VM's clock may be ahead of the controller's when a create is matched with a marker; the
create before the marker's attempt came at least a boot earlier, minutes on Cloud TPU."""

OnPass = Callable[[PassReport], None]


@dataclass(frozen=True)
class Marker:
    run_id: str
    generation: int
    at: float
    """Epoch seconds (the VM's clock) when the agent wrote it."""


class Waker:
    """Finds the markers in one store and hurries passes of one controller for them."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, pace_s: float = WAKE_PACE_S,
                 window_s: float = WAKE_WINDOW_S, poll_s: float = POLL_S) -> None:
        self.store = store
        self.clock = clock
        self.sleep = sleep
        self.pace_s = pace_s
        self.window_s = window_s
        self.poll_s = poll_s
        self._read: dict[str, Marker] = {}  # by key, as last read (its generation says whether it changed)

    def fresh(self) -> list[Marker]:
        """The markers written within the window; older ones are deleted (one listing, new markers read)."""
        found = []
        listed = {obj.key: obj.generation for obj in self.store.list(layout.WAKE)}
        self._read = {key: marker for key, marker in self._read.items() if key in listed}
        for key, generation in listed.items():
            marker = self._read.get(key)
            if marker is None or marker.generation != generation:
                marker = self._parse(key)
                if marker is None:
                    continue
                self._read[key] = marker
            if self.clock() - marker.at > self.window_s:
                self._forget(marker)
            else:
                found.append(marker)
        return found

    def _parse(self, key: str) -> Marker | None:
        run_id = layout.run_of(key, layout.WAKE)
        try:
            data, generation = self.store.read_versioned(key)
        except NotFound:
            return None
        try:
            at = marker_at(data)
        except (ValueError, KeyError, TypeError):
            at = 0.0  # unreadable: as stale as can be, deleted by ``fresh``
        return Marker(run_id, generation, at)

    def _forget(self, marker: Marker) -> None:
        self.store.delete(layout.wake_key(marker.run_id))
        self._read.pop(layout.wake_key(marker.run_id), None)

    def wait(self, seconds: float) -> list[Marker]:
        """Up to ``seconds``, looking every ``poll_s``: the fresh markers as soon as there are any, else []."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                found = self.fresh()
            except TpuopsError:
                found = []  # the store is unwell: the regular pass reports it
            if found:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            self.sleep(min(self.poll_s, left))

    def handled(self, marker: Marker) -> bool:
        """Whether the run of ``marker`` is recovered (a create since the marker) or over."""
        if marker.run_id not in runs.active_index(self.store):
            return True
        try:
            memory, _ = runs.load_memory(self.store, marker.run_id)
        except DamagedDocument:
            return True  # nothing to hurry for: the pass reports the run damaged
        since = marker.at - CLOCK_SKEW_S
        return memory.finished or any(e["kind"] == "create" and e["at"] >= since for e in memory.events)

    def hurry(self, controller: Controller, markers: list[Marker], on_pass: OnPass | None = None) -> int:
        """Passes every ``pace_s`` until every marker's run is handled or its window is over; passes made."""
        waiting = {marker.run_id: marker for marker in markers}
        done = 0
        while waiting:
            started = time.monotonic()
            report = controller.run_pass()
            done += 1
            if on_pass is not None:
                on_pass(report)
            for marker in list(waiting.values()):
                over = self.clock() - marker.at > self.window_s
                try:
                    if over or self.handled(marker):
                        self._forget(marker)
                        del waiting[marker.run_id]
                except TpuopsError:  # the store is unwell: the pass reports it; the window still ends
                    if over:
                        del waiting[marker.run_id]
            if waiting:
                self.sleep(max(0.0, self.pace_s - (time.monotonic() - started)))
        return done
