"""Stop runs: ``tpuops stop``, ``tpuops down`` of a run's node and the dashboard's stop button, on one path.

A stop is never refused because another controller holds the run's lease, and never races it:

1. the request is written (``runs.request_stop``: the run's ``stop.json``, then its index marker), by anyone;
2. a pass over those runs (``Controller.run_pass(only=...)``) takes each lease it can and honours the request
   there (``decide``): the memory says STOPPED, then the node is deleted, which sends the agent its notice, so
   it checkpoints on the way out. A run whose lease another controller holds (``train --follow``, ``watch``) is
   stopped by that controller at its next pass, which reads the request with the run's memory; a run whose
   holder died is taken over once its lease expires;
3. with ``wait``, passes follow until every memory says finished and every node is gone, within ``timeout_s``.

The memory is finished before the node is deleted, so no pass recreates the node and none counts a preemption.
A stopped run keeps its checkpoints: ``train --resume`` drives it again (``runs.reopen`` drops the request).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpuops import runs
from tpuops.controller.drive import node_left
from tpuops.controller.reconcile import Controller
from tpuops.core.errors import Timeout
from tpuops.runs import Outcome, Run


@dataclass(frozen=True)
class Stopped:
    """What a stop did to one run."""

    run_id: str
    outcome: Outcome | None
    """How the run ended: STOPPED, or its own ending when it had ended before (``already``); None while only
    requested (``wait=False`` and another controller holds the run: it stops the run at its next pass)."""
    already: bool = False
    node_gone: bool = False

    @property
    def text(self) -> str:
        """One line saying what happened."""
        if self.already:
            return f"{self.run_id}: ended already ({self.outcome}); nothing to stop"
        if self.outcome is None:
            return f"{self.run_id}: stop requested; the controller driving it stops it at its next pass"
        node = "its node is gone" if self.node_gone else "its node is being deleted"
        return f"{self.run_id}: {self.outcome} ({node}; its checkpoints stay: 'tpuops train --resume {self.run_id}')"

    def to_json(self) -> dict[str, object]:
        return {"run_id": self.run_id, "outcome": self.outcome.value if self.outcome else None,
                "already": self.already, "node_gone": self.node_gone, "requested": self.outcome is None}


def stop_runs(controller: Controller, targets: Sequence[Run], reason: str, *, wait: bool, timeout_s: float,
              poll_s: float, sleep: Callable[[float], None] = time.sleep) -> list[Stopped]:
    """Stop ``targets`` (runs read by the caller, every one known to exist) through ``controller`` (module docstring).

    Raises ``Timeout`` (with ``wait``) naming the runs not stopped, or whose node is not gone, in ``timeout_s``:
    their requests stay, and the controller that drives each stops it at its next pass.
    """
    store = controller.store
    done = {run.run_id: Stopped(run.run_id, run.outcome, already=True) for run in targets if run.finished}
    going = {run.run_id: run for run in targets if not run.finished}
    now = time.time()
    for run_id in going:
        runs.request_stop(store, run_id, reason, now)
    deadline = time.monotonic() + timeout_s
    try:
        while going:
            controller.run_pass(only=list(going))
            for run_id, run in list(going.items()):
                memory = runs.load_memory(store, run_id)[0]
                if not memory.finished:
                    continue
                gone = not node_left(controller, run.record.node_name, memory)
                if gone or not wait:
                    done[run_id] = Stopped(run_id, Outcome(memory.outcome or Outcome.STOPPED), node_gone=gone)
                    del going[run_id]
            if not going:
                break
            if not wait:
                done.update((run_id, Stopped(run_id, None)) for run_id in going)
                break
            if time.monotonic() >= deadline:
                raise Timeout(f"not stopped within {timeout_s:.0f} s: {', '.join(sorted(going))} (the stop "
                              "request stays; the controller driving each run stops it at its next pass)")
            sleep(poll_s)
    finally:
        controller.release()
    return [done[run.run_id] for run in targets]

