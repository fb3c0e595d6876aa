"""``tpuops data sample NAME OUT``: a small real dataset, ready to train on, without downloads."""

from __future__ import annotations

import typer

from tpuops.cli.common import err_console, folder_to_write, print_json


def sample(
    name: str = typer.Argument(..., help="Sample dataset: digits (scikit-learn's 8x8 handwritten digits)."),
    out: str = typer.Argument(..., help="Folder to write; gets train/ and test/ datasets."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace datasets already there."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a sample dataset as TFRecords with manifests (train and test splits)."""
    from tpuops import api

    folder = folder_to_write(out, "OUT")
    reports = api.data_sample(name, folder, overwrite=overwrite)
    if as_json:
        print_json({split: report.to_json() for split, report in reports.items()})
        return
    for split, report in reports.items():
        err_console().print(f"{folder / split}: {report.manifest.records} records in "
                            f"{len(report.manifest.shards)} shards")
