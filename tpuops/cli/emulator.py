"""``tpuops emulator``: the local Cloud TPU API emulator (start, stop, status, preempt, fault, billing)."""

from __future__ import annotations

from typing import Any

import typer

from tpuops.cli.common import err_console, load_settings, print_json, print_table

app = typer.Typer(help="The local Cloud TPU API emulator that provider=local runs on.", no_args_is_help=True)


@app.command()
def start(
    ctx: typer.Context,
    port: int = typer.Option(0, min=0, max=65535, help="Port on 127.0.0.1 (0: any free port)."),
    boot_delay: float = typer.Option(1.0, min=0, max=3600, help="Seconds a node spends CREATING before READY."),
    grace: float = typer.Option(30.0, min=0, max=3600,
                                help="Seconds between the preemption notice (SIGTERM) and SIGKILL."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Serve without a bearer token (for gcloud and "
                                 "other third-party clients): any local process can then use it."),
    as_json: bool = typer.Option(False, "--json", help="Print the endpoint as JSON."),
) -> None:
    """Start the emulator in the background and print its endpoint.

    Requests must carry the bearer token written to <home>/emulator/token (mode 0600); tpuops
    sends it by itself.
    """
    from tpuops import api

    settings = load_settings(ctx)
    started = api.emulator_start(settings, port=port, boot_delay_s=boot_delay, grace_s=grace, auth=not no_auth)
    info, gcs = started.info, started.storage_endpoint
    shown = _shown(info, gcs)
    if as_json:
        print_json(shown)
        return
    typer.echo(info.endpoint)
    token_file = shown["token_file"]
    access = f"requests need the bearer token in {token_file}" if token_file else "no auth: anyone local may use it"
    err_console().print(f"emulator running (pid {info.pid}; {access}); point a client at it with "
                        f"TPUOPS_TPU_ENDPOINT={info.endpoint}")
    if gcs:
        err_console().print(f"Cloud Storage: nodes reach {settings.store_root} as storage.googleapis.com; "
                            f"other clients with STORAGE_EMULATOR_HOST={gcs}", markup=False)


def _shown(info: Any, storage_endpoint: str | None) -> dict[str, Any]:
    """What ``start --json`` and ``status --json`` say of a running emulator: the same keys for either."""
    return {"endpoint": info.endpoint, "pid": info.pid, "state_dir": str(info.state_dir),
            "auth": info.token is not None, "token_file": str(info.state_dir / "token") if info.token else None,
            "storage_endpoint": storage_endpoint}


@app.command()
def stop(ctx: typer.Context) -> None:
    """Stop the emulator and every node process it started."""
    from tpuops import api

    stopped = api.emulator_stop(load_settings(ctx))
    err_console().print("emulator stopped" if stopped else "the emulator was not running")


@app.command("status")
def show_status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> None:
    """Whether the emulator runs, and where."""
    from tpuops import api

    info = api.emulator_status(load_settings(ctx))
    gcs = info.storage_endpoint if info else None
    if as_json:
        print_json({"running": True, **_shown(info, gcs)} if info
                   else {"running": False, "endpoint": None, "pid": None})
    elif info:
        typer.echo(f"running at {info.endpoint} (pid {info.pid})" + (f"; Cloud Storage at {gcs}" if gcs else ""))
    else:
        typer.echo("not running")
    if info is None:  # exit 1 either way, like 'systemctl is-active': scripts test the code
        raise typer.Exit(1)


@app.command()
def preempt(
    ctx: typer.Context,
    node: str = typer.Argument(..., help="Node to preempt now."),
    zone: str | None = typer.Option(None, help="Its zone (default: the first configured zone)."),
    grace: float | None = typer.Option(None, min=0, max=3600, help="Override the grace period for this preemption."),
) -> None:
    """Preempt a spot or preemptible node now: SIGTERM, grace period, SIGKILL, PREEMPTED."""
    from tpuops import api

    api.emulator_preempt(load_settings(ctx), node, zone=zone, grace_s=grace)
    err_console().print(f"preempting {node}")


@app.command()
def fault(
    ctx: typer.Context,
    stockout: list[str] | None = typer.Option(None, "--stockout", help="Zone with no capacity (repeatable)."),
    error_rate: float | None = typer.Option(None, help="Fraction of API requests answered with an error."),
    error_code: int | None = typer.Option(None, help="HTTP code of injected errors (503 or 429)."),
    error_burst: int | None = typer.Option(None, help="Fail exactly the next N API requests."),
    latency: float | None = typer.Option(None, help="Seconds added to every API request."),
    gcs_error_rate: float | None = typer.Option(
        None,
        help="Fraction of Cloud Storage requests failed, the nodes' and the control plane's (503, 429, reset)."),
    gcs_latency_ms: float | None = typer.Option(
        None, help="Milliseconds added to each Cloud Storage request (nodes, control plane)."),
    preempt_rate: float | None = typer.Option(None, help="Random preemptions per node per second."),
    seed: int | None = typer.Option(None, help="Seed of the fault dice."),
    hold_delete: list[str] | None = typer.Option(
        None, "--hold-delete", help="Node whose delete stays DELETING until released (repeatable)."
    ),
    release_deletes: bool = typer.Option(False, "--release-deletes", help="Let every held delete finish."),
    hold_queued: bool | None = typer.Option(
        None, "--hold-queued/--release-queued", help="Queued resources stay ACCEPTED (never provisioned), or not."
    ),
    fail_queued: list[str] | None = typer.Option(
        None, "--fail-queued", help="Zone whose queued resources fail (repeatable)."
    ),
    kill_runtime: list[str] | None = typer.Option(
        None, "--kill-runtime", help="NODE/WORKER: kill that slice worker's TPU runtime once (repeatable)."
    ),
    never_boot: list[str] | None = typer.Option(
        None, "--never-boot", help="NODE/WORKER: that slice worker's next boot runs nothing (repeatable)."
    ),
    clear: bool = typer.Option(False, "--clear", help="Remove every fault."),
    as_json: bool = typer.Option(False, "--json", help="Print the faults in force."),
) -> None:
    """Inject faults: stockouts, error storms, latency, preemption, slow deletes, stuck queues, storage errors,
    a slice worker's runtime killed or a worker that never boots."""
    from tpuops import api

    in_force = api.emulator_fault(
        load_settings(ctx), clear=clear, stockout_zones=stockout or None, error_rate=error_rate,
        error_code=error_code, error_burst=error_burst, latency_s=latency, preempt_rate_per_s=preempt_rate, seed=seed,
        hold_deletes=[] if release_deletes else hold_delete or None, hold_queued=hold_queued,
        fail_queued_zones=fail_queued or None, gcs_error_rate=gcs_error_rate, gcs_latency_ms=gcs_latency_ms,
        kill_runtimes=kill_runtime or None, never_boot_workers=never_boot or None)
    if as_json:
        print_json({"faults": in_force})
    else:
        err_console().print("faults cleared" if clear else "faults set")


@app.command()
def billing(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> None:
    """The emulator's billing truth: seconds each node spent READY."""
    from tpuops import api

    records = api.emulator_billing(load_settings(ctx))
    if as_json:
        print_json({"intervals": records})
        return
    print_table("READY intervals", ("node", "zone", "accelerator", "capacity", "seconds", "billed seconds"),
                [(r.get("node"), r.get("zone"), r.get("accelerator_type"), r.get("capacity"),
                  f"{float(r.get('seconds') or 0):.1f}", f"{float(r.get('billed_seconds') or 0):.1f}")
                 for r in records])
