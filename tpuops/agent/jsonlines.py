"""The prediction shards' JSON Lines text, made in this process or in a low-priority child process.

``format_lines`` is the format: one ``{"index": i, "output": [...]}`` line per row, exactly the
text ``json.dumps`` gives row by row (CPython's shortest round-trip float repr, byte for byte;
resumed jobs write byte-identical shards).

``Formatter`` runs ``format_lines`` in a child process (``python -m tpuops.agent.jsonlines``)
at a lower CPU priority (``NICE``). At batch 64 on the CPU the text of a batch (640 float reprs)
costs ~0.3 ms of CPU, a tenth of the batch's prediction; made by a thread of the predicting
process it holds the GIL the loop needs and takes a core from the model's kernels while the next
batch is predicted. The child takes neither: the GIL is not shared, and at the lower priority it
runs when a core would otherwise idle. It stays fed because the writer thread waits for each
reply: when the child falls behind, the writer's bounded queue fills and the loop waits
(back-pressure), so nothing grows without bound.

Protocol over the child's stdin/stdout, one request and one reply at a time:

* request: a header ``struct HEADER`` (first index, number of dimensions), the dimensions
  (``int64`` each), then the rows as little-endian float32 bytes;
* reply: the text's length (``uint64``), then the text as UTF-8.

The child exits on end of input, and only then: it ignores SIGTERM and SIGINT, which a
preemption sends to the whole process group while the agent still has queued shards to finish.
Any error in it ends it with a non-zero code (its traceback goes to the agent's stderr), which
the parent reports as ``FormatterError`` on the next request.
This module imports only the standard library and numpy: the child must not load TensorFlow.
"""

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
from typing import BinaryIO, Optional

import numpy as np

# Niceness of the child against the agent's: low enough that the model's kernels take the cores
# first, high enough to keep up (nice 10 gets ~1/10 of a contended core; a batch's text is ~1/10).
NICE = 10
HEADER = struct.Struct("<qq")
LENGTH = struct.Struct("<Q")
DIMENSION = struct.Struct("<q")
_ENCODE = json.JSONEncoder().encode


class FormatterError(RuntimeError):
    """The formatter process died or answered out of protocol."""


def format_lines(first_index: int, rows: np.ndarray) -> str:
    """JSON Lines for ``rows`` numbered from ``first_index``: the text ``json.dumps`` gives row by row, faster."""
    if rows.ndim == 2 and rows.size:
        # One encoder call for the whole batch: the rows of a 2-D float array hold only numbers,
        # so "], [" is exactly what separates them.
        template, values = '{"index": %d, "output": [%s]}\n', _ENCODE(rows.tolist())[2:-2].split("], [")
    else:
        template, values = '{"index": %d, "output": %s}\n', [_ENCODE(row) for row in rows.tolist()]
    return "".join([template % (first_index + i, value) for i, value in enumerate(values)])


def _read(stream: BinaryIO, size: int) -> Optional[bytes]:
    """``size`` bytes, or None if the stream ends before them."""
    data = b""
    while len(data) < size:
        more = stream.read(size - len(data))
        if not more:
            return None
        data += more
    return data


def _need(stream: BinaryIO, size: int) -> bytes:
    data = _read(stream, size)
    if data is None:
        raise EOFError(f"the input ended inside a message of {size} bytes")
    return data


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Answer requests until the input ends between two of them (the child's main loop)."""
    while True:
        header = _read(requests, HEADER.size)
        if header is None:
            return
        first_index, ndim = HEADER.unpack(header)
        shape = [DIMENSION.unpack(_need(requests, DIMENSION.size))[0] for _ in range(ndim)]
        rows = np.frombuffer(_need(requests, 4 * int(np.prod(shape, dtype=np.int64))), dtype="<f4").reshape(shape)
        text = format_lines(first_index, rows).encode()
        replies.write(LENGTH.pack(len(text)) + text)
        replies.flush()


class Formatter:
    """``format_lines`` in a child process at niceness +``nice``; one caller thread at a time.

    ``close`` ends the child (end of input) and waits for it; a dead child raises
    ``FormatterError`` from ``format``. The child also ends when this process dies (its stdin closes).
    """

    def __init__(self, nice: int = NICE) -> None:
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tpuops.agent.jsonlines", str(nice)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    def format(self, first_index: int, rows: np.ndarray) -> str:
        """What ``format_lines(first_index, rows)`` gives for float32 ``rows``, made by the child."""
        rows = np.ascontiguousarray(rows, dtype="<f4")
        request = HEADER.pack(first_index, rows.ndim) + b"".join(DIMENSION.pack(n) for n in rows.shape)
        try:
            self._process.stdin.write(request + rows.tobytes())
            self._process.stdin.flush()
            length = _read(self._process.stdout, LENGTH.size)
            text = None if length is None else _read(self._process.stdout, LENGTH.unpack(length)[0])
        except OSError as err:  # a broken pipe: the child is gone
            raise self._died() from err
        if text is None:
            raise self._died()
        return text.decode()

    def _died(self) -> FormatterError:
        code = self._process.wait()
        return FormatterError(f"the JSON Lines formatter process (pid {self._process.pid}) exited with code {code}")

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a broken pipe: the child is gone already, wait() reaps it
            self._process.stdin.close()
        self._process.wait()
        self._process.stdout.close()


def _main() -> None:
    # A preemption's SIGTERM (or a Ctrl-C) reaches the whole process group; the agent handles it
    # by finishing the queued shards, which needs this process: it ends when its input does.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(int(sys.argv[1]) if len(sys.argv) > 1 else NICE)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    _main()
