"""Local file helpers shared by the stores and the dataset writer: crc32c and atomic replacement.

crc32c is reported the way Cloud Storage does (base64 of the 4 big-endian bytes) everywhere,
so a manifest, a listing and a local file can be compared as strings.
"""

from __future__ import annotations

import base64
import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import google_crc32c

from tpuops.core.errors import UsageError

COPY_CHUNK = 4 << 20


def digest_base64(checksum: google_crc32c.Checksum) -> str:
    return base64.b64encode(checksum.digest()).decode("ascii")


def crc32c_of_bytes(data: bytes) -> str:
    return digest_base64(google_crc32c.Checksum(data))


def crc32c_of_file(path: Path) -> str:
    """The crc32c of a local file. Raises OSError as is: the caller knows whose file it is."""
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as handle:
        while chunk := handle.read(COPY_CHUNK):
            checksum.update(chunk)
    return digest_base64(checksum)


def _temp_path_for(path: Path) -> Path:
    """A hidden, unique sibling of ``path`` (same directory, so ``os.replace`` is atomic)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def write_atomically(path: Path, fill: Callable[[IO[bytes]], object]) -> None:
    """Create or replace ``path`` with what ``fill`` writes: temp file, fsync, rename, fsync the folder.

    A reader sees the old file or the whole new one. On any failure the temp file is removed
    and ``path`` is untouched. Exceptions raised by ``fill`` propagate unchanged.

    Raises:
        UsageError: the destination cannot be written (missing folder, permissions, disk full).
    """
    tmp = _temp_path_for(path)
    try:
        handle = open(tmp, "wb")  # noqa: SIM115 - closed below; only our own file errors are mapped
    except OSError as err:
        raise UsageError(f"{path}: cannot write: {err.strerror or err}") from err
    try:
        with handle:
            fill(handle)
            _durable(handle, path)
        try:
            os.replace(tmp, path)
        except OSError as err:
            raise UsageError(f"{path}: cannot write: {err.strerror or err}") from err
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _durable(handle: IO[bytes], path: Path) -> None:
    try:
        handle.flush()
        os.fsync(handle.fileno())
    except OSError as err:
        raise UsageError(f"{path}: cannot write: {err.strerror or err}") from err


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: some filesystems refuse directory fsync)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def open_for_reading(path: Path) -> Iterator[IO[bytes]]:
    """Open a user-supplied local file; a failure to open it is a ``UsageError`` naming it."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as err:
        raise UsageError(f"{path}: cannot read: {err.strerror or err}") from err
    with handle:
        yield handle
