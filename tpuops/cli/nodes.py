"""``tpuops up``, ``status``, ``down`` and ``exec``: one library call each, rendered."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from tpuops.cli.common import (
    ACCELERATOR,
    DRY_RUN,
    JSON,
    ON_DEMAND,
    PREEMPTIBLE,
    SPOT,
    capacity_flag,
    confirm,
    err_console,
    human_age,
    load_settings,
    print_json,
    print_table,
    progress,
    say_damaged,
)

if TYPE_CHECKING:
    from tpuops.api import UpResult


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("status")(status)
    app.command("down")(down)
    app.command("exec")(exec_command)


def up(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Node name (GCP rules: lowercase letters, digits, '-')."),
    accelerator: str | None = ACCELERATOR,
    spot: bool = SPOT,
    preemptible: bool = PREEMPTIBLE,
    on_demand: bool = ON_DEMAND,
    zone: str | None = typer.Option(None, help="Only this zone (default: the configured zones in order)."),
    runtime: str | None = typer.Option(None, help="Runtime version (default follows the accelerator)."),
    no_wait: bool = typer.Option(False, "--no-wait", help="Return once the create request is accepted."),
    queued: bool = typer.Option(False, "--queued", help="Ask through a queued resource (waits out stockouts)."),
    valid_for: float = typer.Option(3600.0, "--valid-for", min=60, max=7 * 86400,
                                    help="Seconds a queued request may wait."),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Create a TPU VM (or adopt the one of that name) and wait until it is READY."""
    from tpuops import api

    settings = load_settings(ctx, starts=True)
    capacity = capacity_flag(spot, preemptible, on_demand)
    if not dry_run:
        with progress(f"creating {name!r}", quiet=as_json) as show:  # repr: a bad name is still one line
            result = api.up(settings, name, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime,
                            wait=not no_wait, queued=queued, valid_for_s=valid_for, progress=show)
        _report_up(result, as_json)
        return
    if queued:
        print_json(api.plan_up_queued(settings, name, accelerator=accelerator, capacity=capacity, zone=zone,
                                      runtime=runtime, valid_for_s=valid_for))
        return
    plan = api.plan_up(settings, name, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime)
    body = api.create_body(settings, plan)
    if as_json:
        print_json({"zones": plan.zones, "node_id": plan.request.name, "body": body})
        return
    shown = {**body, "metadata": {**body["metadata"], api.MetadataKey.STARTUP_SCRIPT.value: "<below>"}}
    typer.echo(f"# CreateNode {plan.request.name} in {', '.join(plan.zones)} (first that has capacity)")
    typer.echo(json.dumps(shown, indent=2))
    typer.echo("# startup-script")
    typer.echo(plan.startup_script, nl=False)


def _report_up(result: UpResult, as_json: bool) -> None:
    node = result.node
    if as_json:
        print_json({**node.to_json(), "adopted": result.adopted, "stockouts": result.stockouts})
        return
    verb = "adopted" if result.adopted else "created"
    err_console().print(f"{node.name} {verb} in {node.zone}: {node.state.value} "
                        f"({node.accelerator}, {node.capacity.value}, {node.runtime})")


def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print nodes and active runs as JSON."),
) -> None:
    """Nodes in the configured zones (state, health, capacity, age) and the runs still going."""
    from tpuops import api

    settings = load_settings(ctx)
    overview = api.status(settings)
    nodes, active = overview.nodes, overview.runs
    if as_json:
        print_json({"nodes": [n.to_json() for n in nodes], "runs": [r.to_json() for r in active]})
        return
    if nodes:
        rows = [(n.name, n.zone, n.accelerator, _hosts_cell(n.hosts, n.unhealthy_workers), n.capacity.value,
                 n.state.value, n.health, human_age(n.age_s()), "tpuops" if n.managed else "other") for n in nodes]
        print_table(f"nodes in {settings.project} ({', '.join(settings.zones)})",
                    ("name", "zone", "accelerator", "hosts", "capacity", "state", "health", "age", "owner"), rows)
    else:
        err_console().print(f"no nodes in {settings.project} ({', '.join(settings.zones)})")
    if active:
        rows = [r.to_json() for r in active]
        print_table("active runs", ("run", "phase", "step", "examples/s", "input wait", "deterministic",
                                    "last checkpoint", "goodput", "heartbeat"),
                    [(r["run_id"], r["phase"], f"{r['step']}/{r['total_steps'] or '?'}", r["examples_per_sec"] or "",
                      "" if r["input_wait_ms"] is None else f"{r['input_wait_ms']:.1f} ms/step",
                      {True: "on", False: "off"}.get(r["deterministic"], ""),
                      _checkpoint_cell(r), "" if r["goodput"] is None else r["goodput"]["goodput"] or "",
                      r["heartbeat"] or "") for r in rows])
        for r in rows:
            for line in _input_lines(r):
                err_console().print(line, markup=False, soft_wrap=True)
        say_damaged(active)


def _hosts_cell(hosts: int, unhealthy: tuple[int, ...]) -> str:
    """How many hosts the node is, and which of a slice's workers are unhealthy (``4``, ``4 (w2 down)``)."""
    if not unhealthy:
        return str(hosts)
    return f"{hosts} ({', '.join(f'w{w}' for w in unhealthy)} down)"


