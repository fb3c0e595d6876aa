"""``runs/<run>/status.json``: what the agent is doing, rewritten whole and often.

The control plane reads this file to follow a run and to decide what to do when the node goes
away; it never talks to the agent otherwise. Fields (times are UTC ISO 8601)::

    run_id, command ("train" | "infer"), attempt (1, 2, ... one per agent start),
    phase        starting | loading | training | checkpointing | evaluating | saving |
                 predicting | done  ("done" exactly when exit_class is set)
    step, total_steps, examples_per_sec, global_batch, replicas, device ("TPU" | "CPU"),
    deterministic  whether TF op determinism is on for this attempt (the spec's choice, or its
                 ``auto`` rule: on without a TPU), null before the runtime is chosen and in script mode
    resumed_from_step   null on a fresh start, else the checkpoint step this attempt resumed from
    recomputed_steps    steps trained again over the whole run: on each resume, how far the attempt
                 before had gone past the checkpoint resumed from (as its last status says: steps
                 after its last write are not counted)
    last_checkpoint_step  the newest checkpoint known to be whole in the store (a resumed attempt
                 never starts before it), null before the first; written once its copy is complete
    checkpoint_in_flight  the step of the checkpoint being written in the background, else null
    checkpoint_every_s  the periodic checkpoint interval in use (``every: auto``: re-chosen after each save)
    last_save_s  the last checkpoint's cost in seconds, from its snapshot to whole in the store (what
                 ``every: auto`` weighs; a forecast learns an experiment's save cost from it), null before the first
    metrics      {"train": {...}, "eval": {...}, "predicted": n}
    input_wait_ms  mean time a training step waited for its batch over the last call (the
                 starvation measure: near 0 when the input pipeline keeps up), null before
    evals        [{"step": int, "metrics": {name: float}}, ...] every evaluation of the run in
                 step order, the periodic ones and the final one, carried over from earlier
                 attempts (an evaluation at a step replaces the ones at that step and later,
                 which a resumed attempt redoes); names are the model's for compiled models
    attempts     [{...}, ...] one entry per attempt of the run, in order, carried over like evals:
                 where its seconds went (setup, productive, recomputed, checkpoint, eval, save,
                 input wait) and when it started and ended (fields in ``tpuops/agent/timing.py``);
                 [] in script mode, where the agent does not see the program's steps
    started, heartbeat  heartbeat is refreshed at least every spec.heartbeat_seconds while alive
    exit_class   null while running, else succeeded | user-error | diverged | preempted | crashed
    ended        null while running, else when the agent finished (set with exit_class, to the
                 microsecond): unless the VM is being preempted or the node is kept, the startup
                 script deletes the node right after (the dead-man's switch), so the control plane
                 dates the end of billing of a node gone by itself here (``runs.self_deleted_at``)
    exit_code, message  one line saying why (for every non-success)
    traceback    the last lines of the traceback for user-error and crashed

A heartbeat older than a few intervals with ``exit_class`` null means the agent hung or died
(SIGKILL, the VM vanished): the controller treats that as a crash. Writes go through
``paths.write_whole`` so readers never see a torn file.
"""

import json
import logging
import math
import threading
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from tpuops.agent.exits import ExitClass
from tpuops.agent.paths import write_whole
from tpuops.agent.timing import AttemptClock

log = logging.getLogger(__name__)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Previous:
    """What the last attempt's status.json hands to the next attempt, read once."""

    def __init__(self, path: str, text: Optional[str] = None) -> None:
        """Read ``path``, or take its ``text`` when it was read already ("" for a missing file)."""
        try:
            if text is None:
                with tf.io.gfile.GFile(path) as src:
                    text = src.read()
            doc = json.loads(text)
        except (tf.errors.NotFoundError, ValueError):
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        self.attempt = _count(doc, "attempt")
        """The attempt number the last agent recorded; 0 when there was none."""
        self.reach = (_count(doc, "step"), _count(doc, "recomputed_steps"))
        """(the step the last attempt reached, the steps recomputed before it): what resuming costs again."""
        evals = doc.get("evals")
        self.evals: List[Dict[str, Any]] = [
            e
            for e in (evals if isinstance(evals, list) else [])
            if isinstance(e, dict) and isinstance(e.get("step"), int) and isinstance(e.get("metrics"), dict)
        ]
        """The evaluations recorded by earlier attempts of the run (well-formed entries only)."""
        attempts = doc.get("attempts")
        self.attempts: List[Dict[str, Any]] = [
            a for a in (attempts if isinstance(attempts, list) else []) if isinstance(a, dict) and _count(a, "attempt")
        ]
        """Earlier attempts' time accounting, for the goodput of the whole run (well-formed entries only)."""


def _count(doc: Dict[str, Any], key: str) -> int:
    value = doc.get(key)
    return value if isinstance(value, int) else 0


