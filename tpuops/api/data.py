"""``tpuops data *`` as library calls: convert, upload, verify and list datasets, write a sample.

Part of the front door (``tpuops.api`` re-exports every name here). Datasets are addressed by URI
(``gs://BUCKET/PREFIX/data/NAME`` or a directory), not by the configured store, so these calls
take no ``Settings``. Sizes may be given as text (``100MB``, ``1GiB``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops.errors import UsageError

if TYPE_CHECKING:
    from tpuops.data import ConvertReport, DatasetSummary, UploadReport, VerifyReport


def data_convert(src: Path, format: str, out: Path, *, shards: int | None = None,
                 shard_size: int | str | None = None, label_from: str | None = None, seed: int | None = 0,
                 overwrite: bool = False) -> ConvertReport:
    """``tpuops data convert``: images, .npz or .csv into TFRecord shards plus manifest.json (written last)."""
    from tpuops.data import convert
    from tpuops.formats import parse_size

    return convert(src, format, out, shards=shards,
                   shard_size=parse_size(shard_size) if isinstance(shard_size, str) else shard_size,
                   label_from=label_from, seed=seed, overwrite=overwrite)


def data_upload(directory: Path, uri: str, *, workers: int = 8, dry_run: bool = False, zone: str | None = None,
                progress: Callable[[int, int], None] | None = None) -> UploadReport:
    """``tpuops data upload``: shards in parallel, those already there skipped (same crc32c), manifest last."""
    from tpuops.data import upload
    from tpuops.store import open_store

    return upload(directory, open_store(uri), workers=workers, dry_run=dry_run, progress=progress, tpu_zone=zone)


def data_verify(uri: str) -> VerifyReport:
    """``tpuops data verify``: every shard against manifest.json (present, size, crc32c)."""
    from tpuops.data import verify
    from tpuops.store import open_store

    return verify(open_store(uri))


def data_ls(uri: str | None = None, *, store: str | None = None) -> tuple[str, list[DatasetSummary]]:
    """``tpuops data ls [URI | --store ROOT]``: the root listed and its datasets (prefixes with a manifest)."""
    from tpuops.data import ls
    from tpuops.store import open_store

    if uri is not None:
        root, prefix = uri, ""
    elif store is not None:
        root, prefix = store, "data/"
    else:
        raise UsageError("give a URI to list, or --store ROOT to list ROOT/data/")
    return root, ls(open_store(root), prefix)


def data_sample(name: str, out: Path, *, overwrite: bool = False) -> dict[str, ConvertReport]:
    """``tpuops data sample NAME OUT``: a small real dataset (train and test splits) without downloads."""
    from tpuops.data.samples import make_sample

    return make_sample(name, out, overwrite=overwrite)
