"""``tpuops train``, ``logs`` and ``runs``: launch a job, watch it, list what ran (and repair or forget a damaged
run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tpuops.cli.common import (
    ACCELERATOR,
    DRY_RUN,
    JSON,
    ON_DEMAND,
    PREEMPTIBLE,
    RESUME,
    SPOT,
    capacity_flag,
    confirm,
    err_console,
    load_settings,
    print_json,
    print_table,
    progress,
    say_damaged,
)
from tpuops.cli.forecasts import print_forecast

STOPPED_EXIT = 3
"""``train``'s exit code when its run was stopped on request (``tpuops stop``, ``down`` of its node, the dashboard):
what the user asked for, so not 1 (a failure), and not 0 either, since the run did not finish (docs/cli.md)."""

if TYPE_CHECKING:
    from tpuops.api import AgentStatus, Finished, Started


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("infer")(infer)
    app.command("logs")(logs)
    app.add_typer(runs_app, name="runs")


def _describe(status: AgentStatus) -> str:
    if status.command == "infer":
        return f"{status.phase}: {status.metrics.get('predicted', 0)} records predicted"
    rate = status.examples_per_sec
    speed = f", {rate:.0f} examples/s" if rate else ""
    saved = f", checkpoint @ {status.last_checkpoint_step}" if status.last_checkpoint_step is not None else ""
    if status.checkpoint_in_flight is not None:
        saved += f", saving checkpoint @ {status.checkpoint_in_flight}"
    return f"{status.phase}: step {status.step}/{status.total_steps or '?'}{speed}{saved}"


def train(
    ctx: typer.Context,
    spec: Path | None = typer.Argument(None, help="Experiment spec, e.g. experiments/digits_cnn.yaml."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: <experiment>-<MMDD-HHMMSS>)."),
    resume: str | None = RESUME,
    accelerator: str | None = ACCELERATOR,
    spot: bool = SPOT,
    preemptible: bool = PREEMPTIBLE,
    on_demand: bool = ON_DEMAND,
    follow_log: bool = typer.Option(False, "--follow", help="Stream the job's log while it runs."),
    detach: bool = typer.Option(False, "--detach", help="Start the run and return; 'tpuops watch' drives it."),
    keep: bool = typer.Option(False, "--keep", help="Leave the node running when the job ends."),
    budget: float | None = typer.Option(None, "--budget", min=0, max=1_000_000,
                                        help="Stop the run when it has cost this (USD)."),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Train on a TPU VM: upload data and code, create the node, recover preemptions, tear down."""
    from tpuops import api
    from tpuops.core.errors import UsageError

    if (spec is None) == (resume is None):
        raise UsageError("give an experiment spec to start a run, or --resume RUN to continue one (not both)")
    _refuse_contradictions(follow=follow_log, detach=detach, dry_run=dry_run)
    settings = load_settings(ctx, starts=True)
    capacity = capacity_flag(spot, preemptible, on_demand)
    if dry_run and resume:
        print_json({"run": api.plan_resume(settings, resume).model_dump(mode="json", exclude={"node": {"metadata"}})})
        return
    if dry_run:
        assert spec is not None
        found = api.forecast_train(settings, spec, name=name, accelerator=accelerator, capacity=capacity, keep=keep,
                                   budget_usd=budget)
        forecast = found.forecast.to_json()
        _print_plan(found.plan, api.create_body(settings, found.plan.up), bundle=True, forecast=forecast)
        if not as_json:
            print_forecast(forecast, found.plan.run_id)
        return

    def call(say: Callable[[str], None], on_status: Callable[[AgentStatus], None]) -> Finished | Started:
        on_log = say if follow_log else None
        if resume:
            return api.resume(settings, resume, detach=detach, progress=say, on_status=on_status, on_log=on_log)
        assert spec is not None
        return api.train(settings, spec, name=name, accelerator=accelerator, capacity=capacity, keep=keep,
                         budget_usd=budget, detach=detach, progress=say, on_status=on_status, on_log=on_log)

    _report(_drive(resume or name or str(spec), as_json, call), as_json)


def _refuse_contradictions(*, follow: bool, detach: bool, dry_run: bool) -> None:
    """Flags that ask for opposite things are a usage error, not a silent choice between them.

    ``--detach`` returns at once, so there is no log to ``--follow``; ``--dry-run`` starts nothing,
    so there is nothing to follow or detach from (it prints the plan and forecast, and returns).
    """
    from tpuops.core.errors import UsageError

    if follow and detach:
        raise UsageError("--follow streams the log until the run ends, --detach returns at once: give one of them")
    if dry_run and (follow or detach):
        flag = "--follow" if follow else "--detach"
        raise UsageError(f"--dry-run starts nothing, so there is nothing to {flag[2:]}: drop {flag} or --dry-run")


