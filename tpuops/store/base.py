"""The ``Store`` contract: the one interface over the store root (docs/design.md, "The store is the message bus").

A store is a flat namespace of objects named by keys relative to its root URI
(``runs/r1/status.json``), like Cloud Storage. Keys are '/'-separated, non-empty, without
'.' or '..' segments, leading or trailing '/', or a first segment starting with ``.tpuops``
(reserved for the local store's bookkeeping).

Every object has a *generation*: a positive integer that changes on every write of that key,
so compare-and-swap on it (``write_if_generation_match``) is how controllers take leases and
move run state without losing updates. Generation 0 means "the object does not exist".

Checksums are crc32c in Cloud Storage's form (base64 of the 4 big-endian bytes), so one
manifest can be checked against either implementation.

Implementations convert their own failures into ``tpuops.core.errors`` (plus the two classes
below) and retry transient ones themselves; callers never see an SDK or OS exception for a
failure of the store. All methods are safe to call from several threads. A store pickles (so
what holds one, such as a sweep's journal, crosses to another process): the copy reaches the same
objects through connections of its own.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tpuops.core.errors import NotFound, UsageError

ProgressFn = Callable[[int], None]
"""Called with the bytes of the current attempt sent so far; it restarts at 0 when an attempt is retried."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one object."""

    key: str
    size: int
    crc32c: str
    generation: int


class Store(abc.ABC):
    """Objects under one root URI. See the module docstring for keys, generations and errors."""

    concurrent_reads: ClassVar[bool] = True
    """Whether reading many objects from several threads beats reading them one after another: a remote store's
    round trips overlap; a local directory's reads are the CPU's own work, which threads only contend for."""

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """The root URI, e.g. ``gs://bucket/prefix`` or ``/abs/path``."""

    def uri_of(self, key: str) -> str:
        """The full URI of ``key`` (for messages and for readers such as ``tf.io.gfile``)."""
        return uri_under(self.uri, key)

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size, crc32c and generation of one object.

        Raises:
            NotFound: no object has this key.
        """

    @abc.abstractmethod
    def read_versioned(self, key: str) -> tuple[bytes, int]:
        """The object's bytes and the generation those bytes belong to (read together, consistently).

        Raises:
            NotFound: no object has this key.
        """

    @abc.abstractmethod
    def write_bytes(self, key: str, data: bytes) -> int:
        """Create or replace an object atomically; returns its new generation.

        Readers see the old bytes or the new bytes, never a prefix of either.
        """

    @abc.abstractmethod
    def write_if_generation_match(self, key: str, data: bytes, generation: int) -> int:
        """Write only if the object's current generation is ``generation`` (0: only if absent).

        Of several writers that pass the same ``generation``, exactly one succeeds.

        Returns:
            The new generation.
        Raises:
            PreconditionFailed: the object's generation differs (it exists, is gone, or changed).
        """

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a string prefix, recursive), sorted by key."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object. Deleting an absent key is not an error (delete is idempotent)."""

    @abc.abstractmethod
    def upload_file(
        self,
        path: Path,
        key: str,
        *,
        expected_crc32c: str | None = None,
        progress: ProgressFn | None = None,
    ) -> ObjectInfo:
        """Copy a local file into the store, in chunks for large files, verified end to end.

        The local file's crc32c is computed first and must equal ``expected_crc32c`` when given;
        the stored object's crc32c must equal it afterwards. A failed attempt is retried from
        the start of the file; readers never see a partial object.

        Raises:
            IntegrityError: the local file does not match ``expected_crc32c``.
            UsageError: the local file cannot be read.
        """

    @abc.abstractmethod
    def download_file(self, key: str, path: Path) -> ObjectInfo:
        """Copy an object to a local file (atomically: temp file, then rename), verified by crc32c.

        Raises:
            NotFound: no object has this key.
        """

    def location(self) -> str | None:
        """Where the data lives (a Cloud Storage location such as ``US-CENTRAL1``); None if not in a cloud."""
        return None

    def read_bytes(self, key: str) -> bytes:
        """The object's bytes. Raises NotFound if absent."""
        return self.read_versioned(key)[0]

    def exists(self, key: str) -> bool:
        return self.generation_of(key) != 0

    def generation_of(self, key: str) -> int:
        """The current generation, 0 if the object does not exist (ready for ``write_if_generation_match``)."""
        try:
            return self.stat(key).generation
        except NotFound:
            return 0


def uri_under(root: str, key: str) -> str:
    """The URI of ``key`` in the store at ``root``, for those who hold a store's URI but not the store."""
    return f"{root.rstrip('/')}/{check_key(key)}"


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid object key (see the module docstring), else raise UsageError."""
    parts = key.split("/")
    if not key or any(part in ("", ".", "..") for part in parts) or parts[0].startswith(".tpuops"):
        raise UsageError(f"{key!r} is not a valid store key (expected e.g. 'runs/r1/status.json')")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is empty or a valid key prefix (it may end with '/')."""
    if prefix:
        check_key(prefix.removesuffix("/"))
    return prefix
