"""Write a dataset's records into TFRecord shards in one folder, all or nothing.

Shards are written as hidden temp files (``.shard-00003.<run>.tmp``), each flushed and fsynced
when it is full. ``finish`` renames them to ``shard-00003-of-00010.tfrecord`` (the total is
known only at the end when sharding by size); ``discard`` removes every file this run
created, temp or renamed. So a failed or interrupted conversion leaves no shard that a
later manifest could be confused with, and a killed one leaves only hidden temp files,
which the next run removes (``remove_stale_temp_files``).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tpuops.core.errors import UsageError
from tpuops.data import tfrecord
from tpuops.data.manifest import Shard
from tpuops.store.files import fsync_dir

_TEMP_GLOB = ".shard-*.tmp"


def shard_name(index: int, total: int) -> str:
    return f"shard-{index:05d}-of-{total:05d}.tfrecord"


def even_counts(records: int, shards: int) -> list[int]:
    """Split ``records`` into ``shards`` counts that differ by at most one."""
    return [(i + 1) * records // shards - i * records // shards for i in range(shards)]


def remove_stale_temp_files(folder: Path) -> None:
    """Remove temp shards left by a conversion that was killed."""
    for path in folder.glob(_TEMP_GLOB):
        path.unlink(missing_ok=True)


@dataclass
class _Written:
    temp: Path
    records: int
    bytes: int
    crc32c: str


class ShardCutter:
    """Cut records into shards by count (``counts``) or by size (``max_bytes``).

    By size, a shard holds at least one record and otherwise stays within ``max_bytes``.
    """

    def __init__(self, folder: Path, *, counts: list[int] | None = None, max_bytes: int | None = None) -> None:
        if (counts is None) == (max_bytes is None):
            raise ValueError("give exactly one of counts and max_bytes")
        self._folder = folder
        self._counts = counts
        self._max_bytes = max_bytes
        self._run = uuid.uuid4().hex[:8]
        self._written: list[_Written] = []
        self._final: list[Path] = []
        self._handle: IO[bytes] | None = None
        self._writer: tfrecord.TFRecordWriter | None = None
        self._temp: Path | None = None

    def write(self, record: bytes) -> None:
        writer = self._writer
        if writer is None or self._full(writer, record):
            self._close_current()
            writer = self._open_next()
        try:
            writer.write(record)
        except OSError as err:
            raise UsageError(f"{self._temp}: cannot write: {err.strerror or err}") from err

    def finish(self) -> list[Shard]:
        """Close the last shard and give every shard its final name; returns them in order."""
        self._close_current()
        total = len(self._written)
        shards = []
        for index, written in enumerate(self._written):
            final = self._folder / shard_name(index, total)
            os.replace(written.temp, final)
            self._final.append(final)
            shards.append(Shard(name=final.name, records=written.records, bytes=written.bytes,
                                crc32c=written.crc32c))
        fsync_dir(self._folder)
        return shards

    def discard(self) -> None:
        """Remove everything this run wrote."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        paths = [w.temp for w in self._written] + self._final + ([self._temp] if self._temp else [])
        for path in paths:
            path.unlink(missing_ok=True)

    def _full(self, writer: tfrecord.TFRecordWriter, record: bytes) -> bool:
        if self._counts is not None:
            index = len(self._written)
            return writer.records >= self._counts[index] and index + 1 < len(self._counts)
        assert self._max_bytes is not None
        return writer.records > 0 and writer.bytes + tfrecord.framed_size(record) > self._max_bytes

    def _open_next(self) -> tfrecord.TFRecordWriter:
        self._temp = self._folder / f".shard-{len(self._written):05d}.{self._run}.tmp"
        try:
            self._handle = open(self._temp, "wb")  # noqa: SIM115 - closed in _close_current or discard
        except OSError as err:
            raise UsageError(f"{self._temp.parent}: cannot write: {err.strerror or err}") from err
        self._writer = tfrecord.TFRecordWriter(self._handle)
        return self._writer

    def _close_current(self) -> None:
        if self._writer is None or self._handle is None or self._temp is None:
            return
        try:
            self._writer.close()
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as err:
            raise UsageError(f"{self._temp}: cannot write: {err.strerror or err}") from err
        finally:
            self._handle.close()
            self._handle = None
        self._written.append(_Written(self._temp, self._writer.records, self._writer.bytes, self._writer.crc32c))
        self._writer = None
        self._temp = None
