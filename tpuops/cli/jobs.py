"""``tpuops train``, ``logs`` and ``runs``: launch a job, watch it, list what ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tpuops.cli.common import err_console, load_settings, print_json, print_table, progress
from tpuops.cli.nodes import capacity_flag


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("infer")(infer)
    app.command("logs")(logs)
    app.command("runs")(runs)


def _describe(status: dict[str, Any]) -> str:
    if status.get("command") == "infer":
        return f"{status.get('phase', '?')}: {status.get('metrics', {}).get('predicted', 0)} records predicted"
    step, total = status.get("step", 0), status.get("total_steps") or "?"
    rate = status.get("examples_per_sec")
    speed = f", {rate:.0f} examples/s" if isinstance(rate, int | float) and rate else ""
    ckpt = status.get("last_checkpoint_step")
    saved = f", checkpoint @ {ckpt}" if ckpt is not None else ""
    return f"{status.get('phase', '?')}: step {step}/{total}{speed}{saved}"


def train(
    ctx: typer.Context,
    spec: Path | None = typer.Argument(None, help="Experiment spec, e.g. experiments/digits_cnn.yaml."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: <experiment>-<MMDD-HHMMSS>)."),
    resume: str | None = typer.Option(None, "--resume", help="Continue this run from its last checkpoint."),
    accelerator: str | None = typer.Option(None, help="Accelerator type (default: spec, then config)."),
    spot: bool = typer.Option(False, "--spot", help="Spot capacity."),
    preemptible: bool = typer.Option(False, "--preemptible", help="Preemptible capacity."),
    on_demand: bool = typer.Option(False, "--on-demand", help="On-demand capacity."),
    follow_log: bool = typer.Option(False, "--follow", help="Stream the job's log while it runs."),
    keep: bool = typer.Option(False, "--keep", help="Leave the node running when the job ends."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print the run; create nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Train on a TPU VM: upload data and code, create the node, follow the job, tear down."""
    from tpuops import jobs
    from tpuops.errors import UsageError
    from tpuops.session import store

    if (spec is None) == (resume is None):
        raise UsageError("give an experiment spec to start a run, or --resume RUN to continue one (not both)")
    settings = load_settings(ctx)
    root = store(settings)
    capacity = capacity_flag(spot, preemptible, on_demand)
    previous_attempt = 0
    if resume:
        record, up_plan = jobs.plan_resume(settings, root, resume)
        run_id = resume
        previous_attempt = int((jobs.read_status(root, resume) or {}).get("attempt") or 0)
    else:
        assert spec is not None
        plan = jobs.plan_train(settings, spec, root, run_id=name, accelerator=accelerator, capacity=capacity)
        run_id, record, up_plan = plan.run_id, plan.record, plan.up
        if dry_run:
            print_json({"run": record, "spec": plan.spec, "bundle": {"sha256": plan.bundle.sha256,
                        "files": list(plan.bundle.files)}, "node": up_plan.request.body() | {"metadata": "..."}})
            return
        with progress(f"declaring run {run_id}", quiet=as_json) as show:
            jobs.declare(plan, root, settings, show)
    if dry_run:
        print_json({"run": record, "node": up_plan.request.body() | {"metadata": "..."}})
        return
    _run_to_end(settings, root, run_id, record, up_plan, previous_attempt=previous_attempt, follow_log=follow_log,
                keep=keep, as_json=as_json)


def _run_to_end(settings: Any, root: Any, run_id: str, record: dict[str, Any], up_plan: Any, *,
                previous_attempt: int, follow_log: bool, keep: bool, as_json: bool) -> None:
    """Create the node, follow the job until it ends, tear the node down, report."""
    from tpuops import jobs
    from tpuops.session import provisioner

    with progress(f"starting {run_id}", quiet=as_json) as show:
        nodes = provisioner(settings, show)
        node = nodes.up(up_plan).node
    console = err_console()
    if not as_json:
        console.print(f"run {run_id} on {node.name} ({node.accelerator}, {node.capacity.value}) in {node.zone}")
    try:
        with progress(f"{run_id}: waiting for the agent", quiet=as_json) as show:
            outcome = jobs.follow(root, nodes, run_id, node.zone, poll_s=max(settings.poll_interval_s, 0.5),
                                  on_status=lambda s: show(f"{run_id} {_describe(s)}"),
                                  after_attempt=previous_attempt,
                                  on_log=_printer(console) if follow_log and not as_json else None)
    except KeyboardInterrupt:
        console.print(f"stopped watching; the run goes on on {node.name}. 'tpuops logs {run_id} --follow' "
                      f"watches it, 'tpuops down {node.name}' ends it")
        raise typer.Exit(130) from None
    if not keep:
        with progress(f"deleting {node.name}", quiet=as_json) as show:
            provisioner(settings, show).down([node.name])
    _report(outcome, record, as_json, kept=keep)


