"""``tpuops train``, ``logs`` and ``runs``: launch a job, watch it, list what ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tpuops.cli.common import (
    ACCELERATOR,
    DRY_RUN,
    JSON,
    ON_DEMAND,
    PREEMPTIBLE,
    SPOT,
    err_console,
    load_settings,
    print_json,
    print_table,
    progress,
)
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
    resume: str | None = typer.Option(None, "--resume", help="Drive this run again from its last checkpoint."),
    accelerator: str | None = ACCELERATOR,
    spot: bool = SPOT,
    preemptible: bool = PREEMPTIBLE,
    on_demand: bool = ON_DEMAND,
    follow_log: bool = typer.Option(False, "--follow", help="Stream the job's log while it runs."),
    detach: bool = typer.Option(False, "--detach", help="Start the run and return; 'tpuops watch' drives it."),
    keep: bool = typer.Option(False, "--keep", help="Leave the node running when the job ends."),
    budget: float | None = typer.Option(None, "--budget", min=0, help="Stop the run when it has cost this (USD)."),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Train on a TPU VM: upload data and code, create the node, recover preemptions, tear down."""
    from tpuops import jobs
    from tpuops.errors import UsageError
    from tpuops.session import store

    if (spec is None) == (resume is None):
        raise UsageError("give an experiment spec to start a run, or --resume RUN to continue one (not both)")
    settings = load_settings(ctx)
    root = store(settings)
    if resume:
        jobs.plan_resume(settings, root, resume)
        if not dry_run:
            _reopen(root, resume)
        run_id = resume
    else:
        assert spec is not None
        plan = jobs.plan_train(settings, spec, root, run_id=name, accelerator=accelerator,
                               capacity=capacity_flag(spot, preemptible, on_demand), keep=keep, budget_usd=budget)
        run_id = plan.run_id
        if dry_run:
            print_json({"run": plan.record, "spec": plan.spec, "bundle": {"sha256": plan.bundle.sha256,
                        "files": list(plan.bundle.files)}, "node": plan.up.request.body() | {"metadata": "..."}})
            return
        from tpuops.session import open_ledger

        jobs.refuse_over_budget(settings, open_ledger(settings), plan)
        with progress(f"declaring run {run_id}", quiet=as_json) as show:
            jobs.declare(plan, root, settings, show)
    if dry_run:
        print_json({"run": jobs.read_record(root, run_id)})
        return
    _drive(settings, root, run_id, follow_log=follow_log, detach=detach, as_json=as_json)


def _reopen(root: Any, run_id: str) -> None:
    """Make a run that ended crashed, failed or out of budget active again (its checkpoints stay)."""
    import time

    from tpuops.controller import memory as memories

    memory, generation = memories.load(root, run_id)
    if memory.phase == "finished":
        memory.phase, memory.outcome, memory.reason, memory.crashes = "active", None, None, 0
        memory.event(time.time(), "reopened", "tpuops train --resume")
        memories.save(root, run_id, memory, generation)


def _drive(settings: Any, root: Any, run_id: str, *, follow_log: bool, detach: bool, as_json: bool) -> None:
    """Be the controller of this run until it ends (or only start it, with ``detach``); report."""
    from tpuops import jobs
    from tpuops.controller.drive import drive
    from tpuops.controller.reconcile import Controller
    from tpuops.session import connect, open_ledger

    console = err_console()
    say = (lambda _text: None) if as_json else _printer(console)
    with progress(f"{run_id}: starting", quiet=as_json) as show:
        controller = Controller(settings, root, connect(settings), open_ledger(settings), progress=say)
        if detach:
            try:
                controller.run_pass(only=run_id)
            finally:
                controller.release()
            if as_json:
                print_json({"run_id": run_id, "detached": True})
            else:
                console.print(f"run {run_id} started; 'tpuops watch' (or cron 'tpuops reconcile') drives it, "
                              f"'tpuops status' and 'tpuops logs {run_id} -f' show it")
            return
        try:
            finished = drive(controller, run_id, poll_s=max(settings.poll_interval_s, 0.5),
                             on_status=lambda s: show(f"{run_id} {_describe(s)}"),
                             on_log=say if follow_log else None)
        except KeyboardInterrupt:
            console.print(f"stopped watching {run_id}; it goes on. 'tpuops watch' recovers it if preempted, "
                          f"'tpuops logs {run_id} -f' follows it")
            raise typer.Exit(130) from None
    _report(finished, jobs.read_record(root, run_id), as_json)


