"""``upload``: a local dataset folder → a store prefix, verified, parallel, and safe to rerun.

Invariants:

- The destination is listed once; a shard already there with the manifest's size and crc32c
  is skipped, so a rerun after an interruption (even SIGKILL) sends only what is missing
  and leaves complete objects untouched (same generation).
- Each shard is uploaded with the manifest's crc32c as the expected checksum: the local file
  must still match it, and so must the object the store reports afterwards
  (``Store.upload_file``). Transient failures are retried inside the store; the first
  error that is not retried stops the other workers and is raised, once.
- ``manifest.json`` is written last, and only after every shard is in place. If the
  destination holds a different manifest, it is deleted before any shard is replaced, so a
  reader never pairs an old manifest with new shards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuops.core.errors import Interrupted, TpuopsError, UsageError
from tpuops.data.manifest import MANIFEST, Manifest, Shard, parse_manifest
from tpuops.store.base import ProgressFn, Store

ProgressCallback = Callable[[int, int], None]
"""``progress(bytes_sent, bytes_to_send)``, called from worker threads as chunks go out."""

DEFAULT_WORKERS = 8

# Predefined dual-regions and the regions they read from at no transfer charge.
_DUAL_REGIONS = {
    "nam4": ("us-central1", "us-east1"),
    "eur4": ("europe-north1", "europe-west4"),
    "asia1": ("asia-northeast1", "asia-northeast2"),
}
_MULTI_REGIONS = frozenset({"us", "eu", "asia"})


@dataclass(frozen=True)
class UploadPlan:
    """What an upload will do, decided from one listing of the destination."""

    send: tuple[Shard, ...]
    skip: tuple[Shard, ...]
    manifest_present: bool
    manifest_current: bool

    @property
    def bytes_to_send(self) -> int:
        return sum(shard.bytes for shard in self.send)

    @property
    def bytes_skipped(self) -> int:
        return sum(shard.bytes for shard in self.skip)


@dataclass(frozen=True)
class UploadReport:
    uri: str
    plan: UploadPlan
    sent: tuple[str, ...]
    manifest_written: bool
    dry_run: bool
    seconds: float
    warning: str | None

    @property
    def bytes_sent(self) -> int:
        sent = set(self.sent)
        return sum(shard.bytes for shard in self.plan.send if shard.name in sent)

    def to_json(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "dry_run": self.dry_run,
            "to_send": [shard.name for shard in self.plan.send],
            "skipped": [shard.name for shard in self.plan.skip],
            "sent": list(self.sent),
            "bytes_sent": self.bytes_sent,
            "bytes_skipped": self.plan.bytes_skipped,
            "manifest_written": self.manifest_written,
            "seconds": round(self.seconds, 3),
            "warning": self.warning,
        }


def read_local_dataset(local_dir: Path) -> tuple[Manifest, bytes]:
    """The local manifest (parsed and as bytes), after checking every shard file it lists is there.

    Raises:
        UsageError: no manifest, a bad one, or a shard file missing or of the wrong size.
    """
    path = Path(local_dir) / MANIFEST
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UsageError(
            f"{path}: cannot read ({err.strerror or err}); convert a dataset into {local_dir} first"
        ) from None
    manifest = parse_manifest(data, str(path))
    for shard in manifest.shards:
        shard_path = Path(local_dir) / shard.name
        try:
            size = shard_path.stat().st_size
        except OSError:
            raise UsageError(f"{shard_path}: listed in the manifest but missing") from None
        if size != shard.bytes:
            raise UsageError(f"{shard_path}: {size} bytes, the manifest says {shard.bytes}")
    return manifest, data


def plan_upload(manifest: Manifest, manifest_bytes: bytes, store: Store) -> UploadPlan:
    """Compare the manifest with one listing of the destination."""
    remote = {info.key: info for info in store.list()}
    send, skip = [], []
    for shard in manifest.shards:
        there = remote.get(shard.name)
        if there is not None and there.size == shard.bytes and there.crc32c == shard.crc32c:
            skip.append(shard)
        else:
            send.append(shard)
    present = MANIFEST in remote
    current = present and store.read_bytes(MANIFEST) == manifest_bytes
    return UploadPlan(send=tuple(send), skip=tuple(skip), manifest_present=present, manifest_current=current)


def upload(
    local_dir: Path,
    store: Store,
    *,
    workers: int = DEFAULT_WORKERS,
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
    tpu_zone: str | None = None,
) -> UploadReport:
    """Upload the dataset in ``local_dir`` to ``store`` (see the module docstring).

    Args:
        workers: shards uploaded at once.
        dry_run: plan only; send nothing.
        tpu_zone: the zone the TPUs run in; the report warns if the bucket is elsewhere.
    Raises:
        UsageError: the local dataset is incomplete or ``workers`` < 1.
        Interrupted: Ctrl-C; completed shards stay and a rerun skips them.
        TpuopsError: the first store error that retries could not fix.
    """
    started = time.monotonic()
    if workers < 1:
        raise UsageError(f"--workers {workers}: need at least one worker")
    manifest, manifest_bytes = read_local_dataset(local_dir)
    warning = _location_warning(store, tpu_zone)
    plan = plan_upload(manifest, manifest_bytes, store)
    if dry_run:
        return UploadReport(store.uri, plan, (), False, True, time.monotonic() - started, warning)

    if plan.send and plan.manifest_present and not plan.manifest_current:
        store.delete(MANIFEST)
    sent = _send(Path(local_dir), store, plan, workers, progress)
    written = bool(sent) or not plan.manifest_current
    if written:
        store.write_bytes(MANIFEST, manifest_bytes)
    return UploadReport(store.uri, plan, tuple(sent), written, False, time.monotonic() - started, warning)


class _Cancelled(Exception):
    """Raised inside a worker's progress report to stop an upload that another failure made pointless."""


