"""Profiles: a TensorFlow profile of the running job, captured only when asked, into the run's store folder.

Two ways to ask, both answered by the training loop at a call boundary (``train``):

- ``tpuops profile RUN`` writes the request ``runs/<run>/profile.json``, JSON ``{"id", "steps" | "seconds",
  "requested_at"}``. A daemon thread reads it every ``heartbeat_seconds`` (one small read: the only cost of the
  feature while nobody asks; no profiler runs and no server is started) and hands it to the loop.
- The experiment's ``profile: {at_step, steps}`` (run spec ``train.profile_at_step`` / ``profile_steps``): the
  window starts at the first call boundary at or after that step, request id ``experiment``.

A capture goes to ``runs/<run>/profiles/<attempt>-step<first step>/`` (TensorBoard's own layout below it:
``plugins/profile/<session>/<host>.xplane.pb``), and its record ``record.json`` is written last: ``{"request",
"state", "attempt", "first_step", "last_step", "seconds", "hosts", "reason"}``. ``state`` is ``complete``,
``failed`` (the profiler raised: logged, the run goes on, the request is not tried again) or ``discarded`` (the
attempt ended inside the window: a preemption, a failure; its trace files are removed where they can be and the
record says so). Only a complete record's folder is a profile: readers skip every other folder, also one a killed
process left without a record. A discarded request is served again by the next attempt; a request is answered
for good once a complete or failed record names it.

One host: ``tf.profiler.experimental.start`` / ``stop`` around whole calls (the call sizes are cut at the window's
edges, which changes no step's result: ``train``). A pod slice: this process is TensorFlow's single client of
the workers, so the window is traced on every worker by their own profiler services
(``tf.profiler.experimental.client.trace`` to each worker's runtime, one call per worker, all at once on threads
while the loop goes on: ``Profiler._trace`` says why; each worker writes its own ``<host>.xplane.pb`` into the
store, then the files are gathered into one session folder). A capture is complete when one worker's trace came
back; its record's ``reason`` names the workers whose trace did not (none traced: failed). A TPU worker's
runtime serves profiles on port 8466 (what ``capture_tpu_profile`` asks); TensorFlow's own gRPC server (the
emulator's runtime stand-in) serves them on its 8470. A window in steps is traced for that many steps at the last
call's speed (``MIN_TRACE_MS`` at least), so it starts once a call of the attempt has been timed; no window is traced
much past the run's estimated end, which waits for it.

Nothing here can change what the run computes, and nothing here may fail the run: every error is a record.
Standard library and TensorFlow only (``tpuops.agent``'s rule).
"""

import json
import logging
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from tpuops.agent.paths import join, write_whole
from tpuops.contract.profiles import (
    ANSWERED,
    COMPLETE,
    DISCARDED,
    EXPERIMENT_REQUEST,
    FAILED,
    PROFILES,
    RECORD,
    REQUEST,
)

log = logging.getLogger(__name__)

TPU_PROFILER_PORT = 8466
"""Where a TPU worker's runtime serves profiles (its TensorFlow server is on 8470)."""
MIN_TRACE_MS = 2000
"""The shortest trace of a slice's workers: a window of a few fast steps is traced this long (the trace starts
by an RPC to every worker, and a shorter one can fall between two calls)."""


class Window:
    """One profile to capture: ``steps`` calls' worth of steps, or ``seconds`` of wall time."""

    def __init__(self, request: str, steps: Optional[int] = None, seconds: Optional[float] = None,
                 at_step: int = 0) -> None:
        self.request = request
        self.steps = steps
        self.seconds = seconds
        self.at_step = at_step

    @classmethod
    def parse(cls, text: str) -> "Window":
        """A request as ``tpuops profile`` writes it; ValueError when it is not one."""
        obj = json.loads(text)
        request, steps, seconds = obj.get("id"), obj.get("steps"), obj.get("seconds")
        if not isinstance(request, str) or not request or request == EXPERIMENT_REQUEST:
            raise ValueError("a profile request needs a string id")
        if (steps is None) == (seconds is None):
            raise ValueError("a profile request gives steps or seconds")
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0):
            raise ValueError("steps must be a positive integer")
        if seconds is not None and (not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0):
            raise ValueError("seconds must be a positive number")
        return cls(request, steps=steps, seconds=None if seconds is None else float(seconds))


