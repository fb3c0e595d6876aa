"""Log lines shipped to the store as numbered chunks: ``runs/<run>/logs/NNNNNN.log``.

A bucket cannot append to an object, so the agent buffers lines and writes each chunk whole
(``paths.write_whole``) every ``job.LOG_FLUSH_SECONDS``, when the buffer grows past
``CHUNK_BYTES`` and at exit. Contract for readers (the control plane's ``tpuops logs``):

* list ``logs/*.log`` and sort by name: six-digit zero-padded numbers, so name order is write
  order, across attempts too (a new attempt continues after the highest number it finds);
* a chunk that is listed is complete and never changes, so tailing means remembering the last
  name read and reading the names after it;
* each chunk holds whole lines, each ``<UTC ISO time> <LEVEL> <message>``.
"""

import logging
import re
import threading
from datetime import datetime, timezone
from typing import List

import tensorflow as tf

from tpuops.agent.paths import join, write_whole

CHUNK_BYTES = 256 * 1024
_CHUNK_NAME = re.compile(r"^(\d{6})\.log$")


class _UtcFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: object = None) -> str:
        return datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")


FORMATTER = _UtcFormatter("%(asctime)s %(levelname)s %(message)s")


def next_chunk_number(logs_dir: str) -> int:
    """One more than the highest chunk number already in ``logs_dir`` (1 when there is none)."""
    numbers = [0]
    if tf.io.gfile.isdir(logs_dir):
        for name in tf.io.gfile.listdir(logs_dir):
            match = _CHUNK_NAME.match(name)
            if match:
                numbers.append(int(match.group(1)))
    return max(numbers) + 1


class ChunkedLogHandler(logging.Handler):
    """A logging handler that collects lines and writes them to the store in whole chunks."""

    def __init__(self, logs_dir: str) -> None:
        super().__init__()
        self.setFormatter(FORMATTER)
        self._dir = logs_dir
        tf.io.gfile.makedirs(logs_dir)
        self._number = next_chunk_number(logs_dir)
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
            write_whole(join(self._dir, f"{self._number:06d}.log"), "".join(lines))
            self._number += 1
