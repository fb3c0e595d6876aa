"""Log lines shipped to the store as chunks: ``runs/<run>/logs/<writer>-NNNNNN.log``.

A bucket cannot append to an object, so the agent buffers lines and writes each chunk whole
(``paths.write_whole``) every ``job.LOG_FLUSH_SECONDS``, when the buffer grows past
``CHUNK_BYTES``, at each checkpoint, as soon as a stop or preemption notice comes (before the
checkpoint it asks for: a VM stopped or deleted may be killed before the agent's normal exit) and
at exit. Contract for readers (the control plane's ``tpuops logs``):

* list ``logs/*.log`` and sort by name: ``<writer>`` is the writing process's start time
  (``%Y%m%dT%H%M%S%fZ``, UTC) and ``NNNNNN`` its chunk number from 1, so name order is write order,
  across attempts too; a slice's worker N >= 1 ships its own log the same way under ``logs/w<N>/``
  (``templates/ship_log.py``);
* every writer names only its own chunks: two attempts that overlap (an attempt still shipping its
  last lines while the next one starts) never write the same name, so no chunk is ever written over
  (numbering by listing what is there did that: both took the next free number);
* a chunk that is listed is complete and never changes, so tailing means remembering the names read
  and reading the others (a late last chunk of an earlier attempt sorts before names already read);
* each chunk holds whole lines, each ``<UTC ISO time> <LEVEL> <message>``. Chunks named ``NNNNNN.log``
  (the numbering before writers: below 200000, 70 days of 30-s chunks) sort before every writer's.
"""

import logging
import threading
from datetime import datetime, timezone
from typing import List

import tensorflow as tf

from tpuops.agent.paths import join, write_whole

CHUNK_BYTES = 256 * 1024


class _UtcFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: object = None) -> str:
        return datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")


FORMATTER = _UtcFormatter("%(asctime)s %(levelname)s %(message)s")


class ChunkedLogHandler(logging.Handler):
    """A logging handler that collects lines and writes them to the store in whole chunks."""

    def __init__(self, logs_dir: str) -> None:
        super().__init__()
        self.setFormatter(FORMATTER)
        self._dir = logs_dir
        tf.io.gfile.makedirs(logs_dir)
        self._writer = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        self._number = 1
        self._lines: List[str] = []
        self._size = 0
        # emit() runs under Handler.lock; the upload runs under _write_lock so that a slow
        # store never blocks the threads that log, and chunks are numbered in write order.
        self._write_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record) + "\n"
        self._lines.append(line)
        self._size += len(line)
        if self._size >= CHUNK_BYTES:
            threading.Thread(target=self.flush, daemon=True).start()

    def flush(self) -> None:
        """Write the buffered lines as the next chunk; nothing is written when there are none."""
        with self._write_lock:
            self.acquire()
            try:
                lines, self._lines, self._size = self._lines, [], 0
            finally:
                self.release()
            if not lines:
                return
            try:
                write_whole(join(self._dir, f"{self._writer}-{self._number:06d}.log"), "".join(lines))
            except Exception:  # the lines stay, first, for the next flush: a flaky store loses none
                self.acquire()
                try:
                    self._lines[:0] = lines
                    self._size += sum(len(line) for line in lines)
                finally:
                    self.release()
                raise
            self._number += 1