def profiler_addresses(workers: Tuple[str, ...], on_tpu: bool) -> Tuple[str, ...]:
    """``client.trace``'s service address of every worker of a slice, in worker order."""
    if on_tpu:
        workers = tuple(f"{address.rsplit(':', 1)[0]}:{TPU_PROFILER_PORT}" for address in workers)
    return tuple(f"grpc://{address}" for address in workers)


def _trace_one(service: str, folder: str, duration_ms: int, failures: Dict[str, str]) -> None:
    """One worker's trace into ``folder`` (its profiler service writes its ``<host>.xplane.pb`` there itself); what
    went wrong goes to ``failures`` under ``service`` (a worker that ran nothing in the window has no events:
    TensorFlow raises, the worker's empty file is written all the same)."""
    import tensorflow as tf

    try:
        tf.profiler.experimental.client.trace(service, folder, duration_ms, num_tracing_attempts=1,
                                              options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=3))
    except Exception as err:
        text = str(err).strip()
        failures[service] = text.splitlines()[-1] if text else type(err).__name__


def _one_session(folder: str) -> None:
    """Move every worker's files into the first session folder under ``plugins/profile/`` (each trace call names
    its session by its start's second, and calls started a few milliseconds apart can straddle one): TensorBoard's
    Profile tab shows a session's hosts together (the overview page over all of them)."""
    import tensorflow as tf

    root = join(folder, "plugins", "profile")
    sessions = sorted(name.rstrip("/") for name in tf.io.gfile.listdir(root)) if tf.io.gfile.isdir(root) else []
    for session in sessions[1:]:
        for name in tf.io.gfile.listdir(join(root, session)):
            tf.io.gfile.rename(join(root, session, name), join(root, sessions[0], name), overwrite=True)
        tf.io.gfile.rmtree(join(root, session))


class _Capture:
    """The window being captured: where, from which step, and (on a slice) its tracing thread."""

    def __init__(self, window: Window, folder: str, first_step: int) -> None:
        self.window = window
        self.folder = folder
        self.first_step = first_step
        self.started = time.monotonic()
        self.thread: Optional[threading.Thread] = None
        self.error: Optional[str] = None  # why the capture failed (every worker's trace)
        self.note: Optional[str] = None  # why some workers of a complete capture have no trace
        self.duration_ms = 0  # how long a slice's workers are traced