def infer(
    ctx: typer.Context,
    spec: Path = typer.Argument(..., help="Experiment spec whose model made the checkpoint."),
    checkpoint: str = typer.Option(..., "--checkpoint", help="Run name, or URI/path of a SavedModel or ckpt dir."),
    inputs: str = typer.Option(..., "--input", help="Dataset: a folder with manifest.json or a store prefix."),
    output: str | None = typer.Option(None, "--output", help="Output prefix (default: runs/<run>/predictions)."),
    shards: int = typer.Option(1, "--shards", min=1, help="Number of output shards."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Global batch of the prediction loop."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: <experiment>-infer-<time>)."),
    accelerator: str | None = ACCELERATOR,
    spot: bool = SPOT,
    preemptible: bool = PREEMPTIBLE,
    on_demand: bool = ON_DEMAND,
    keep: bool = typer.Option(False, "--keep", help="Leave the node running when the job ends."),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Batch prediction (XLA-compiled) over TFRecords on a TPU VM; sharded outputs and a manifest."""
    from tpuops import jobs
    from tpuops.session import store

    settings = load_settings(ctx)
    root = store(settings)
    plan = jobs.plan_infer(settings, spec, root, checkpoint=checkpoint, inputs=inputs, output=output,
                           run_id=name, accelerator=accelerator, capacity=capacity_flag(spot, preemptible, on_demand),
                           num_shards=shards, batch_size=batch_size, keep=keep)
    if dry_run:
        print_json({"run": plan.record, "spec": plan.spec, "node": plan.up.request.body() | {"metadata": "..."}})
        return
    with progress(f"declaring run {plan.run_id}", quiet=as_json) as show:
        jobs.declare(plan, root, settings, show)
    _drive(settings, root, plan.run_id, follow_log=False, detach=False, as_json=as_json)


def _printer(console: Any) -> Any:
    return lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)


def _report(finished: Any, record: dict[str, Any], as_json: bool) -> None:
    status = finished.status or {}
    metrics = status.get("metrics", {})
    target = record.get("target")
    met = None
    if target and finished.outcome == "succeeded":
        value = metrics.get("eval", {}).get(target["metric"])
        met = value is not None and (target.get("at_least") is None or value >= target["at_least"]) and (
            target.get("at_most") is None or value <= target["at_most"])
    memory = finished.memory
    if as_json:
        print_json({"run_id": finished.run_id, "exit_class": finished.outcome, "step": status.get("step"),
                    "metrics": metrics, "seconds": round(finished.seconds, 1), "target_met": met,
                    "message": finished.reason, "attempts": memory.attempts, "preemptions": memory.preemptions,
                    "restarts": memory.crashes})
    else:
        console = err_console()
        shown = ", ".join(f"{split} {name} {value:.4f}" for split in ("eval", "train")
                          for name, value in metrics.get(split, {}).items() if name != "step")
        if "predicted" in metrics:
            shown = f"{metrics['predicted']} records predicted (manifest.json written last)"
        console.print(f"{finished.run_id}: {finished.outcome} at step {status.get('step', 0)} after "
                      f"{finished.seconds:.0f} s, {memory.attempts} node(s), {memory.preemptions} preemption(s)"
                      + (f"; {shown}" if shown else ""), markup=False, soft_wrap=True)
        if met is not None:
            console.print(f"target {target['metric']} {'met' if met else 'NOT met'}")
    if finished.outcome != "succeeded":
        from tpuops.errors import UserJobError

        raise UserJobError(f"run {finished.run_id} ended {finished.outcome}: {finished.reason or 'see tpuops logs'}")


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
