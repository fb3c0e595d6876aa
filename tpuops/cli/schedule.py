"""``tpuops schedule install|uninstall|status``: reconcile passes every few minutes (cron or a systemd user timer)."""

from __future__ import annotations

from pathlib import Path

import typer

from tpuops.cli.common import DRY_RUN, JSON, err_console, load_settings, print_json, print_table

app = typer.Typer(help="Run 'tpuops reconcile' every few minutes (cron, or a systemd user timer), with a lock.",
                  no_args_is_help=True)
SYSTEMD = typer.Option(False, "--systemd", help="A systemd user timer instead of a crontab line.")


def _config(ctx: typer.Context) -> Path | None:
    """The global ``--config``, if given: the schedule's passes use the same file."""
    state = ctx.find_root().obj
    return getattr(state, "config_path", None)


@app.command("install")
def install(
    ctx: typer.Context,
    every: int = typer.Option(5, "--every", min=1, max=59, help="Minutes between passes (1-59)."),
    systemd: bool = SYSTEMD,
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Install the schedule: one pass every --every minutes with this config, never two at once (flock)."""
    from tpuops import api

    plan = api.schedule_install(load_settings(ctx), config=_config(ctx), every=every, systemd=systemd,
                                dry_run=dry_run)
    if as_json:
        print_json(plan)
        return
    where = ", ".join(plan["units"]) if systemd else f"crontab: {plan['cron']}"
    verb = "would install" if dry_run else "installed"
    err_console().print(f"{verb} {where}\npass script: {plan['script']}; 'tpuops schedule status' shows the last pass",
                        markup=False, soft_wrap=True)


@app.command("uninstall")
def uninstall(ctx: typer.Context, systemd: bool = SYSTEMD, as_json: bool = JSON) -> None:
    """Remove the schedule of this config's home (other crontab lines stay)."""
    from tpuops import api

    found = api.schedule_uninstall(load_settings(ctx), config=_config(ctx), systemd=systemd)
    if as_json:
        print_json({"removed": found})
    else:
        err_console().print("schedule removed" if found else "no schedule was installed for this home")


@app.command("status")
def status(ctx: typer.Context, as_json: bool = JSON) -> None:
    """What is installed, and what the last scheduled pass did."""
    from tpuops import api

    info = api.schedule_status(load_settings(ctx), config=_config(ctx))
    if as_json:
        print_json(info)
        return
    last = info["last_pass"] or {}
    rows = [("crontab", info["cron"] or "-"), ("systemd timer", "yes" if info["systemd_timer"] else "-"),
            ("last pass", f"{last.get('started')} -> {last.get('finished')}, exit {last.get('exit_code')}, "
                          f"{last.get('runs')} run(s), {last.get('actions')} action(s), "
                          f"sweeps advanced: {', '.join(last.get('sweeps', {}).get('advanced', [])) or '-'}"
             if last else "none yet")]
    print_table("schedule", ("what", "state"), rows)


def register(app_: typer.Typer) -> None:
    app_.add_typer(app, name="schedule")