def infer(
    ctx: typer.Context,
    spec: Path = typer.Argument(..., help="Experiment spec whose model made the checkpoint."),
    checkpoint: str = typer.Option(..., "--checkpoint", help="Run name, or URI/path of a SavedModel or ckpt dir."),
    inputs: str = typer.Option(..., "--input", help="Dataset: a folder with manifest.json or a store prefix."),
    output: str | None = typer.Option(None, "--output", help="Output prefix (default: runs/<run>/predictions)."),
    shards: int = typer.Option(1, "--shards", min=1, help="Number of output shards."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Global batch of the prediction loop."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: <experiment>-infer-<time>)."),
    accelerator: str | None = typer.Option(None, help="Accelerator type (default: spec, then config)."),
    spot: bool = typer.Option(False, "--spot", help="Spot capacity."),
    preemptible: bool = typer.Option(False, "--preemptible", help="Preemptible capacity."),
    on_demand: bool = typer.Option(False, "--on-demand", help="On-demand capacity."),
    keep: bool = typer.Option(False, "--keep", help="Leave the node running when the job ends."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print the run; create nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Batch prediction (XLA-compiled) over TFRecords on a TPU VM; sharded outputs and a manifest."""
    from tpuops import jobs
    from tpuops.session import store

    settings = load_settings(ctx)
    root = store(settings)
    plan = jobs.plan_infer(settings, spec, root, checkpoint=checkpoint, inputs=inputs, output=output,
                           run_id=name, accelerator=accelerator, capacity=capacity_flag(spot, preemptible, on_demand),
                           num_shards=shards, batch_size=batch_size)
    if dry_run:
        print_json({"run": plan.record, "spec": plan.spec, "node": plan.up.request.body() | {"metadata": "..."}})
        return
    with progress(f"declaring run {plan.run_id}", quiet=as_json) as show:
        jobs.declare(plan, root, settings, show)
    _run_to_end(settings, root, plan.run_id, plan.record, plan.up, previous_attempt=0, follow_log=False,
                keep=keep, as_json=as_json)


def _printer(console: Any) -> Any:
    return lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)


def _report(outcome: Any, record: dict[str, Any], as_json: bool, *, kept: bool) -> None:
    status = outcome.status or {}
    metrics = status.get("metrics", {})
    target = record.get("target")
    met = None
    if target and outcome.exit_class == "succeeded":
        value = metrics.get("eval", {}).get(target["metric"])
        met = value is not None and (target.get("at_least") is None or value >= target["at_least"]) and (
            target.get("at_most") is None or value <= target["at_most"])
    if as_json:
        print_json({"run_id": outcome.run_id, "exit_class": outcome.exit_class, "step": status.get("step"),
                    "metrics": metrics, "seconds": round(outcome.seconds, 1), "target_met": met,
                    "message": status.get("message"), "node_kept": kept})
    else:
        console = err_console()
        shown = ", ".join(f"{split} {name} {value:.4f}" for split in ("eval", "train")
                          for name, value in metrics.get(split, {}).items() if name != "step")
        if "predicted" in metrics:
            shown = f"{metrics['predicted']} records predicted (manifest.json written last)"
        console.print(f"{outcome.run_id}: {outcome.exit_class} at step {status.get('step', 0)} after "
                      f"{outcome.seconds:.0f} s" + (f"; {shown}" if shown else ""), markup=False, soft_wrap=True)
        if met is not None:
            console.print(f"target {target['metric']} {'met' if met else 'NOT met'}")
    if outcome.exit_class == "preempted":
        from tpuops.errors import Preempted

        raise Preempted(f"run {outcome.run_id} was preempted at step {status.get('step', 0)} (node "
                        f"{outcome.node_state or 'stopped'}); continue it with "
                        f"'tpuops train --resume {outcome.run_id}'")
    if outcome.exit_class != "succeeded":
        from tpuops.errors import UserJobError

        raise UserJobError(f"run {outcome.run_id} ended {outcome.exit_class}: "
                           f"{status.get('message') or 'see tpuops logs ' + outcome.run_id}")


def logs(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="Run name."),
    follow_log: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the run ends."),
) -> None:
    """Print a run's log (the agent's, shipped to the store in chunks)."""
    import time

    from tpuops import jobs
    from tpuops.session import store

    settings = load_settings(ctx)
    root = store(settings)
    jobs.read_record(root, run_id)
    tail = jobs.LogTail(root, run_id)
    while True:
        for line in tail.new_lines():
            typer.echo(line)
        status = jobs.read_status(root, run_id) or {}
        if not follow_log or status.get("exit_class") in jobs.TERMINAL:
            for line in tail.new_lines():
                typer.echo(line)
            return
        time.sleep(max(settings.poll_interval_s, 0.5))


def runs(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print runs as JSON.")) -> None:
    """List runs in the store with phase, step and outcome."""
    from tpuops import jobs
    from tpuops.session import store

    found = jobs.list_runs(store(load_settings(ctx)))
    if as_json:
        print_json({"runs": found})
        return
    print_table("runs", ("run", "experiment", "accelerator", "capacity", "phase", "step", "outcome", "accuracy"),
                [(r["run_id"], r.get("experiment"), r.get("accelerator"), r.get("capacity"), r["phase"],
                  f"{r['step']}/{r.get('total_steps') or '?'}", r.get("exit_class") or "",
                  _percent(r.get("metrics", {}).get("eval", {}).get("accuracy"))) for r in found])


def _percent(value: float | None) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else ""
