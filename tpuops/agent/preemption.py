"""The preemption notice: SIGTERM or the metadata server's ``instance/preempted`` turning TRUE.

A preempted TPU VM gets about 30 s between the notice and the power cut. Neither source may do
real work when it fires: the signal handler and the watcher thread only set a flag, and the
training loop checks the flag at every call boundary, writes a checkpoint there and exits
with the "preempted" class. That keeps checkpoint writes on the main thread, never racing the
step that is running.

This module imports nothing but the standard library so that ``__main__`` can install the
handler before the slow TensorFlow import.
"""

import logging
import os
import signal
import threading
import time
import urllib.request
from typing import Any, Callable, List, Optional

log = logging.getLogger(__name__)

METADATA_PATH = "/computeMetadata/v1/instance/preempted"
_GCE_PRODUCT_FILE = "/sys/class/dmi/id/product_name"
# The metadata server holds a wait_for_change request up to timeout_sec; the socket timeout
# must be longer, and a server that answers at once must not be polled in a tight loop.
_WAIT_SECONDS = 60
_MIN_POLL_SECONDS = 1.0


def metadata_host() -> Optional[str]:
    """The metadata server to watch: GCE_METADATA_HOST, else the real one on a GCE machine.

    Off GCE (a laptop, CI) there is none: the agent must not send traffic to
    metadata.google.internal from a machine that is not a Google VM.
    """
    host = os.environ.get("GCE_METADATA_HOST")
    if host:
        return host
    try:
        with open(_GCE_PRODUCT_FILE) as product:
            on_gce = "Google" in product.read()
    except OSError:
        on_gce = False
    return "metadata.google.internal" if on_gce else None


class PreemptionNotice:
    """A flag raised once by SIGTERM or by the metadata watcher; read by the loops."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: Optional[str] = None
        self._on_notice: List[Callable[[], None]] = []
        self._stopped = False
        self.stop_asked: Optional[Callable[[], bool]] = None
        """Whether the run's stop request is in the store (``job`` sets it): a SIGTERM that a stop's node delete
        sent is the stop's, not a preemption's."""

    def on_notice(self, action: Callable[[], None]) -> None:
        """Call ``action`` when the notice comes (at once if it came already). It runs where the notice is
        raised, a signal handler included, so it may only set a flag (``status.Ticker.now``): the log is
        shipped by the thread that ships it, before the checkpoint the notice asks for is written."""
        self._on_notice.append(action)
        if self._event.is_set():
            action()

    def install_signal_handler(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.trigger(f"signal {signal.Signals(signum).name}")

    def trigger(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()
            for action in self._on_notice:
                action()

    def stop(self, reason: str) -> None:
        """A stop was asked for (``job`` looks for the run's ``stop.json`` in the store at every heartbeat)."""
        if not self._event.is_set():
            self._stopped = True
        self.trigger(reason)

    @property
    def stopped(self) -> bool:
        """The notice is a stop someone asked for (the run's ``stop.json``), not a preemption: the attempt still
        saves at the next call boundary, and then ends the run (``exits.StoppedExit``). A notice that came as a
        signal asks the store once (``stop_asked``): the controller honouring a stop deletes the node, whose
        SIGTERM may come before the agent's own look; a store that cannot be read leaves it a preemption."""
        if not self._stopped and self._event.is_set() and self.stop_asked is not None:
            asked, self.stop_asked = self.stop_asked, None
            try:
                self._stopped = bool(asked())
                if self._stopped:
                    self.reason = f"tpuops stop, its node deleted: {self.reason}"
            except Exception:  # the store is out of reach: recovered as a preemption, as before
                log.warning("could not look for the run's stop request", exc_info=True)
        return self._stopped

    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def watch_metadata(self, host: Optional[str]) -> Optional[threading.Thread]:
        """Start the daemon thread that long-polls ``instance/preempted``; None when no host."""
        if not host:
            return None
        thread = threading.Thread(target=self._watch, args=(host,), name="tpuops-preempted", daemon=True)
        thread.start()
        return thread

    def _watch(self, host: str) -> None:
        url = f"http://{host}{METADATA_PATH}"
        etag = None
        while not self._event.is_set():
            started = time.monotonic()
            query = "" if etag is None else f"?wait_for_change=true&timeout_sec={_WAIT_SECONDS}&last_etag={etag}"
            try:
                request = urllib.request.Request(url + query, headers={"Metadata-Flavor": "Google"})
                with urllib.request.urlopen(request, timeout=_WAIT_SECONDS + 10) as response:
                    value = response.read().decode("utf-8", "replace").strip()
                    etag = response.headers.get("ETag") or "NONE"
            except OSError as err:
                log.debug("metadata watch: %s", err)
                value = ""
            if value.upper() == "TRUE":
                log.warning("metadata server says instance/preempted=TRUE")
                self.trigger("metadata instance/preempted")
                return
            self._event.wait(max(0.0, _MIN_POLL_SECONDS - (time.monotonic() - started)))
