"""Where an attempt's seconds go: the agent's half of the goodput split (status ``attempts``).

A TPU node is billed for every second it is READY; the control plane knows when it became
READY and when billing stopped, the agent knows what it did in between. Each attempt (one
agent start) reports one entry, carried over into later attempts' status like ``evals``::

    attempt        the attempt number
    started_at     unix seconds when the node's startup script began (``TPUOPS_BOOT_T0``, exported
                   by the script; the agent process's start when run without it)
    process_at     unix seconds when the agent's process started, before it imported TensorFlow
                   (from /proc; null where that is missing)
    agent_at       unix seconds when the agent began its command, TensorFlow imported
    loaded_at      unix seconds when the model was built and its checkpoint restored (infer: the model
                   loaded), or null
    first_step_at  unix seconds when the first training call (infer: prediction call) ended, or null:
                   the first completed step, traced and compiled (a call of ``steps_per_call`` steps
                   reports none of them before it returns), which is when a run is training again
    ended_at       unix seconds when the agent finished (any exit class), null while it runs or
                   when it was killed
    seen_at        unix seconds of the entry's last write: a killed attempt's last sign of life
    setup_s        script start -> end of the first call: bundle, TensorFlow import, TPU init, data
                   checks, model build, restore, and the first call itself (it traces and compiles)
    productive_s   turns of the step loop that trained steps for the first time in the run: the
                   call and the loop's bookkeeping after it (status, metrics once per heartbeat),
                   as a step costs in any loop (infer: predicted)
    recomputed_s   turns that trained again steps an earlier attempt had already trained (lost to
                   preemption: they were past its last checkpoint)
    checkpoint_s, eval_s, save_s   checkpoint saves, evaluations, the final SavedModel
    input_wait_s   how long the steps waited for input: a share of productive_s + recomputed_s,
                   not a segment of its own

Segments are disjoint stretches of the attempt's wall time (a checkpoint's or an evaluation's
status writes belong to it); what they do not cover (the agent's exit after its last write, an
attempt that never reached its first call) is left for the control plane to call unaccounted.
The clock is written from the main thread and read by the heartbeat thread, hence the lock.

The segment names are defined here once: this module is shared with the control plane
(``tpuops.accounting.goodput`` names the parts of a billed second with ``DISJOINT`` and ``SHARE``), so it
imports nothing but the standard library, the way ``exits`` is shared.
"""

import functools
import os
import threading
import time
from typing import Any, Dict, Optional

DISJOINT = ("setup", "productive", "recomputed", "checkpoint", "eval", "save")
"""The segments that split an attempt's wall time: none overlaps another."""
SHARE = "input_wait"
"""Not a segment of its own: the part of productive and recomputed time spent waiting for input."""
SEGMENTS = (*DISJOINT, SHARE)


def boot_time() -> float:
    """When this boot's startup script began (unix seconds), else when this process started, else now."""
    try:
        return float(os.environ["TPUOPS_BOOT_T0"])
    except (KeyError, ValueError):
        return process_start() or time.time()


@functools.lru_cache(maxsize=None)
def process_start() -> Optional[float]:
    """When this process started (unix seconds, to the kernel's 10 ms), or None without Linux's /proc.

    The agent is timed from inside, so its own start, and with it what the TensorFlow import
    took, would be lost: the kernel keeps it (``starttime``, in clock ticks since boot). Read
    once: every reading of the clocks would round a little differently.
    """
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            since_boot = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (since_boot - started_ticks / os.sysconf("SC_CLK_TCK"))


class AttemptClock:
    """The time accounting of one attempt; ``entry()`` is its status ``attempts`` element."""

    def __init__(self, attempt: int, started_at: Optional[float] = None) -> None:
        self._lock = threading.Lock()
        self._entry: Dict[str, Any] = {
            "attempt": attempt,
            "started_at": round(started_at if started_at is not None else boot_time(), 3),
            "process_at": process_start(),
            "agent_at": round(time.time(), 3),
            "loaded_at": None,
            "first_step_at": None,
            "ended_at": None,
        }
        self._entry.update({f"{name}_s": 0.0 for name in SEGMENTS})

    def entry(self) -> Dict[str, Any]:
        with self._lock:
            entry = dict(self._entry, seen_at=time.time())
        return {key: round(value, 3) if isinstance(value, float) else value for key, value in entry.items()}

    def add(self, segment: str, seconds: float) -> None:
        if segment not in SEGMENTS:
            raise KeyError(f"not a time segment: {segment}")
        with self._lock:
            self._entry[f"{segment}_s"] += max(0.0, seconds)

    def loaded(self) -> None:
        """The model is built and restored: what remains of setup is the data stream and the first call."""
        with self._lock:
            self._entry["loaded_at"] = round(time.time(), 3)

    def worked(self, seconds: float, redone: float = 0.0, input_wait: float = 0.0) -> None:
        """A turn of the step loop (call and bookkeeping) of ``seconds`` ended; ``redone`` (0..1) of it was redone.

        ``redone`` is the share of its steps an earlier attempt had trained. The attempt's first
        turn closes setup: everything since the script began, that turn included.
        """
        now = time.time()
        with self._lock:
            entry = self._entry
            if entry["first_step_at"] is None:
                entry["first_step_at"] = round(now, 3)
                entry["setup_s"] = max(0.0, entry["first_step_at"] - entry["started_at"])
            else:
                entry["recomputed_s"] += seconds * redone
                entry["productive_s"] += seconds * (1.0 - redone)
            entry["input_wait_s"] += max(0.0, input_wait)

    def timed(self, segment: str) -> "_Timed":
        """``with clock.timed("checkpoint"): ...`` adds the block's duration to ``segment``."""
        return _Timed(self, segment)

    def end(self) -> None:
        """The attempt is over; an attempt that never reached a call spent it all on setup."""
        now = time.time()
        with self._lock:
            entry = self._entry
            entry["ended_at"] = round(now, 3)
            if entry["first_step_at"] is None:
                spent = sum(entry[f"{name}_s"] for name in ("checkpoint", "eval", "save"))
                entry["setup_s"] = max(0.0, now - entry["started_at"] - spent)


class _Timed:
    def __init__(self, clock: AttemptClock, segment: str) -> None:
        self._clock = clock
        self._segment = segment
        self._began = 0.0

    def __enter__(self) -> None:
        self._began = time.monotonic()

    def __exit__(self, *exc: Any) -> None:
        self._clock.add(self._segment, time.monotonic() - self._began)
