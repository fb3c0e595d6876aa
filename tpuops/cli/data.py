"""``tpuops data convert | upload | verify | ls``: one library call each (``tpuops.api.data_*``), rendered.

The library and Google clients are imported inside the commands so ``tpuops --help`` stays fast.
Errors are ``TpuopsError``s; ``tpuops.cli.main`` prints them as one line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tpuops.cli.common import err_console, folder_to_write, load_settings, print_json, print_table

if TYPE_CHECKING:
    from tpuops.api import UploadReport

app = typer.Typer(
    help="Datasets: convert to TFRecord shards (no TensorFlow needed), upload to the store, verify, list.",
    no_args_is_help=True,
)


class Format(str, Enum):
    IMAGES = "images"
    NPZ = "npz"
    CSV = "csv"


@app.command()
def convert(
    src: Path = typer.Argument(..., help="A folder with one subfolder per class (images), an .npz or a .csv file."),
    format: Format = typer.Option(..., "--format", "-f", help="Source format."),
    out: str = typer.Option(..., "--out", "-o", help="Folder for the shards and manifest.json."),
    shards: int | None = typer.Option(None, "--shards", min=1, max=100_000,
                                      help="Exactly N shards, records split evenly."),
    shard_size: str | None = typer.Option(
        None, "--shard-size", help="Cut shards at this size: 100MB, 1GiB, ... (default 100MB)."
    ),
    label_from: str | None = typer.Option(
        None, "--label-from", help="'dirname' (images: class = folder name) or 'column:NAME' (npz, csv)."
    ),
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1, help="Seed of the image shuffle."),
    no_shuffle: bool = typer.Option(False, "--no-shuffle", help="Keep images in folder order."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a dataset already in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Convert images, .npz or .csv into TFRecord shards plus manifest.json (written last)."""
    from tpuops import api
    from tpuops.core.formats import format_size

    report = api.data_convert(src, format.value, folder_to_write(out, "--out"), shards=shards,
                              shard_size=shard_size or None, label_from=label_from,
                              seed=None if no_shuffle else seed, overwrite=overwrite)
    if as_json:
        print_json(report.to_json())
        return
    manifest = report.manifest
    rate = manifest.records / report.seconds if report.seconds else 0.0
    typer.echo(
        f"{manifest.records} records in {len(manifest.shards)} shards ({format_size(manifest.bytes)}) "
        f"in {report.seconds:.1f} s ({rate:,.0f} records/s) → {report.out_dir}"
    )
    print_table(
        "features",
        ["name", "kind", "dtype", "shape", "encoding"],
        [[name, spec.kind, spec.dtype, spec.shape, spec.encoding] for name, spec in manifest.features.items()],
    )


@app.command()
def upload(
    ctx: typer.Context,
    directory: Path = typer.Argument(..., help="A converted dataset folder (with manifest.json)."),
    uri: str = typer.Argument(..., help="Destination: gs://BUCKET/PREFIX/data/NAME or a directory."),
    workers: int = typer.Option(8, "--workers", min=1, max=256, help="Shards uploaded in parallel."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be sent; send nothing."),
    zone: str | None = typer.Option(None, "--zone", help="TPU zone: warn if the bucket is in another region."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Upload shards in parallel, skip those already there (same crc32c), write manifest.json last."""
    from tpuops import api

    with _byte_progress("uploading", disabled=as_json or dry_run) as on_progress:
        report = api.data_upload(load_settings(ctx), directory, uri, workers=workers, dry_run=dry_run, zone=zone,
                                 progress=on_progress)
    if report.warning:
        err_console().print(f"warning: {report.warning}", style="yellow", markup=False, soft_wrap=True)
    if as_json:
        print_json(report.to_json())
        return
    typer.echo(_upload_summary(report))


def _upload_summary(report: UploadReport) -> str:
    from tpuops.core.formats import format_size

    plan = report.plan
    skipped = f"{len(plan.skip)} already there with the same crc32c ({format_size(plan.bytes_skipped)})"
    if report.dry_run:
        return f"would send {len(plan.send)} shards ({format_size(plan.bytes_to_send)}); {skipped}"
    rate = report.bytes_sent / report.seconds if report.seconds else 0.0
    manifest = "manifest.json written" if report.manifest_written else "manifest.json unchanged"
    return (
        f"sent {len(report.sent)} shards ({format_size(report.bytes_sent)}) in {report.seconds:.1f} s "
        f"({format_size(int(rate))}/s); {skipped}; {manifest} → {report.uri}"
    )


@contextmanager
def _byte_progress(label: str, *, disabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar with bytes/s and ETA on a terminal; nothing otherwise."""
    console = err_console()
    if disabled or not console.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@app.command()
def verify(
    ctx: typer.Context,
    uri: str = typer.Argument(..., help="A dataset in the store: gs://BUCKET/PREFIX/data/NAME or a directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Check every shard against manifest.json (present, size, crc32c) and every record's checksums."""
    from tpuops import api
    from tpuops.core.errors import IntegrityError

    with _byte_progress("verifying", disabled=as_json) as on_progress:
        report = api.data_verify(load_settings(ctx), uri, progress=on_progress)
    if as_json:
        print_json(report.to_json())
    elif report.ok:
        typer.echo(f"ok: {report.shards} shards, {report.records} records match the manifest ({report.uri})")
    else:
        print_table("shards that do not match the manifest", ["shard", "problem"],
                    [[p.name, p.reason] for p in report.problems])
    if not report.ok:
        names = ", ".join(f"{p.name} ({p.reason})" for p in report.problems)
        raise IntegrityError(f"{report.uri}: {len(report.problems)} of {report.shards} shards are bad: {names}")


@app.command("ls")
def ls(
    ctx: typer.Context,
    uri: str | None = typer.Argument(None, help="List datasets anywhere under this URI."),
    store: str | None = typer.Option(None, "--store", help="Store root: list the datasets in ROOT/data/."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """List datasets (prefixes holding a manifest.json) with records, shards and size."""
    from tpuops import api
    from tpuops.core.formats import format_size

    root, datasets = api.data_ls(load_settings(ctx), uri, store=store)
    if as_json:
        print_json([dataset.to_json() for dataset in datasets])
        return
    rows = [
        [d.name, d.records, d.shards, format_size(d.bytes), d.created,
         d.error or ("complete" if d.complete else "incomplete: run verify")]
        for d in datasets
    ]
    print_table(f"datasets under {root}", ["dataset", "records", "shards", "size", "created", "status"], rows)
