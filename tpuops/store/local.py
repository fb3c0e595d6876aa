"""``LocalStore``: the store root as a plain directory (provider=local, and the agent's ``tf.io.gfile`` view).

Invariants:

- An object is the regular file ``<root>/<key>``; it is only ever replaced whole, by writing a
  temp file under ``<root>/.tpuops/tmp`` (same filesystem), fsyncing it and ``os.replace``-ing
  it into place, so readers see old or new bytes, never a prefix.
- An object's generation is its ``st_mtime_ns``. Every write through this class sets it
  explicitly to ``max(now, previous + 1)`` (read back, since some filesystems round), so it
  strictly increases per key even within one clock tick. Files written by others (the
  agent) simply have their own mtime as generation.
- Writes, compare-and-swap and deletes hold an exclusive ``fcntl.flock`` on
  ``<root>/.tpuops/lock`` around "check generation, stamp, rename", which makes CAS correct
  across threads and processes; the slow part (copying bytes) happens before taking it.
  Reads take no lock: they read from one open file descriptor and ``fstat`` it, so bytes
  and generation belong to the same version.
- crc32c is computed by reading the file, and cached per (path, inode, size, mtime).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import stat as stat_mod
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

import google_crc32c

from tpuops.core.errors import IntegrityError, NotFound, PermissionDenied, PreconditionFailed, TpuopsError
from tpuops.store.base import (
    ObjectInfo,
    ProgressFn,
    Store,
    check_key,
    check_prefix,
)
from tpuops.store.files import COPY_CHUNK, crc32c_of_file, digest_base64, open_for_reading, write_atomically

_BOOKKEEPING = ".tpuops"
_CRC_CACHE_MAX = 10_000
_STAMP_STEPS_NS = (1, 1_000, 1_000_000, 1_000_000_000, 2_000_000_000)


class LocalStore(Store):
    """A store in a local directory. See the module docstring for the invariants."""

    concurrent_reads: ClassVar[bool] = False

    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self._root = Path(root).absolute()
        # Objects and temp files are named by string: building a Path cost a third of a local write or read.
        self._prefix = f"{self._root}{os.sep}"
        self._tmp = self._root / _BOOKKEEPING / "tmp"
        self._tmp_prefix = f"{self._tmp}{os.sep}"
        self._lock = self._root / _BOOKKEEPING / "lock"
        self._durable = durable
        """fsync every write; a simulation's scratch store (``tpuops.sim``), gone with its process, skips it."""
        self._crc_cache: dict[tuple[str, int, int, int], str] = {}
        self._crc_lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return LocalStore, (self._root,), {"_durable": self._durable}

    @property
    def uri(self) -> str:
        return str(self._root)

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        with _os_errors(self.uri_of(key)):
            st = _stat_file(path, self.uri_of(key))
            return ObjectInfo(key, st.st_size, self._crc(path, st), st.st_mtime_ns)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        # The object's URI is named only for an error: a listing reads hundreds of documents, most reads succeed.
        where = functools.partial(self.uri_of, key)
        with _os_errors(where), _open_object(self._path(key), where) as handle:
            st = os.fstat(handle.fileno())
            return handle.read(), st.st_mtime_ns

    def write_bytes(self, key: str, data: bytes) -> int:
        return self._publish(key, lambda handle: handle.write(data), expected=None)

    def write_if_generation_match(self, key: str, data: bytes, generation: int) -> int:
        return self._publish(key, lambda handle: handle.write(data), expected=generation)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        found: list[ObjectInfo] = []
        with _os_errors(self.uri):
            for path, key in _walk_files(self._prefix, prefix.rpartition("/")[0]):
                if key.startswith(prefix) and not key.startswith(_BOOKKEEPING):
                    with contextlib.suppress(FileNotFoundError):
                        st = os.stat(path)
                        found.append(ObjectInfo(key, st.st_size, self._crc(path, st), st.st_mtime_ns))
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with _os_errors(self.uri_of(key)), self._locked(), contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def upload_file(
        self,
        path: Path,
        key: str,
        *,
        expected_crc32c: str | None = None,
        progress: ProgressFn | None = None,
    ) -> ObjectInfo:
        checksum = google_crc32c.Checksum()
        size = 0

        def copy(handle: IO[bytes]) -> None:
            nonlocal size
            with open_for_reading(path) as source:
                while chunk := source.read(COPY_CHUNK):
                    checksum.update(chunk)
                    handle.write(chunk)
                    size += len(chunk)
                    if progress is not None:
                        progress(size)
            actual = digest_base64(checksum)
            if expected_crc32c is not None and actual != expected_crc32c:
                raise IntegrityError(
                    f"{path}: crc32c is {actual}, expected {expected_crc32c} (the file changed since "
                    "its manifest was written)"
                )

        generation = self._publish(key, copy, expected=None)
        return ObjectInfo(key, size, digest_base64(checksum), generation)

    def download_file(self, key: str, path: Path) -> ObjectInfo:
        where = self.uri_of(key)
        checksum = google_crc32c.Checksum()
        with _os_errors(where), _open_object(self._path(key), where) as source:
            st = os.fstat(source.fileno())

            def copy(target: IO[bytes]) -> None:
                while chunk := source.read(COPY_CHUNK):
                    checksum.update(chunk)
                    target.write(chunk)

            write_atomically(Path(path), copy)
        return ObjectInfo(key, st.st_size, digest_base64(checksum), st.st_mtime_ns)

    def _path(self, key: str) -> str:
        return f"{self._prefix}{check_key(key)}"

    def _crc(self, path: str, st: os.stat_result) -> str:
        cache_key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._crc_lock:
            cached = self._crc_cache.get(cache_key)
        if cached is None:
            cached = crc32c_of_file(Path(path))
            with self._crc_lock:
                if len(self._crc_cache) >= _CRC_CACHE_MAX:
                    self._crc_cache.clear()
                self._crc_cache[cache_key] = cached
        return cached

    def _publish(self, key: str, fill: Callable[[IO[bytes]], object], expected: int | None) -> int:
        """Write a temp file with ``fill``, then (under the lock) check ``expected``, stamp and rename.

        Folders are made only when a call finds one missing (``_making``): a write costs no mkdir once they exist.
        """
        target = self._path(key)
        where = self.uri_of(key)
        tmp = f"{self._tmp_prefix}{uuid.uuid4().hex}.tmp"
        with _os_errors(where):
            placed = False
            try:
                with _making(self._tmp, lambda: open(tmp, "wb")) as handle:
                    fill(handle)
                    handle.flush()
                    if self._durable:
                        os.fsync(handle.fileno())
                with self._locked():
                    current = _generation(target)
                    if expected is not None and current != expected:
                        raise PreconditionFailed(
                            f"{where}: generation is {current}, expected {expected} (someone else wrote it)"
                        )
                    generation = _stamp(tmp, current, where)
                    _making(os.path.dirname(target), lambda: os.replace(tmp, target))
                    placed = True
                return generation
            finally:
                if not placed:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with _making(self._lock.parent, lambda: open(self._lock, "a+b")) as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