def _print_plan(plan: Any, node: dict[str, Any], *, bundle: bool, forecast: dict[str, Any] | None = None) -> None:
    """The plan as JSON; ``node``: what the provider's create would send (``api.create_body``), its payload elided."""
    shown: dict[str, Any] = {"runs": plan.experiment.what_runs(),
                             "run": plan.record.model_dump(mode="json", exclude={"node": {"metadata"}}),
                             "spec": plan.spec_json(), "node": node | {"metadata": "..."}}
    if bundle:
        shown["bundle"] = {"sha256": plan.bundle.sha256, "files": list(plan.bundle.files)}
    if forecast is not None:
        shown["forecast"] = forecast
    print_json(shown)


def _drive(what: str, as_json: bool,
           call: Callable[[Callable[[str], None], Callable[[AgentStatus], None]], Finished | Started]
           ) -> Finished | Started:
    """Run one library call that drives a run, with a progress line for its status and its events printed."""
    console = err_console()
    say = (lambda _text: None) if as_json else _printer(console)
    with progress(f"{what}: starting", quiet=as_json) as show:
        try:
            return call(say, lambda status: show(f"{status.run_id} {_describe(status)}"))
        except KeyboardInterrupt:
            console.print(f"stopped watching {what}; it goes on. 'tpuops watch' recovers it if preempted, "
                          f"'tpuops logs RUN -f' follows it")
            raise typer.Exit(130) from None