def _input_lines(run: dict) -> list[str]:
    """What a run's deadline rule and ``every: auto`` rest on, each with where it came from
    (``tpuops.launch.planning``)."""
    inputs = dict(run.get("inputs") or {})
    sizes = inputs.pop("sizes", None) or []
    lines = [f"  {run['run_id']}: {name} {found['value']:.4g} ({found['source']})" for name, found in inputs.items()]
    for size in sizes:  # an elastic run's sizes: each one's hazards, learned or assumed
        lines += [f"  {run['run_id']}: {size['accelerator']} {name} {size[name]['value']:.4g} ({size[name]['source']})"
                  for name in ("hazard_per_hour", "stockouts_per_hour", "spell_s")]
    return lines


def _checkpoint_cell(run: dict) -> str:
    """The last checkpoint whole in the store, the one being written if any, the interval in use and the last
    save's cost (what ``every: auto`` chose the interval for): ``40 (saving 50), every 600 s, save 4.2 s``."""
    saved = str(run["last_checkpoint_step"] if run["last_checkpoint_step"] is not None else "")
    in_flight = run.get("checkpoint_in_flight")
    cell = f"{saved} (saving {in_flight})".strip() if in_flight is not None else saved
    every, cost = run.get("checkpoint_every_s"), run.get("last_save_s")
    parts = [cell, f"every {every:.0f} s" if every else "", f"save {cost:.1f} s" if cost is not None else ""]
    return ", ".join(part for part in parts if part)


def down(
    ctx: typer.Context,
    names: list[str] | None = typer.Argument(None, help="Nodes to delete."),
    all_nodes: bool = typer.Option(False, "--all", help="Delete every node tpuops manages here."),
    orphans: bool = typer.Option(False, "--orphans", help="Delete nodes of runs the store does not know."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    no_wait: bool = typer.Option(False, "--no-wait", help="Return once deletion is requested."),
    as_json: bool = JSON,
) -> None:
    """Delete nodes and wait until they are gone; deleting a missing node is fine. The node of a run still going
    is deleted by stopping its run ('tpuops stop'): asked, or with --yes."""
    from tpuops import api
    from tpuops.core.errors import UsageError

    if orphans:
        reaped = api.reap_orphans(load_settings(ctx))
        if as_json:
            print_json({"reaped": reaped})
        else:
            err_console().print(f"reaped {len(reaped)} orphan node(s){': ' + ', '.join(reaped) if reaped else ''}")
        return
    if bool(names) == all_nodes:
        raise UsageError("name the nodes to delete, or pass --all (not both)")
    settings = load_settings(ctx)
    if all_nodes and not yes and not confirm(
            f"delete every tpuops node in {settings.project} ({', '.join(settings.zones)})?"):
        err_console().print("nothing deleted")
        return
    with progress("deleting", quiet=as_json) as show:
        results = api.down(settings, None if all_nodes else list(names or []), wait=not no_wait, progress=show,
                           confirm_stop=_stopping(yes))
    if as_json:
        print_json({"results": [r.__dict__ for r in results]})
        return
    for r in results:
        where = f" in {r.zone}" if r.zone else ""
        err_console().print(f"{r.name}{where}: {r.outcome}")
    if not results:
        err_console().print("nothing to delete")


def _stopping(yes: bool) -> Callable[[list[str]], bool] | None:
    """Whether ``down`` may stop the runs whose nodes it deletes: yes with --yes, asked on a terminal, else no."""
    if yes:
        return lambda _runs: True
    if not sys.stdin.isatty():
        return None
    return lambda runs: confirm(f"{', '.join(runs)} still going: stop (each checkpoints, then its node is deleted)?")


def exec_command(
    ctx: typer.Context,
    node: str = typer.Argument(..., help="Node name."),
    command: list[str] = typer.Argument(None, metavar="-- CMD...", help="The program and its arguments."),
    worker: str = typer.Option("0", "--worker", metavar="N|all",
                               help="Which worker of a slice (default 0); all: every worker, one after the other."),
    as_json: bool = JSON,
) -> None:
    """Run a program with its arguments, each exactly as given, on a node's workers (as 'gcloud compute tpus tpu-vm
    ssh --worker=W --command' would); exits with the worst worker's code (the highest). With 'all', each output
    line starts with its worker, and each worker's code is shown on stderr. A shell line: -- sh -c 'LINE'."""
    from tpuops import api

    ran = api.exec_on(load_settings(ctx), node, list(command or []), worker=worker)
    if as_json:
        print_json(ran.to_json())
    else:
        many = len(ran.workers) > 1
        for result in ran.workers:
            prefix = f"[w{result.worker}] " if many else ""
            for text, stream in ((result.stdout, sys.stdout), (result.stderr, sys.stderr)):
                for line in text.splitlines():
                    stream.write(f"{prefix}{line}\n")
        if many:
            err_console().print("exit codes: " + ", ".join(f"w{r.worker} {r.code}" for r in ran.workers))
    if ran.exit_code:
        raise typer.Exit(ran.exit_code)
