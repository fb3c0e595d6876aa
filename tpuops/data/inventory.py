"""Datasets in a store: ``verify`` one against its manifest, ``ls`` the ones under a root.

``ls`` trusts what a listing says about objects (size, crc32c as computed by the store) and
what ``manifest.json`` says they should be; nothing is downloaded but manifests.

``verify`` also reads every shard whose listing matches and frames each record (length, its
crc32c, data, its crc32c: ``tpuops.data.tfrecord.read_records``), counting them against the manifest.
A whole-shard checksum only says the bytes are the ones the manifest was made from; a shard
written with a corrupt or truncated record, and a manifest made from it, agree with each other
and would still fail TensorFlow's reader (``DataLossError``) on a billed node.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tpuops.core.errors import IntegrityError, NotFound, UsageError
from tpuops.data.manifest import MANIFEST, Manifest, Shard, parse_manifest
from tpuops.data.tfrecord import read_records
from tpuops.data.upload import Transfer
from tpuops.store.base import ObjectInfo, ProgressFn, Store

ProgressCallback = Callable[[int, int], None]
"""``progress(bytes_read, bytes_to_read)``, called from worker threads as shards are framed."""

DEFAULT_WORKERS = 4


@dataclass(frozen=True)
class Problem:
    name: str
    reason: str


@dataclass(frozen=True)
class VerifyReport:
    uri: str
    records: int
    shards: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "ok": self.ok,
            "records": self.records,
            "shards": self.shards,
            "problems": [{"name": p.name, "reason": p.reason} for p in self.problems],
        }


def verify(store: Store, *, workers: int = DEFAULT_WORKERS, progress: ProgressCallback | None = None) -> VerifyReport:
    """Check every shard the manifest lists: present, same size, same crc32c, then every record framed.

    A shard whose listing matches is downloaded (``workers`` at a time, into a temporary folder,
    one file per worker at a time) and read record by record: each record's length and data
    checksums, no bytes past the last record, and as many records as the manifest says. A
    problem names the shard and, for a bad record, its number and byte offset.

    Raises:
        NotFound: no manifest (not a dataset, or its upload never finished).
        UsageError: the manifest is not valid.
    """
    manifest = read_manifest(store)
    objects = {info.key: info for info in store.list()}
    listed = _problems(manifest, objects, prefix="")
    bad = {problem.name for problem in listed}
    framed = _record_problems(store, [s for s in manifest.shards if s.name not in bad], workers, progress)
    order = {shard.name: index for index, shard in enumerate(manifest.shards)}
    problems = tuple(sorted(listed + framed, key=lambda problem: order[problem.name]))
    return VerifyReport(store.uri, manifest.records, len(manifest.shards), problems)


class _Counted:
    """A file object's reads, reported as bytes read so far."""

    def __init__(self, fileobj: IO[bytes], report: ProgressFn) -> None:
        self._file = fileobj
        self._report = report
        self._done = 0

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self._done += len(data)
        self._report(self._done)
        return data


def _record_problems(store: Store, shards: Sequence[Shard], workers: int,
                     progress: ProgressCallback | None) -> list[Problem]:
    if workers < 1:
        raise UsageError(f"workers = {workers}: need at least one")
    transfer = Transfer(sum(shard.bytes for shard in shards), progress)

    def check(folder: Path, shard: Shard) -> Problem | None:
        path = folder / f"{shard.name.replace('/', '_')}.part"
        try:
            store.download_file(shard.name, path)
            with open(path, "rb") as handle:
                count = sum(1 for _ in read_records(_Counted(handle, transfer.reporter(shard.name)), name=shard.name))
        except NotFound:
            return Problem(shard.name, "missing")
        except IntegrityError as err:
            return Problem(shard.name, str(err).removeprefix(f"{shard.name}: "))
        finally:
            path.unlink(missing_ok=True)
        if count != shard.records:
            return Problem(shard.name, f"{count} records, manifest says {shard.records}")
        return None

    with tempfile.TemporaryDirectory(prefix="tpuops-verify-") as tmp, \
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verify") as pool:
        found = list(pool.map(lambda shard: check(Path(tmp), shard), shards))
    return [problem for problem in found if problem is not None]


def read_manifest(store: Store, key: str = MANIFEST) -> Manifest:
    try:
        data = store.read_bytes(key)
    except NotFound:
        raise NotFound(
            f"{store.uri_of(key)}: no manifest: not a dataset, or its upload did not finish (rerun the upload)"
        ) from None
    return parse_manifest(data, store.uri_of(key))


def _problems(manifest: Manifest, objects: dict[str, ObjectInfo], prefix: str) -> list[Problem]:
    found = []
    for shard in manifest.shards:
        info = objects.get(prefix + shard.name)
        if info is None:
            found.append(Problem(shard.name, "missing"))
        elif info.size != shard.bytes:
            found.append(Problem(shard.name, f"size {info.size}, manifest says {shard.bytes}"))
        elif info.crc32c != shard.crc32c:
            found.append(Problem(shard.name, f"crc32c {info.crc32c}, manifest says {shard.crc32c}"))
    return found


@dataclass(frozen=True)
class DatasetSummary:
    name: str
    uri: str
    records: int
    shards: int
    bytes: int
    created: str
    complete: bool
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def ls(store: Store, prefix: str = "") -> list[DatasetSummary]:
    """Every dataset (a prefix holding ``manifest.json``) under ``prefix``, with counts and sizes.

    ``complete`` says whether every listed shard is present with the manifest's size and
    crc32c (from the same single listing); a manifest that does not parse is reported in
    ``error`` rather than failing the whole listing.
    """
    objects = {info.key: info for info in store.list(prefix)}
    found = []
    for key in sorted(objects):
        if key != MANIFEST and not key.endswith("/" + MANIFEST):
            continue
        folder = key[: -len(MANIFEST)]
        name = folder.rstrip("/") or "."
        uri = store.uri_of(folder.rstrip("/")) if folder else store.uri
        try:
            manifest = read_manifest(store, key)
        except (UsageError, NotFound) as err:
            found.append(DatasetSummary(name, uri, 0, 0, 0, "", False, str(err)))
            continue
        complete = not _problems(manifest, objects, folder)
        found.append(DatasetSummary(name, uri, manifest.records, len(manifest.shards), manifest.bytes,
                                    manifest.created, complete))
    return found