def infer(
    ctx: typer.Context,
    spec: Path = typer.Argument(..., help="Experiment spec whose model made the checkpoint."),
    checkpoint: str = typer.Option(..., "--checkpoint", help="Run name, or URI/path of a SavedModel or ckpt dir."),
    inputs: str = typer.Option(..., "--input", help="Dataset: a folder with manifest.json or a store prefix."),
    output: str | None = typer.Option(None, "--output", help="Output prefix (default: runs/<run>/predictions)."),
    shards: int = typer.Option(1, "--shards", min=1, max=100_000, help="Number of output shards."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, max=1_000_000,
                                   help="Global batch of the prediction loop."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: <experiment>-infer-<time>)."),
    accelerator: str | None = ACCELERATOR,
    spot: bool = SPOT,
    preemptible: bool = PREEMPTIBLE,
    on_demand: bool = ON_DEMAND,
    keep: bool = typer.Option(False, "--keep", help="Leave the node running when the job ends."),
    deterministic: bool | None = typer.Option(
        None, "--deterministic/--no-deterministic",
        help="TF op determinism for this run (default: the experiment's 'deterministic', auto = on without a TPU)."),
    latency: bool = typer.Option(False, "--latency",
                                 help="One batch per call, each written as soon as it exists (small batches)."),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Batch prediction (XLA on a TPU) over TFRecords; sharded outputs, a manifest, finished shards kept on rerun."""
    from tpuops import api

    settings = load_settings(ctx, starts=True)
    options = {"checkpoint": checkpoint, "inputs": inputs, "output": output, "name": name, "accelerator": accelerator,
               "capacity": capacity_flag(spot, preemptible, on_demand), "num_shards": shards,
               "batch_size": batch_size, "keep": keep, "deterministic": deterministic,
               "latency": latency}
    if dry_run:
        plan = api.plan_infer(settings, spec, **options)  # type: ignore[arg-type]
        _print_plan(plan, api.create_body(settings, plan.up), bundle=False)
        return
    _report(_drive(name or str(spec), as_json, lambda say, on_status: api.infer(
        settings, spec, progress=say, on_status=on_status, **options)), as_json)  # type: ignore[arg-type]


def _printer(console: Any) -> Any:
    return lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)


def _report(finished: Finished | Started, as_json: bool) -> None:
    from tpuops.api import Started

    if isinstance(finished, Started):
        if as_json:
            print_json({"run_id": finished.run_id, "detached": True})
        else:
            err_console().print(f"run {finished.run_id} started; 'tpuops watch' (or cron 'tpuops reconcile') "
                                f"drives it, 'tpuops status' and 'tpuops logs {finished.run_id} -f' show it")
        return
    status, memory = finished.status, finished.memory
    metrics = status.metrics
    met = finished.target_met()
    if as_json:
        print_json({"run_id": finished.run_id, "exit_class": finished.outcome.value, "step": status.step,
                    "metrics": metrics, "seconds": round(finished.seconds, 1), "target_met": met,
                    "message": finished.reason, "attempts": memory.attempts, "preemptions": memory.preemptions,
                    "restarts": memory.crashes,
                    "goodput": finished.goodput.to_json() if finished.goodput else None})
    else:
        console = err_console()
        shown = ", ".join(f"{split} {name} {value:.4f}" for split in ("eval", "train")
                          for name, value in metrics.get(split, {}).items() if name not in ("step", "first_step"))
        if "predicted" in metrics:
            shown = f"{metrics['predicted']} records predicted (manifest.json written last)"
        console.print(f"{finished.run_id}: {finished.outcome} at step {status.step} after "
                      f"{finished.seconds:.0f} s, {memory.attempts} node(s), {memory.preemptions} preemption(s)"
                      + (f"; {shown}" if shown else ""), markup=False, soft_wrap=True)
        if finished.goodput is not None:
            console.print(finished.goodput.summary(), markup=False, soft_wrap=True)
        if met is not None and finished.record.target:
            console.print(f"target {finished.record.target['metric']} {'met' if met else 'NOT met'}")
    if finished.outcome == "stopped":  # someone asked for it: neither a failure (1) nor a success (0)
        err_console().print(f"{finished.run_id}: stopped on request ({finished.reason or 'tpuops stop'}); its "
                            f"checkpoints stay: 'tpuops train --resume {finished.run_id}' goes on",
                            markup=False, soft_wrap=True)
        raise typer.Exit(STOPPED_EXIT)
    if not finished.succeeded:
        from tpuops.core.errors import UserJobError

        raise UserJobError(f"run {finished.run_id} ended {finished.outcome}: {finished.reason or 'see tpuops logs'}")


def logs(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="Run name."),
    follow_log: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the run ends."),
    worker: str = typer.Option("0", "--worker", metavar="N|all",
                               help="Which worker of a slice (default 0, where the agent runs); all: every "
                                    "worker's lines, each prefixed with its worker."),
) -> None:
    """Print a run's log (the agent's, shipped to the store in chunks); -f follows it across preemptions."""
    from tpuops import api

    for line in api.logs(load_settings(ctx), run_id, follow=follow_log, worker=worker):
        typer.echo(line)


RUN = typer.Argument(..., help="Run name.")
runs_app = typer.Typer(help="List runs in the store with phase, step and outcome; repair or forget a damaged one.")


@runs_app.callback(invoke_without_command=True)
def runs(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print runs as JSON.")) -> None:
    """List runs in the store with phase, step and outcome (a run with a damaged document shows as damaged)."""
    from tpuops import api

    if ctx.invoked_subcommand is not None:
        return
    found = api.list_runs(load_settings(ctx))
    if as_json:
        print_json({"runs": [run.to_json() for run in found]})
        return
    print_table("runs", ("run", "experiment", "accelerator", "hosts", "capacity", "phase", "step", "outcome",
                         "accuracy", "billed", "goodput"),
                [(r.run_id, r.record.experiment, r.accelerator if r.record_known else "?",
                  str(r.hosts or "?"), r.record.node.capacity.value if r.record_known else "?", r.phase,
                  f"{r.status.step if r.status else 0}/{(r.status.total_steps if r.status else None) or '?'}",
                  str(r.outcome or ""), _percent(r.status.eval_metric("accuracy") if r.status else None),
                  f"{r.goodput.billed_s:.0f} s" if r.goodput else "", r.goodput.ratio_text() if r.goodput else "")
                 for r in found])
    say_damaged(found)


@runs_app.command("repair")
def repair(ctx: typer.Context, run_id: str = RUN, dry_run: bool = typer.Option(
        False, "--dry-run", help="Only say what is damaged and what a repair would do."), as_json: bool = JSON) -> None:
    """Say which of a run's documents are damaged and rebuild what can be: its memory from the agent's status, its
    node and the index; a damaged status is set aside (exit 1 when run.json stays damaged: forget the run)."""
    from tpuops import api

    result = api.repair(load_settings(ctx), run_id, dry_run=dry_run)
    diagnosis = result.diagnosis
    if as_json:
        print_json(result.to_json())
    elif not diagnosis.damaged:
        err_console().print(f"run {run_id} is not damaged: nothing to repair")
    else:
        console = err_console()
        for name, why in diagnosis.damage.items():
            console.print(f"{name}: {why}", markup=False, soft_wrap=True)
        for line in diagnosis.repairs() if dry_run else result.done:
            console.print(f"{'would do: ' if dry_run else 'done: '}{line}", markup=False, soft_wrap=True)
    if not diagnosis.repairable:
        raise typer.Exit(1)


@runs_app.command("forget")
def forget(ctx: typer.Context, run_id: str = RUN,
           yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before deleting the run's node."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be deleted and removed."),
           as_json: bool = JSON) -> None:
    """Delete a damaged run's node if it has one (it may be billing), then remove the run from the index."""
    from tpuops import api

    def ask(diagnosis: Any) -> bool:
        node = diagnosis.node
        return yes or confirm(f"delete node {node.name} in {node.zone} ({node.state.value}) of damaged run {run_id}?")

    result = api.forget(load_settings(ctx), run_id, dry_run=dry_run, confirm=ask)
    if as_json:
        print_json(result.to_json())
        return
    node = result.diagnosis.node
    deleting = f"delete node {node.name} in {node.zone}, then " if node is not None else ""
    if result.forgotten:
        err_console().print(f"run {run_id}: {'node ' + node.name + ' deleted; ' if node else ''}"
                            "removed from the index (its files stay in the store)")
    elif dry_run:
        err_console().print(f"would {deleting}remove run {run_id} from the index")
    else:
        err_console().print("nothing done")


def _percent(value: float | None) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else ""
