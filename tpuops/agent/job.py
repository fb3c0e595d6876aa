"""One agent process, from the spec to the exit code.

Order matters: the spec is read first (without it there is no store to report to), then the
log chunks, the status file and the heartbeat start, and only then does anything that can
fail slowly (TPU initialisation, data, model) run. Every way out of the command goes through
one ``except``: the exception is classified (``blame.classify``), ``status.json`` gets the
exit class, a one-line message and, for user-error and crashed, the traceback; the process
exits with the class's code. A preempted attempt then wakes the control plane (``wake``).

A ``train`` spec with a ``script`` section runs the user's program (``script``) instead of the
built-in loop; the agent then never initialises the TPU itself (the program does).

What ``prefetch`` fetched while TensorFlow imported (spec, last status, newest checkpoint) is
used in place of the store's reads; each piece it could not fetch is read from the store.
"""

import logging
import os
import sys
from typing import Callable, Optional

import tensorflow as tf

from tpuops.agent import entry, infer, script, train, wake
from tpuops.agent.blame import classify, preemption_caused
from tpuops.agent.logs import FORMATTER, ChunkedLogHandler
from tpuops.agent.paths import RunPaths
from tpuops.agent.preemption import PreemptionNotice, metadata_host
from tpuops.agent.prefetch import Prefetch
from tpuops.agent.runtime import check_seed, check_tensorflow, connect
from tpuops.agent.status import Previous, Status, Ticker
from tpuops.contract.exits import (
    DivergedExit,
    ExitClass,
    PreemptedExit,
    UserError,
    describe,
    traceback_tail,
)
from tpuops.contract.runspec import RunSpec, SpecError, parse_spec

log = logging.getLogger("tpuops.agent")

# Log chunks are objects in a bucket: one every 30 s keeps a day-long run at ~3000 of them.
LOG_FLUSH_SECONDS = 30.0
# How long a TensorFlow failure waits for the preemption notice that may explain it: the SIGTERM that stops a
# slice's runtimes reaches this process at the same moment, but its handler runs only once TF returns.
NOTICE_AFTER_FAILURE_SECONDS = 2.0


def read_spec(location: str, text: Optional[str] = None) -> RunSpec:
    """Parse the run spec ``text`` read from ``location`` (a local path or a gs:// URI); None reads it now."""
    if text is None:
        try:
            with tf.io.gfile.GFile(location) as src:
                text = src.read()
        except tf.errors.OpError as err:
            raise SpecError(f"cannot read the run spec {location}: {err.message}") from err
    return parse_spec(text)


def _stop_watch(paths: RunPaths, notice: PreemptionNotice) -> Callable[[], None]:
    """A heartbeat's look for the run's stop request in the store (``paths.stop``): once it is there, the notice
    is a stop, and the attempt saves at its next call boundary and ends the run STOPPED. The store is what the agent
    always reaches, so a stop is seen whether or not the Cloud TPU API answers (the node's delete, whose SIGTERM
    is the other way a stop arrives, waits on it)."""

    def asked() -> bool:
        return bool(tf.io.gfile.exists(paths.stop))

    def look() -> None:
        if not notice.requested() and asked():
            log.warning("a stop was asked for (%s): saving at the next call boundary, then ending", paths.stop)
            notice.stop("tpuops stop")

    notice.stop_asked = asked
    return look


def _start_logging(chunks: logging.Handler) -> None:
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(FORMATTER)
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in (console, chunks):
        log.addHandler(handler)


