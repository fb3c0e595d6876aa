"""``tpuops sweep start``: validate a sweep, plan its trials' run template, then declare it.

Planning has no side effects (``--dry-run`` prints it). Declaring uploads the experiment's data
and bundle once, writes the sweep's record, creates its study, enqueues a grid's points (in
``spec.grid_points`` order) and puts the sweep on the active list: from then on every reconcile
pass, on any machine that shares the store, advances it. The trials' runs come from the frozen
template (``tpuops.sweeps.template``), so a pass needs neither the experiment file, nor the data
folder, nor the config of the moment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tpuops.billing.cost import catalog_for
from tpuops.config import Settings
from tpuops.core.clock import UTC
from tpuops.core.errors import UsageError
from tpuops.launch import jobs
from tpuops.launch.planning import Learner
from tpuops.store import Store
from tpuops.sweeps import ops, studies
from tpuops.sweeps.models import SweepRecord
from tpuops.sweeps.spec import SweepSpec, experiment_path, grid_points, load_sweep
from tpuops.sweeps.template import TrialTemplate, trial_run_id


@dataclass(frozen=True)
class SweepPlan:
    spec: SweepSpec
    job: jobs.JobPlan
    template: TrialTemplate
    projected_usd: float
    """One trial: the node's price per hour times the experiment's ``expected_hours``."""

    def record(self) -> SweepRecord:
        return SweepRecord(spec=self.spec, template=self.template, projected_usd=self.projected_usd,
                           experiment=self.job.record.spec_file,
                           created=datetime.now(UTC).isoformat(timespec="seconds"))

    def summary(self) -> dict[str, Any]:
        spec = self.spec
        return {"sweep": spec.name, "experiment": self.job.record.spec_file, "params": spec.params,
                "trials": spec.trials, "parallel": spec.parallel, "sampler": spec.sampler.type,
                "pruner": spec.pruner.type, "objective": spec.objective.model_dump(),
                "accelerator": self.job.record.node.accelerator, "capacity": self.job.record.node.capacity.value,
                "projected_usd_per_trial": round(self.projected_usd, 6), "budget_usd": spec.budget_usd,
                "storage": spec.storage.kind, "first_runs": [trial_run_id(spec.name, n) for n in range(spec.parallel)]}


def plan_sweep(settings: Settings, path: Path, store: Store, *, base_dir: Path | None = None,
               learner: Learner | None = None) -> SweepPlan:
    """Validate the sweep, its experiment and its data; compute the trials' run template. Nothing is written.

    Refused here, so before any upload and by ``--dry-run`` too: a budget that cannot pay for one
    trial, and a name a sweep in the store has already.
    """
    spec = load_sweep(path)
    jobs.check_notify(settings, spec.notify, str(path))
    experiment = experiment_path(path, spec)
    job = jobs.plan_train(settings, experiment, store, run_id=trial_run_id(spec.name, 0),
                          accelerator=spec.accelerator, capacity=spec.capacity, base_dir=base_dir, sweep=spec.name,
                          learner=learner)
    train = job.spec.train
    assert train is not None
    jobs.check_measured(job.experiment, spec.objective.metric, "objective.metric", path, experiment.parent,
                        has_eval=bool(job.spec.dataset.eval))
    unknown = sorted(set(spec.params) - {"learning_rate", "optimizer"} - set(job.spec.hparams))
    if unknown:
        raise UsageError(f"{path}: {unknown[0]!r} is not an hparam of {experiment.name} "
                         f"(it has {', '.join(sorted(job.spec.hparams))})")
    if spec.eval_every_steps:
        job = dataclasses.replace(job, spec=dataclasses.replace(
            job.spec, train=dataclasses.replace(train, eval_every_steps=spec.eval_every_steps)))
    hourly = catalog_for(settings).price_per_hour(job.up.request.accelerator, job.up.request.capacity, job.up.zones[0])
    projected = hourly * job.experiment.expected_hours
    if spec.budget_usd is not None and projected > spec.budget_usd:
        hours = job.experiment.expected_hours
        raise UsageError(f"{path}: budget_usd = {spec.budget_usd} cannot pay for one trial (projected "
                         f"{projected:.2f} USD: {hourly:.2f} USD/h for expected_hours = {hours} of {experiment.name}); "
                         "raise budget_usd or lower expected_hours")
    if store.exists(ops.record_key(spec.name)):  # checked here so that --dry-run says it too
        raise UsageError(f"{path}: a sweep named {spec.name!r} exists already in {store.uri}: choose another name "
                         f"('tpuops sweep status {spec.name}' shows it)")
    template = TrialTemplate(record=job.record, spec=job.spec, project=settings.project,
                             store_root=settings.store_root)
    return SweepPlan(spec=spec, job=job, template=template, projected_usd=projected)


def start_sweep(plan: SweepPlan, store: Store, progress: Callable[[str], None], *, upload: bool = True) -> None:
    """Upload, declare the sweep, create its study (and enqueue a grid): the next pass launches trials.

    ``upload=False`` (a simulation, whose agents read no data) declares without uploading data or bundle.
    """
    spec = plan.spec
    storage = studies.open_storage(spec, store)  # fails here, before anything is written, on a bad database
    if upload:
        jobs.upload_inputs(plan.job, store, progress)
    ops.declare_sweep(store, plan.record())
    study = studies.create_study(spec, storage)
    for point in grid_points(spec.grid)[:spec.trials]:
        study.enqueue_trial(point, skip_if_exists=False)
    ops.mark_active(store, spec.name)
    progress(f"sweep {spec.name} declared: {spec.trials} trials, {spec.parallel} at a time")
