"""Datasets in a store: ``verify`` one against its manifest, ``ls`` the ones under a root.

Both trust only what a listing says about objects (size, crc32c as computed by the store)
and what ``manifest.json`` says they should be; nothing is downloaded but manifests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuops.data.manifest import MANIFEST, Manifest, parse_manifest
from tpuops.errors import NotFound, UsageError
from tpuops.store.base import ObjectInfo, Store


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


def verify(store: Store) -> VerifyReport:
    """Check every shard the manifest lists: present, same size, same crc32c.

    Raises:
        NotFound: no manifest (not a dataset, or its upload never finished).
        UsageError: the manifest is not valid.
    """
    manifest = read_manifest(store)
    objects = {info.key: info for info in store.list()}
    problems = tuple(_problems(manifest, objects, prefix=""))
    return VerifyReport(store.uri, manifest.records, len(manifest.shards), problems)


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