# Long: one agent process from its spec to its exit code, in the order it must happen (logging, the first
# status, the one except that classifies every failure, the final status, the wake-up, the exit); split, the
# failure and what the attempt keeps alive (then_exit) would be handed out and back between the parts.
def run(
    command: str,
    spec_location: str,
    attempt: Optional[int],
    notice: PreemptionNotice,
    then_exit: bool = False,
    fetched: Optional[Prefetch] = None,
) -> int:
    """Run ``command`` ("train" or "infer") for the spec at ``spec_location``; returns the exit code.

    ``fetched``: what was prefetched for this command and spec, if anything (module docstring).

    With ``then_exit`` the process ends with that code as soon as the status is final and the log
    shipped (``os._exit``), without tearing down the model, the input pipeline and TensorFlow:
    that takes seconds, and they are billed (a preempted VM until it stops, a finished run until
    its node is deleted). The failure, or what the command returned, is kept until then for the
    same reason: dropping it frees the attempt, and with it its input pipeline, before the status
    is written.
    """
    spec_text, status_text = fetched.texts() if fetched is not None else (None, None)
    try:
        spec = read_spec(spec_location, spec_text)
    except UserError as err:
        print(f"tpuops agent: {err}", file=sys.stderr)
        return ExitClass.USER_ERROR.code
    paths = RunPaths(spec.store_root, spec.run_id)
    chunks = ChunkedLogHandler(paths.logs)
    _start_logging(chunks)
    previous = Previous(paths.status, status_text)
    attempt = attempt or previous.attempt + 1
    if command == "train":
        status = Status(paths.status, spec.run_id, command, attempt, previous.evals, previous.reach, previous.attempts,
                        timed=spec.script is None)
    else:
        status = Status(paths.status, spec.run_id, command, attempt, attempts=previous.attempts)
    status.write()
    shipper = Ticker(LOG_FLUSH_SECONDS, [chunks.flush])
    tickers = [Ticker(spec.heartbeat_seconds, [status.write, _stop_watch(paths, notice)]), shipper]
    for ticker in tickers:
        ticker.start()
    # Also shipped at each checkpoint and at once on a stop or preemption notice (tpuops/agent/logs.py).
    status.on_checkpoint = shipper.now
    notice.on_notice(shipper.now)
    host = metadata_host()
    notice.watch_metadata(host)
    log.info("tpuops agent: %s run %s, attempt %d, pid %d", command, spec.run_id, attempt, os.getpid())
    exit_class, message, trace = ExitClass.SUCCEEDED, None, None
    failure: Optional[BaseException] = None
    kept: object = None
    try:
        if command == "train" and spec.script is not None:
            check_tensorflow()
            check_seed(spec.seed)  # the script gets it as TPUOPS_SEED
            script.run(spec, status, notice, paths, attempt)
        elif command == "train":
            kept = train.run(spec, connect(spec), status, notice, paths, fetched)
        else:
            infer.run(spec, connect(spec), status, notice, paths)
    except BaseException as exc:  # every way out is classified and reported
        failure = exc
        exit_class = classify(exc, entry.user_roots(spec))
        message = str(exc) if isinstance(exc, (UserError, DivergedExit, PreemptedExit)) else describe(exc)
        noticed = isinstance(exc, tf.errors.OpError) and notice.wait(NOTICE_AFTER_FAILURE_SECONDS)
        if preemption_caused(exit_class, exc, noticed):
            exit_class, message = ExitClass.PREEMPTED, f"preempted ({notice.reason}) while TensorFlow ran: {message}"
        if exit_class in (ExitClass.USER_ERROR, ExitClass.CRASHED):
            trace = traceback_tail(exc)
            log.error("%s: %s\n%s", exit_class.value, message, trace)
        elif exit_class is ExitClass.DIVERGED:
            log.error("%s: %s", exit_class.value, message)
        else:
            log.warning("%s: %s", exit_class.value, message)
    else:
        log.info("%s finished: %s", command, exit_class.value)
    status.finish(exit_class, message, trace)
    if exit_class in (ExitClass.PREEMPTED, ExitClass.STOPPED):  # saved: the control plane need not wait for a pass
        wake.wake(spec.store_root, spec.run_id, attempt, host)
    for ticker in tickers:
        ticker.stop()
    if then_exit:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_class.code)
    del failure, kept
    return exit_class.code
