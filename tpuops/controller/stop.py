"""Stop runs: ``tpuops stop``, ``tpuops down`` of a run's node and the dashboard's stop button, on one path.

A stop is never refused because another controller holds the run's lease, and never races it:

1. the request is written (``runs.request_stop``: the run's ``stop.json``, then its index marker), by anyone;
2. a pass over those runs (``Controller.run_pass(only=...)``) takes each lease it can and honours the request
   there (``decide``): the memory says STOPPED, then the node is deleted, which sends the agent its notice, so
   it checkpoints on the way out. A run whose lease another controller holds (``train --follow``, ``watch``) is
   stopped by that controller at its next pass, which reads the request with the run's memory; a run whose
   holder died is taken over once its lease expires;
3. with ``wait``, passes follow until every memory says finished and every node is gone, within ``timeout_s``.

Once the request is written the stop is recorded, and the agent sees it itself: it looks for ``stop.json`` in the
store at every heartbeat (``tpuops.agent.job``), saves at its next call boundary and ends ``stopped``, whether or
not the Cloud TPU API answers (its node then deletes itself, asking again until the API does). So an API that fails
never makes ``stop`` fail or block: without ``wait`` one pass is tried (each call once, ``api.stop``), and what it
could not do is said (``Stopped.trouble``) and left to the next pass; with ``wait`` passes go on, saying each
failure, until ``timeout_s``. A run whose memory is damaged is stopped all the same (its agent reads the request),
with the one line that repairs the memory.

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
from tpuops.core.errors import DamagedDocument, Timeout, TpuopsError
from tpuops.runs import Outcome, Run


@dataclass(frozen=True)
class Stopped:
    """What a stop did to one run."""

    run_id: str
    outcome: Outcome | None
    """How the run ended: STOPPED, or its own ending when it had ended before (``already``); None while only
    requested (``wait=False`` and another controller holds the run, or the API did not answer: it is stopped at the
    next pass that can)."""
    already: bool = False
    node_gone: bool = False
    trouble: str | None = None
    """Why the stop could not be carried through now (the API failed, the run's memory is damaged): it is recorded
    all the same, and takes effect as ``text`` says."""

    @property
    def text(self) -> str:
        """One line saying what happened, and when a stop only recorded takes effect."""
        if self.already:
            return f"{self.run_id}: ended already ({self.outcome}); nothing to stop"
        resume = f"its checkpoints stay: 'tpuops train --resume {self.run_id}'"
        if self.trouble is not None:
            return (f"{self.run_id}: stop recorded, not carried through yet ({self.trouble}); its agent reads it "
                    f"from the store within a heartbeat (10 s by default), saves and ends, and its node is "
                    f"deleted at the next pass that reaches the API; {resume}")
        if self.outcome is None:
            return (f"{self.run_id}: stop requested; its agent reads it from the store within a heartbeat, saves "
                    f"and ends, and the controller driving it stops it at its next pass")
        node = "its node is gone" if self.node_gone else "its node is being deleted"
        return f"{self.run_id}: {self.outcome} ({node}; {resume})"

    def to_json(self) -> dict[str, object]:
        return {"run_id": self.run_id, "outcome": self.outcome.value if self.outcome else None,
                "already": self.already, "node_gone": self.node_gone, "requested": self.outcome is None,
                "trouble": self.trouble}


def stop_runs(controller: Controller, targets: Sequence[Run], reason: str, *, wait: bool, timeout_s: float,
              poll_s: float, sleep: Callable[[float], None] = time.sleep,
              progress: Callable[[str], None] = lambda _text: None) -> list[Stopped]:
    """Stop ``targets`` (runs read by the caller, every one known to exist) through ``controller`` (module docstring).

    The requests are written first: from then on the stop is recorded, and nothing the API or a run's memory does
    turns it into a failure. An API that fails (``TpuopsError`` from a pass or a look at a node) or a damaged
    memory leaves the run ``Stopped(outcome=None, trouble=...)``: without ``wait`` at once, with ``wait`` when
    ``timeout_s`` runs out (``progress`` says each trouble as it comes). Raises ``Timeout`` (with ``wait``) naming
    the runs not stopped, or whose node is not gone, in ``timeout_s`` when nothing went wrong but their
    controller did not act: their requests stay, and the controller that drives each stops it at its next pass.
    """
    store = controller.store
    done = {run.run_id: Stopped(run.run_id, run.outcome, already=True) for run in targets if run.finished}
    going = {run.run_id: run for run in targets if not run.finished}
    now = time.time()
    for run_id in going:
        runs.request_stop(store, run_id, reason, now)
    trouble: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while going:
            try:
                controller.run_pass(only=list(going))
            except TpuopsError as err:  # the request is recorded: a later pass honours it
                trouble.update((run_id, f"the pass failed: {err}") for run_id in going)
                progress(f"the stop is recorded; this pass failed ({err})")
            for run_id, run in list(going.items()):
                finished = _finished(controller, run, trouble)
                if finished is not None and (finished.node_gone or not wait):
                    done[run_id] = finished
                    del going[run_id]
            if not going:
                break
            if not wait or time.monotonic() >= deadline:
                if trouble or not wait:
                    done.update((run_id, Stopped(run_id, None, trouble=trouble.get(run_id))) for run_id in going)
                    break
                raise Timeout(f"not stopped within {timeout_s:.0f} s: {', '.join(sorted(going))} (the stop "
                              "request stays; the controller driving each run stops it at its next pass)")
            sleep(poll_s)
    finally:
        controller.release()
    return [done[run.run_id] for run in targets]


def _finished(controller: Controller, run: Run, trouble: dict[str, str]) -> Stopped | None:
    """How the run ended if its memory says it did (None: not yet, or unreadable), and whether its node is gone;
    a failure to read the memory or to find the node goes to ``trouble``."""
    try:
        memory = runs.load_memory(controller.store, run.run_id)[0]
    except DamagedDocument as err:
        trouble[run.run_id] = f"{err}; 'tpuops runs repair {run.run_id}' rebuilds it"
        return None
    if not memory.finished:
        return None
    try:
        gone = not node_left(controller, run.record.node_name, memory)
    except TpuopsError as err:
        trouble[run.run_id] = f"the API did not answer: {err}"
        gone = False
    return Stopped(run.run_id, Outcome(memory.outcome or Outcome.STOPPED), node_gone=gone,
                   trouble=None if gone else trouble.get(run.run_id))