class Status:
    """The in-memory status document and its writer; safe to use from several threads."""

    def __init__(
        self,
        path: str,
        run_id: str,
        command: str,
        attempt: int,
        evals: Optional[List[Dict[str, Any]]] = None,
        reach: Tuple[int, int] = (0, 0),
        attempts: Optional[List[Dict[str, Any]]] = None,
        timed: bool = True,
    ) -> None:
        self._path = path
        self.attempt = attempt
        self._previous_step = reach[0]
        self._earlier_attempts = [a for a in attempts or [] if a.get("attempt") != attempt]
        self.clock = AttemptClock(attempt)
        """Where this attempt's seconds go; written with every status write when ``timed``."""
        self._timed = timed
        self._lock = threading.Lock()
        now = utc_now()
        self._doc: Dict[str, Any] = {
            "run_id": run_id,
            "command": command,
            "attempt": attempt,
            "phase": "starting",
            "step": 0,
            "total_steps": None,
            "examples_per_sec": None,
            "global_batch": None,
            "replicas": None,
            "device": None,
            "deterministic": None,
            "resumed_from_step": None,
            "recomputed_steps": reach[1],
            "last_checkpoint_step": None,
            "checkpoint_in_flight": None,
            "checkpoint_every_s": None,
            "last_save_s": None,
            "metrics": {},
            "input_wait_ms": None,
            "evals": list(evals or []),
            "attempts": [],
            "started": now,
            "heartbeat": now,
            "exit_class": None,
            "ended": None,
            "exit_code": None,
            "message": None,
            "traceback": None,
        }

    def update(self, write: bool = False, **fields: Any) -> None:
        """Change fields; ``write`` pushes to the store now, else the next heartbeat does."""
        with self._lock:
            unknown = set(fields) - set(self._doc)
            if unknown:
                raise KeyError(f"not status fields: {sorted(unknown)}")
            self._doc.update(fields)
        if write:
            self.write()

    def resumed(self, step: int) -> None:
        """This attempt starts from the checkpoint at ``step``; the steps the last one went past it are redone."""
        with self._lock:
            recomputed = self._doc["recomputed_steps"] + max(0, self._previous_step - step)
        self.update(write=True, resumed_from_step=step, step=step, last_checkpoint_step=step,
                    recomputed_steps=recomputed)

    def trained(self, first_step: int, steps: int, seconds: float, input_wait: float) -> None:
        """A call trained ``steps`` steps after ``first_step`` in ``seconds``; the clock learns which were redone."""
        redone = min(max(self._previous_step - first_step, 0), steps) / steps if steps else 0.0
        self.clock.worked(seconds, redone, input_wait)

    def set_phase(self, phase: str) -> None:
        """Enter a phase; phase changes are written at once."""
        self.update(write=True, phase=phase)

    def set_metrics(self, group: str, values: Any) -> None:
        with self._lock:
            self._doc["metrics"] = dict(self._doc["metrics"], **{group: values})

    def get(self, name: str) -> Any:
        """The current value of field ``name``."""
        with self._lock:
            return self._doc[name]

    def nonfinite_metrics(self) -> List[str]:
        """``group.name`` of every metric now NaN or infinite (``train.loss``): a run that shows one diverged."""
        with self._lock:
            groups = dict(self._doc["metrics"])
        return sorted(
            f"{group}.{name}"
            for group, values in groups.items()
            if isinstance(values, dict)
            for name, value in values.items()
            if isinstance(value, float) and not math.isfinite(value)
        )

    def add_eval(self, step: int, metrics: Dict[str, float]) -> None:
        """Record an evaluation at ``step``; it replaces any recorded at this step or later."""
        with self._lock:
            kept = [e for e in self._doc["evals"] if e["step"] < step]
            self._doc["evals"] = [*kept, {"step": step, "metrics": dict(metrics)}]

    def finish(self, exit_class: ExitClass, message: Optional[str] = None, traceback: Optional[str] = None) -> None:
        """Record how the process ends; the file is final after this."""
        self.clock.end()
        self.update(
            write=True,
            phase="done",
            exit_class=exit_class.value,
            ended=datetime.now(timezone.utc).isoformat(timespec="microseconds"),
            exit_code=exit_class.code,
            message=message,
            traceback=traceback,
        )

    def write(self) -> None:
        with self._lock:
            self._doc["heartbeat"] = utc_now()
            if self._timed:
                self._doc["attempts"] = [*self._earlier_attempts, self.clock.entry()]
            text = json.dumps(self._doc, indent=1, sort_keys=True)
            # Under the lock so that two writers cannot put an older document last.
            write_whole(self._path, text)


class Ticker:
    """A daemon thread that calls ``tasks`` every ``interval`` seconds and once more on stop.

    The heartbeat has to keep beating while the main thread sits in a long TensorFlow call
    (XLA compilation, a slow checkpoint); TensorFlow releases the GIL there, so a thread can.
    A failing task (a transient store error) is logged and retried at the next tick.
    """

    def __init__(self, interval: float, tasks: List[Callable[[], None]]) -> None:
        self._interval = interval
        self._tasks = tasks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpuops-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._tick()
        self._tick()

    def _tick(self) -> None:
        for task in self._tasks:
            try:
                task()
            except Exception:  # the heartbeat must outlive a flaky store
                log.warning("heartbeat task %s failed", getattr(task, "__qualname__", task), exc_info=True)
