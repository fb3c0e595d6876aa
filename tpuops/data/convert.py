"""``convert``: images / npz / csv → TFRecord shards + ``manifest.json`` in a local folder.

Order of work, so that a failure at any point leaves no dataset that lies:

1. read and validate the whole source (``tpuops.data.sources``) — bad input stops here,
   before anything is written;
2. clear the destination (only with ``overwrite``: the old manifest goes first, then its shards);
3. write shards as temp files, rename them, then write ``manifest.json`` last (atomically).

Any error or Ctrl-C during 3 removes every shard this run wrote; no manifest is left behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuops.core.errors import Interrupted, UsageError
from tpuops.data import sources
from tpuops.data.manifest import MANIFEST, Manifest, Origin, parse_manifest, utc_now
from tpuops.data.shards import ShardCutter, even_counts, remove_stale_temp_files
from tpuops.store.files import write_atomically

DEFAULT_SHARD_SIZE = 100 * 10**6
DIRNAME = "dirname"


def _images(src: Path, label: str | None, seed: int | None) -> sources.Table:
    if label not in (None, DIRNAME):
        raise UsageError(f"images take their labels from folder names (--label-from {DIRNAME}), not {label!r}")
    return sources.read_images(src, seed=seed)


def _npz(src: Path, label: str | None, seed: int | None) -> sources.Table:
    return sources.read_npz(src, label_column=_column(label, "npz"))


def _csv(src: Path, label: str | None, seed: int | None) -> sources.Table:
    return sources.read_csv(src, label_column=_column(label, "csv"))


def _column(label: str | None, format_name: str) -> str | None:
    if label == DIRNAME:
        raise UsageError(f"{format_name} input has no folders to take labels from; use --label-from column:NAME")
    return label.removeprefix("column:") if label else None


FORMATS: dict[str, Callable[[Path, str | None, int | None], sources.Table]] = {
    "images": _images,
    "npz": _npz,
    "csv": _csv,
}


@dataclass(frozen=True)
class ConvertReport:
    out_dir: Path
    manifest: Manifest
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "records": self.manifest.records,
            "bytes": self.manifest.bytes,
            "shards": len(self.manifest.shards),
            "seconds": round(self.seconds, 3),
            "manifest": self.manifest.model_dump(mode="json"),
        }


def convert(
    src: Path,
    format: str,
    out_dir: Path,
    *,
    shards: int | None = None,
    shard_size: int | None = None,
    label_from: str | None = None,
    seed: int | None = 0,
    overwrite: bool = False,
) -> ConvertReport:
    """Convert ``src`` into a TFRecord dataset in ``out_dir``.

    Args:
        format: "images", "npz" or "csv".
        shards: exactly this many shards (records split evenly); or
        shard_size: start a new shard before one would exceed this many bytes (default 100 MB).
        label_from: "dirname" (images: class = folder name), or "column:NAME" / "NAME" (npz, csv).
        seed: shuffle images with this seed (None keeps folder order); npz and csv keep their order.
        overwrite: replace a dataset already in ``out_dir``.
    Raises:
        UsageError: bad arguments or bad input, as one line; nothing is left in ``out_dir``.
    """
    started = time.monotonic()
    reader = FORMATS.get(format)
    if reader is None:
        raise UsageError(f"format {format!r} is not one of: {', '.join(FORMATS)}")
    if shards is not None and shard_size is not None:
        raise UsageError("give --shards or --shard-size, not both")
    if shards is not None and shards < 1:
        raise UsageError(f"--shards {shards}: need at least one shard")
    table = reader(Path(src), label_from, seed)
    if shards is not None and shards > table.count:
        raise UsageError(f"--shards {shards} is more than the {table.count} records")

    out_dir = Path(out_dir)
    _prepare(out_dir, overwrite)
    if shards is not None:
        writer = ShardCutter(out_dir, counts=even_counts(table.count, shards))
    else:
        writer = ShardCutter(out_dir, max_bytes=shard_size or DEFAULT_SHARD_SIZE)
    try:
        for record in table.records():
            writer.write(record)
        written = writer.finish()
        manifest = Manifest(
            created=utc_now(),
            source=Origin(format=format, path=str(Path(src).absolute()), description=table.description),
            records=sum(shard.records for shard in written),
            bytes=sum(shard.bytes for shard in written),
            features=table.features,
            labels=table.labels,
            shards=written,
        )
        data = manifest.to_bytes()
        write_atomically(out_dir / MANIFEST, lambda handle: handle.write(data))
    except KeyboardInterrupt:
        writer.discard()
        raise Interrupted(f"conversion into {out_dir} interrupted; no shard was kept") from None
    except BaseException:
        writer.discard()
        raise
    return ConvertReport(out_dir=out_dir, manifest=manifest, seconds=time.monotonic() - started)


def _prepare(out_dir: Path, overwrite: bool) -> None:
    """Create ``out_dir``; with ``overwrite``, remove the dataset in it (manifest first)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{out_dir}: cannot create: {err.strerror or err}") from err
    remove_stale_temp_files(out_dir)
    manifest_path = out_dir / MANIFEST
    if not manifest_path.exists():
        return
    if not overwrite:
        raise UsageError(f"{out_dir} holds a dataset already (manifest.json); pass --overwrite to replace it")
    try:
        old = parse_manifest(manifest_path.read_bytes(), str(manifest_path))
        old_shards = [shard.name for shard in old.shards]
    except UsageError:
        old_shards = []
    manifest_path.unlink()
    for name in old_shards:
        if "/" not in name:
            (out_dir / name).unlink(missing_ok=True)