T = TypeVar("T")


def _making(folder: Path | str, act: Callable[[], T]) -> T:
    """``act()``, which creates a file in ``folder``; the folder (and its parents) made first if it is missing."""
    try:
        return act()
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)
        return act()


def _generation(path: str) -> int:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return 0
    return st.st_mtime_ns if stat_mod.S_ISREG(st.st_mode) else 0


def _stamp(tmp: str, previous: int, where: str) -> int:
    """Set the temp file's mtime to a generation greater than ``previous`` and return what was stored."""
    for step in _STAMP_STEPS_NS:
        wanted = max(time.time_ns(), previous + step)
        os.utime(tmp, ns=(wanted, wanted))
        stored = os.stat(tmp).st_mtime_ns
        if stored > previous:
            return stored
    raise TpuopsError(f"{where}: the filesystem does not keep modification times precisely enough")


def _stat_file(path: str, where: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise NotFound(f"{where}: no such object") from None
    if not stat_mod.S_ISREG(st.st_mode):
        raise NotFound(f"{where}: no such object")
    return st


@contextlib.contextmanager
def _open_object(path: str, where: str | Callable[[], str]) -> Iterator[IO[bytes]]:
    try:
        handle = open(path, "rb")  # noqa: SIM115 - a context manager that maps errors
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise NotFound(f"{_named(where)}: no such object") from None
    with handle:
        yield handle


def _walk_files(root: str, under: str) -> Iterator[tuple[str, str]]:
    """(path, key) of every file under the folder ``under`` (a key's folder, "" for all) of the store at ``root``
    (its path with a trailing separator)."""
    for folder, _, files in os.walk(os.path.normpath(f"{root}{under}")):  # the root's own folder without its "/"
        base = folder[len(root):].replace(os.sep, "/")
        for name in files:
            yield f"{folder}{os.sep}{name}", f"{base}/{name}" if base else name


@contextlib.contextmanager
def _os_errors(where: str | Callable[[], str]) -> Iterator[None]:
    """Turn OS errors of the store's own files into the taxonomy (source-file errors are mapped by callers)."""
    try:
        yield
    except PermissionError as err:
        raise PermissionDenied(f"{_named(where)}: permission denied ({err.filename})") from err
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise NotFound(f"{_named(where)}: no such object") from err
        raise TpuopsError(f"{_named(where)}: {err.strerror or err}") from err


def _named(where: str | Callable[[], str]) -> str:
    """The object's URI for a message: given, or made now (``where`` a callable) by a hot path that errs rarely."""
    return where if isinstance(where, str) else where()
