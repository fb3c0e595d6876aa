"""``tpuops init``: write tpuops.toml."""

from __future__ import annotations

from pathlib import Path

import typer

from tpuops.cli.common import err_console
from tpuops.core.kinds import Capacity, Cloud


def register(app: typer.Typer) -> None:
    app.command("init")(init)


def init(
    provider: Cloud = typer.Option(Cloud.LOCAL, help="local: the emulator on this machine; gcp: Cloud TPU."),
    project: str | None = typer.Option(None, help="GCP project id."),
    zone: list[str] | None = typer.Option(None, "--zone", help="Zone; repeat for failover order."),
    store: str | None = typer.Option(None, help="Store root: gs://BUCKET/PREFIX (gcp) or a directory."),
    accelerator: str | None = typer.Option(None, help="Default accelerator type, e.g. v3-8."),
    capacity: Capacity | None = typer.Option(None, help="Default capacity."),
    label: list[str] | None = typer.Option(None, "--label", help="KEY=VALUE label put on every node."),
    service_account: str | None = typer.Option(None, help="Account the TPU VMs run as (infra's vm_service_account)."),
    tpu_endpoint: str | None = typer.Option(None, help="Cloud TPU API endpoint (e.g. an emulator), instead of "
                                            "--provider's."),
    path: Path = typer.Option(Path("tpuops.toml"), "--path", help="Where to write the file."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write tpuops.toml (validated) for this project."""
    from tpuops import api

    values = {"tpu_endpoint": tpu_endpoint or provider, "project": project, "zones": zone or None, "store": store,
              "accelerator": accelerator, "capacity": capacity,
              "service_account": service_account}
    settings = api.init(path, values, labels=",".join(label) if label else None, force=force)
    err_console().print(f"wrote {path} (provider {settings.cloud.value}, zones {', '.join(settings.zones)})")
