"""The agent's writer of ``runs/<run>/status.json`` (schema and field meanings: ``tpuops.contract.status``).

``Status`` keeps the document in memory and writes it whole through ``paths.write_whole``, so readers
never see a torn file; ``Previous`` reads what the last attempt left; ``Ticker`` keeps the heartbeat.
"""

import json
import logging
import math
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from tpuops.agent.paths import write_whole
from tpuops.contract.exits import ExitClass
from tpuops.contract.status import ended_now, new_document, utc_now
from tpuops.contract.timing import AttemptClock

log = logging.getLogger(__name__)


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
        self.on_checkpoint: Callable[[], None] = lambda: None
        """Called (on the thread that reports it) each time a new ``last_checkpoint_step`` is reported: the job
        ships its log there, so that what led to a checkpoint is in the store with it."""
        self._lock = threading.Lock()
        self._doc: Dict[str, Any] = new_document(run_id, command, attempt, reach[1], evals)

    def update(self, write: bool = False, **fields: Any) -> None:
        """Change fields; ``write`` pushes to the store now, else the next heartbeat does."""
        with self._lock:
            unknown = set(fields) - set(self._doc)
            if unknown:
                raise KeyError(f"not status fields: {sorted(unknown)}")
            checkpointed = fields.get("last_checkpoint_step", self._doc["last_checkpoint_step"]) != \
                self._doc["last_checkpoint_step"]
            self._doc.update(fields)
        if write:
            self.write()
        if checkpointed:
            self.on_checkpoint()

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

    def evaluated(self, step: int) -> bool:
        """True when an evaluation at ``step`` is recorded (by this attempt or an earlier one)."""
        with self._lock:
            return any(e["step"] == step for e in self._doc["evals"])

    def finish(self, exit_class: ExitClass, message: Optional[str] = None, traceback: Optional[str] = None) -> None:
        """Record how the process ends; the file is final after this."""
        self.clock.end()
        self.update(
            write=True,
            phase="done",
            exit_class=exit_class.value,
            ended=ended_now(),
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
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tpuops-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def now(self) -> None:
        """Tick as soon as the thread can, without waiting for the interval; only sets a flag, so a signal
        handler may call it."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stopping:
                break
            self._tick()
        self._tick()

    def _tick(self) -> None:
        for task in self._tasks:
            try:
                task()
            except Exception:  # the heartbeat must outlive a flaky store
                log.warning("heartbeat task %s failed", getattr(task, "__qualname__", task), exc_info=True)