class Transfer:
    """Per-shard progress summed across workers, and a switch that stops every worker (upload's, and
    ``verify``'s reads)."""

    def __init__(self, total: int, progress: ProgressCallback | None) -> None:
        self._total = total
        self._progress = progress
        self._lock = threading.Lock()
        self._by_shard: dict[str, int] = {}
        self._sum = 0
        self.cancelled = threading.Event()

    def reporter(self, name: str) -> ProgressFn:
        def report(done: int) -> None:
            if self.cancelled.is_set():
                raise _Cancelled(name)
            with self._lock:
                self._sum += done - self._by_shard.get(name, 0)
                self._by_shard[name] = done
                current = self._sum
            if self._progress is not None:
                self._progress(current, self._total)

        return report


def _send(
    local_dir: Path, store: Store, plan: UploadPlan, workers: int, progress: ProgressCallback | None
) -> list[str]:
    transfer = Transfer(plan.bytes_to_send, progress)
    sent: list[str] = []
    first_error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="upload") as pool:
        futures: dict[Future[Any], Shard] = {
            pool.submit(
                store.upload_file,
                local_dir / shard.name,
                shard.name,
                expected_crc32c=shard.crc32c,
                progress=transfer.reporter(shard.name),
            ): shard
            for shard in plan.send
        }
        try:
            for future in as_completed(futures):
                if future.cancelled():
                    continue
                error = future.exception()
                if error is None:
                    sent.append(futures[future].name)
                elif first_error is None and not isinstance(error, _Cancelled):
                    first_error = error
                    _stop(transfer, futures)
        except KeyboardInterrupt:
            _stop(transfer, futures)
            raise Interrupted(
                f"upload to {store.uri} interrupted; {len(sent)} of {len(plan.send)} shards were complete "
                "and will be skipped when you run it again"
            ) from None
    if first_error is not None:
        raise first_error
    return sorted(sent)


def _stop(transfer: Transfer, futures: dict[Future[Any], Shard]) -> None:
    transfer.cancelled.set()
    for future in futures:
        future.cancel()


def _location_warning(store: Store, tpu_zone: str | None) -> str | None:
    if tpu_zone is None:
        return None
    try:
        location = store.location()
    except TpuopsError as err:
        return f"could not read the bucket's location to compare with zone {tpu_zone}: {err}"
    return region_warning(location, tpu_zone)


def region_warning(location: str | None, zone: str) -> str | None:
    """A warning when TPUs in ``zone`` would read a bucket in ``location`` from another region.

    Same region (case-insensitive), or a dual-region that includes it: no warning. A
    multi-region (US, EU, ASIA) is a mismatch too: reads from it are billed as network data
    transfer even inside its area and get less bandwidth per region than a regional bucket.
    None for a store with no location (a local directory).
    """
    if not location:
        return None
    region = zone.lower().rsplit("-", 1)[0]
    place = location.lower()
    if region in set(place.split("+")) | set(_DUAL_REGIONS.get(place, ())):
        return None
    if place in _MULTI_REGIONS:
        return (
            f"the bucket is in the {location.upper()} multi-region, the TPUs in {region} ({zone}): reads from a "
            f"multi-region are billed as data transfer and get less bandwidth; a bucket in {region} avoids both"
        )
    return (
        f"the bucket is in {location.upper()}, the TPUs in {region} ({zone}): every epoch would read across "
        f"regions, slower and billed as data transfer; put datasets in a bucket in {region}"
    )