class Profiler:
    """Serves profile requests for one training attempt (module docstring)."""

    def __init__(self, run_dir: str, attempt: int, poll_seconds: float, *, workers: Tuple[str, ...] = (),
                 on_tpu: bool = False, at_step: Optional[int] = None, steps: int = 0,
                 total_steps: Optional[int] = None) -> None:
        self.run_dir = run_dir
        self.total_steps = total_steps  # the run's last step: a slice's trace ends by its estimated end
        self.attempt = attempt
        self.poll_seconds = poll_seconds
        self.workers = workers  # a slice's runtimes; empty on one host
        self.on_tpu = on_tpu
        self.answered: Set[str] = set()
        self.planned: Optional[Window] = Window(EXPERIMENT_REQUEST, steps=steps, at_step=at_step) \
            if at_step is not None and steps > 0 else None
        self._asked: Optional[Window] = None  # the store's request, set by the polling thread
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: Optional[threading.Thread] = None
        self.capture: Optional[_Capture] = None
        self.step_s: Optional[float] = None  # the last call's seconds per step

    def start(self) -> None:
        """Learn which requests were answered, then poll for new ones (a daemon thread)."""
        self.answered = self._answered()
        if self.planned is not None and self.planned.request in self.answered:
            self.planned = None
        self._read_request()  # a request made before training began is served from its first call
        self._poller = threading.Thread(target=self._poll, name="tpuops-profile-requests", daemon=True)
        self._poller.start()

    def close(self) -> None:
        self._stop.set()

    def _answered(self) -> Set[str]:
        import tensorflow as tf

        folder = join(self.run_dir, PROFILES)
        answered: Set[str] = set()
        try:
            names = tf.io.gfile.listdir(folder) if tf.io.gfile.isdir(folder) else []
            for name in names:
                record = join(folder, name.rstrip("/"), RECORD)
                if tf.io.gfile.exists(record):
                    with tf.io.gfile.GFile(record) as src:
                        obj = json.loads(src.read())
                    if obj.get("state") in ANSWERED:
                        answered.add(str(obj.get("request")))
        except Exception:  # a profile must never fail the run: at worst a request is served twice
            log.warning("could not read the earlier profiles' records", exc_info=True)
        return answered

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self._read_request()

    def _read_request(self) -> None:
        """Read ``profile.json``; a new request is handed to the loop (``_next``)."""
        import tensorflow as tf

        path = join(self.run_dir, REQUEST)
        try:
            if not tf.io.gfile.exists(path):
                return
            with tf.io.gfile.GFile(path) as src:
                window = Window.parse(src.read())
        except ValueError as err:
            log.warning("ignoring the profile request %s: %s", path, err)
            return
        except Exception as err:  # the store hiccupped: the next poll reads it again
            log.debug("profile request not read: %s", err)
            return
        with self._lock:
            if window.request not in self.answered and (self.capture is None
                                                        or self.capture.window.request != window.request):
                self._asked = window

    def _next(self, step: int) -> Optional[Window]:
        if self.planned is not None and step >= self.planned.at_step:
            window, self.planned = self.planned, None
            return window
        with self._lock:
            window, self._asked = self._asked, None
            if window is not None and window.request in self.answered:
                return None
            return window

    def _defer(self, window: Window) -> None:
        if window.request == EXPERIMENT_REQUEST:
            self.planned = window
            return
        with self._lock:
            if self._asked is None:
                self._asked = window

    def steps_to_edge(self, step: int) -> Optional[int]:
        """How many steps the next call may run so that it ends on a window's edge; None when nothing cuts it."""
        capture = self.capture
        if capture is not None and capture.thread is None and capture.window.steps is not None:
            return max(1, capture.first_step + capture.window.steps - step)
        if capture is None and self.planned is not None and step < self.planned.at_step:
            return self.planned.at_step - step
        return None

    def boundary(self, step: int, call_steps: int = 0, call_s: float = 0.0) -> None:
        """At a call boundary (``step`` done; the last call ran ``call_steps`` in ``call_s``): end the window
        that is over, or begin the one asked for. Never raises."""
        if call_steps > 0 and call_s > 0:
            self.step_s = call_s / call_steps
        try:
            if self.capture is not None:
                if self._over(self.capture, step):
                    self._finish(step)
                return
            window = self._next(step)
            if window is not None and self.workers and self.step_s is None:
                self._defer(window)  # a slice's window is timed from a call of this attempt: it waits for one
            elif window is not None:
                self._begin(window, step)
        except Exception as err:  # a profile must never fail the run
            log.warning("profile: %s", err, exc_info=True)
            if self.capture is not None:
                self._record(self.capture, FAILED, step, reason=str(err))

    def _over(self, capture: _Capture, step: int) -> bool:
        if capture.thread is not None:
            return not capture.thread.is_alive()
        if capture.window.steps is not None:
            return step >= capture.first_step + capture.window.steps
        return time.monotonic() - capture.started >= (capture.window.seconds or 0.0)

    def _begin(self, window: Window, step: int) -> None:
        import tensorflow as tf

        folder = join(self.run_dir, PROFILES, f"{self.attempt}-step{step}")
        capture = self.capture = _Capture(window, folder, step)
        tf.io.gfile.makedirs(folder)
        if not self.workers:
            tf.profiler.experimental.start(folder)
            log.info("profile %s: tracing this host from step %d", window.request, step)
            return
        capture.duration_ms = self._trace_ms(window, step)
        services = profiler_addresses(self.workers, self.on_tpu)
        log.info("profile %s: tracing %d workers for %d ms from step %d", window.request, len(self.workers),
                 capture.duration_ms, step)
        capture.thread = threading.Thread(target=self._trace, args=(capture, services),
                                          name="tpuops-profile-trace", daemon=True)
        capture.thread.start()

    def _trace_ms(self, window: Window, step: int) -> int:
        """How long a slice's workers are traced: the window's seconds, or its steps at the last call's speed
        (``MIN_TRACE_MS`` at least); never much past the run's estimated end, which waits for the trace (``end``):
        ``--seconds 3600`` near the end of a run is not an hour's wait."""
        if window.seconds is not None:
            duration_ms = int(window.seconds * 1000)
        else:
            duration_ms = int(1000 * (self.step_s or 0.0) * (window.steps or 1))
        if self.total_steps is not None and self.step_s is not None:
            duration_ms = min(duration_ms, int(1000 * self.step_s * max(0, self.total_steps - step)))
        return max(MIN_TRACE_MS, duration_ms)

    @staticmethod
    def _trace(capture: _Capture, services: Tuple[str, ...]) -> None:
        """Trace every worker at once, one ``client.trace`` each, then gather their files into one session.

        One ``client.trace`` naming every worker sends a worker its request only when TensorFlow's client polls
        that worker's call, and it waits on the workers one after the other: while it waits out worker 0's trace,
        the others' requests stay unsent until gRPC's backup poller (every 5 s) or their turn moves them, and
        they traced a stretch after the window (in the emulator's first runs a moment of eval tracing where the
        workers idled: an empty trace, in 4 runs of 10). One call per worker, each on its own thread, is sent at
        once (the workers' sessions begin within milliseconds of each other).
        """
        failures: Dict[str, str] = {}
        threads = [threading.Thread(target=_trace_one, args=(service, capture.folder, capture.duration_ms, failures),
                                    name=f"tpuops-profile-trace-{number}", daemon=True)
                   for number, service in enumerate(services)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        try:
            _one_session(capture.folder)
        except Exception as err:  # the files are there, under two session names: TensorBoard shows both
            log.warning("profile: could not gather the workers' traces into one session: %s", err)
        if failures:
            said = "; ".join(f"{service}: {reason}" for service, reason in sorted(failures.items()))
            if len(failures) == len(services):
                capture.error = said
            else:
                capture.note = f"no trace from {len(failures)} of {len(services)} workers: {said}"

    def _finish(self, step: int) -> None:
        import tensorflow as tf

        capture = self.capture
        assert capture is not None
        if capture.thread is None:
            tf.profiler.experimental.stop()
        if capture.error is not None:
            self._record(capture, FAILED, step, reason=capture.error)
            return
        self._record(capture, COMPLETE, step, reason=capture.note)

    def end(self, step: int) -> None:
        """The last step is done: a window still open ends here, whole (a slice's trace is waited for); never
        raises. Then no more requests are read."""
        self.close()
        capture = self.capture
        if capture is None:
            return
        if capture.thread is not None:
            capture.thread.join()
        try:
            self._finish(step)
        except Exception as err:
            log.warning("profile: %s", err, exc_info=True)
            if self.capture is not None:
                self._record(self.capture, FAILED, step, reason=str(err))

    def abandon(self, step: int, reason: str) -> None:
        """The attempt ends inside a window: discard it (its files removed where they can be); never raises."""
        capture = self.capture
        self.close()
        if capture is None:
            return
        try:
            import tensorflow as tf

            if capture.thread is None:
                tf.profiler.experimental.stop(save=False)
            traces = join(capture.folder, "plugins")
            if capture.thread is None and tf.io.gfile.isdir(traces):
                tf.io.gfile.rmtree(traces)
        except Exception:
            log.warning("profile: could not discard the window's trace", exc_info=True)
        self._record(capture, DISCARDED, step, reason=reason)

    def _hosts(self, folder: str) -> List[str]:
        import tensorflow as tf

        suffix = ".xplane.pb"
        return sorted(name[: -len(suffix)] for name in tf.io.gfile.glob(join(folder, "plugins", "profile", "*",
                                                                             "*" + suffix))
                      for name in [name.rsplit("/", 1)[-1]])

    def _record(self, capture: _Capture, state: str, step: int, reason: Optional[str] = None) -> None:
        """Write the capture's record (last); a record that cannot be written leaves the folder unrecorded."""
        self.capture = None
        if state in ANSWERED:
            self.answered.add(capture.window.request)
        document: Dict[str, Any] = {
            "request": capture.window.request,
            "state": state,
            "attempt": self.attempt,
            "first_step": capture.first_step,
            "last_step": step,
            "seconds": round(time.monotonic() - capture.started, 3),
            "hosts": [],
            "reason": reason,
        }
        try:
            if state == COMPLETE:
                document["hosts"] = self._hosts(capture.folder)
            write_whole(join(capture.folder, RECORD), json.dumps(document))
            log.info("profile %s %s: steps %d-%d in %s", capture.window.request, state, capture.first_step, step,
                     capture.folder)
        except Exception:
            log.warning("profile: could not write the record of %s", capture.folder, exc_info=True)
