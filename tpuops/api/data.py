"""``tpuops data *`` as library calls: convert, upload, verify and list datasets, write a sample.

Part of the front door (``tpuops.api`` re-exports every name here). Datasets are addressed by URI
(``gs://BUCKET/PREFIX/data/NAME`` or a directory), not by the configured store; the calls that open
one take ``Settings`` all the same, because ``tpuops.session.open_uri`` decides where a ``gs://``
URI goes (on provider local: the emulator or ``STORAGE_EMULATOR_HOST``, never public Cloud Storage).
Sizes may be given as text (``100MB``, ``1GiB``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops.config import Settings
from tpuops.core.errors import UsageError

if TYPE_CHECKING:
    from tpuops.data import ConvertReport, DatasetSummary, UploadReport, VerifyReport


def data_convert(src: Path, format: str, out: Path, *, shards: int | None = None,
                 shard_size: int | str | None = None, label_from: str | None = None, seed: int | None = 0,
                 overwrite: bool = False) -> ConvertReport:
    """``tpuops data convert``: images, .npz or .csv into TFRecord shards plus manifest.json (written last)."""
    from tpuops.core.formats import parse_size
    from tpuops.data import convert

    return convert(src, format, out, shards=shards,
                   shard_size=parse_size(shard_size) if isinstance(shard_size, str) else shard_size,
                   label_from=label_from, seed=seed, overwrite=overwrite)


def data_upload(settings: Settings, directory: Path, uri: str, *, workers: int = 8, dry_run: bool = False,
                zone: str | None = None, progress: Callable[[int, int], None] | None = None) -> UploadReport:
    """``tpuops data upload``: shards in parallel, those already there skipped (same crc32c), manifest last."""
    from tpuops.data import upload
    from tpuops.session import open_uri

    return upload(directory, open_uri(settings, uri), workers=workers, dry_run=dry_run, progress=progress,
                  tpu_zone=zone)


def data_verify(settings: Settings, uri: str, *,
                progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """``tpuops data verify``: every shard against manifest.json (present, size, crc32c), every record framed
    and its checksums checked, the records counted."""
    from tpuops.data import verify
    from tpuops.session import open_uri

    return verify(open_uri(settings, uri), progress=progress)


def data_ls(settings: Settings, uri: str | None = None, *,
            store: str | None = None) -> tuple[str, list[DatasetSummary]]:
    """``tpuops data ls [URI | --store ROOT]``: the root listed and its datasets (prefixes with a manifest)."""
    from tpuops.data import ls
    from tpuops.session import open_uri

    if uri is not None:
        root, prefix = uri, ""
    elif store is not None:
        root, prefix = store, "data/"
    else:
        raise UsageError("give a URI to list, or --store ROOT to list ROOT/data/")
    return root, ls(open_uri(settings, root), prefix)


def data_sample(name: str, out: Path, *, overwrite: bool = False) -> dict[str, ConvertReport]:
    """``tpuops data sample NAME OUT``: a small real dataset (train and test splits) without downloads."""
    from tpuops.data.samples import make_sample

    return make_sample(name, out, overwrite=overwrite)
