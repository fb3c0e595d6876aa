"""Jobs on TPU VMs: turn an experiment into a run, launch it, follow it, end it.

A run is declared in the store before any node exists (docs/design.md, "The store is the message
bus"): ``runs/<run>/spec.json`` (the agent's run spec, written once with compare-and-swap
on generation 0 so it is immutable) and ``runs/<run>/run.json`` (what the control plane needs
to recreate the node: accelerator, capacity, zones, bundle digest). The node's startup script
then runs ``templates/fetch_bundle.py``, which checks the bundle's sha256 and starts the agent.
Everything after launch is learnt from ``runs/<run>/status.json``, which the agent rewrites.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tpuops import accelerators
from tpuops.bundle import Bundle, bootstrap_source, build_bundle
from tpuops.config import Settings
from tpuops.data.catalog import read_manifest
from tpuops.data.manifest import MANIFEST, Manifest, parse_manifest
from tpuops.errors import NotFound, UsageError
from tpuops.experiment import Experiment, load_experiment
from tpuops.kinds import Capacity, Provider
from tpuops.ledger import Ledger
from tpuops.provision import UpPlan, plan_up
from tpuops.store import PreconditionFailed, Store, open_store
from tpuops.tpu import NodeRequest

UTC = timezone.utc  # datetime.UTC exists from Python 3.11 only

RUN_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
TERMINAL = ("succeeded", "user-error", "preempted", "crashed")
_AGENT_DTYPES = {"float": "float32", "int64": "int64"}


@dataclass(frozen=True)
class Dataset:
    """A dataset the run reads: where it is in the store and what its records hold."""

    prefix: str
    manifest: Manifest
    local_dir: Path | None

    def patterns(self, store: Store) -> list[str]:
        return [store.uri_of(f"{self.prefix}/{shard.name}") for shard in self.manifest.shards]


@dataclass(frozen=True)
class JobPlan:
    """Everything ``declare`` and ``up`` will write and create, computed without side effects."""

    run_id: str
    experiment: Experiment
    spec: dict[str, Any]
    record: dict[str, Any]
    bundle: Bundle
    datasets: tuple[Dataset, ...]
    up: UpPlan


def new_run_id(name: str, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%m%d-%H%M%S")
    return f"{name}-{stamp}"[:63]


def _dataset(ref: str, store: Store, base: Path) -> Dataset:
    """A local folder with manifest.json (uploaded under data/), or a dataset already in the store."""
    local = (base / ref) if not Path(ref).is_absolute() else Path(ref)
    if (local / MANIFEST).is_file():
        raw = (local / MANIFEST).read_bytes()
        manifest = parse_manifest(raw, str(local / MANIFEST))
        digest = hashlib.sha256(raw).hexdigest()[:12]
        return Dataset(prefix=f"data/{local.name}-{digest}", manifest=manifest, local_dir=local)
    prefix = ref.strip("/")
    try:
        manifest = read_manifest(store, f"{prefix}/{MANIFEST}")
    except NotFound:
        raise UsageError(f"dataset {ref!r}: neither a local folder with {MANIFEST} nor a dataset in the store "
                         f"({store.uri_of(prefix)}); make one with 'tpuops data convert' or "
                         f"'tpuops data sample digits data/digits'") from None
    return Dataset(prefix=prefix, manifest=manifest, local_dir=None)


def _features(manifest: Manifest, where: str) -> dict[str, dict[str, Any]]:
    features = {}
    for name, feature in manifest.features.items():
        if feature.kind == "bytes" and feature.encoding == "raw":
            features[name] = {"dtype": "uint8", "shape": feature.shape, "encoding": "raw"}
        elif feature.kind in _AGENT_DTYPES:
            features[name] = {"dtype": _AGENT_DTYPES[feature.kind], "shape": feature.shape}
        else:
            raise UsageError(f"{where}: feature {name!r} ({feature.kind}, {feature.encoding}) cannot feed a model")
    return features


def plan_train(
    settings: Settings,
    spec_path: Path,
    store: Store,
    *,
    run_id: str | None = None,
    accelerator: str | None = None,
    capacity: Capacity | None = None,
    base_dir: Path | None = None,
    keep: bool = False,
    budget_usd: float | None = None,
) -> JobPlan:
    """Validate the experiment and its data and compute the run; nothing is written or created."""
    experiment, run_id = _experiment_run(spec_path, run_id)
    acc = accelerators.parse_accelerator(accelerator or experiment.accelerator or settings.accelerator)
    base = base_dir or Path.cwd()
    train = _dataset(experiment.dataset.train, store, base)
    evaluation = _dataset(experiment.dataset.eval, store, base) if experiment.dataset.eval else None
    features = _features(train.manifest, experiment.dataset.train)
    if experiment.dataset.label not in features:
        raise UsageError(f"{spec_path}: dataset.label = {experiment.dataset.label!r} is not a feature of "
                         f"{experiment.dataset.train} (it has {', '.join(sorted(features))})")
    bundle = build_bundle(spec_path.resolve().parent)
    spec = _common_spec(settings, store, run_id, experiment, features)
    spec["dataset"].update({
        "train": train.patterns(store),
        "eval": evaluation.patterns(store) if evaluation else [],
        "shuffle_buffer": experiment.dataset.shuffle_buffer,
        "cache": experiment.dataset.cache,
    })
    spec["train"] = {
        "per_replica_batch_size": experiment.batch.per_replica_for(acc.replicas),
        "steps": experiment.steps,
        "steps_per_call": experiment.steps_per_call,
        "checkpoint_every_steps": experiment.checkpoint.every_steps,
        "checkpoint_every_seconds": experiment.checkpoint.every_seconds,
        "keep_checkpoints": experiment.checkpoint.keep,
        "eval_every_steps": experiment.eval.every_steps,
        "eval_steps": experiment.eval.steps,
        "metrics": list(experiment.eval.metrics),
    }
    record = _record(run_id, "train", experiment, spec_path, acc.type, capacity or experiment.capacity, settings,
                     bundle, keep=keep, budget_usd=budget_usd)
    up = _up_for(settings, store, record)
    datasets = tuple(d for d in (train, evaluation) if d is not None)
    return JobPlan(run_id=run_id, experiment=experiment, spec=spec, record=record, bundle=bundle,
                   datasets=datasets, up=up)


def job_argv(store: Store, bundle_sha256: str, run_id: str, command: str) -> list[str]:
    """What the startup script runs on worker 0: the bootstrap that checks and starts the bundle."""
    return ["python3", "-c", bootstrap_source(), store.uri_of(f"bundles/{bundle_sha256}.tar.gz"), bundle_sha256,
            store.uri_of(f"runs/{run_id}/spec.json"), store.uri_of(f"runs/{run_id}/status.json"), command]


def _record(run_id: str, kind: str, experiment: Experiment, spec_path: Path, accelerator: str,
            capacity: Capacity | None, settings: Settings, bundle: Bundle, *, keep: bool,
            budget_usd: float | None) -> dict[str, Any]:
    """The run's record (``run.json``): everything needed to (re)create its node, and its limits."""
    return {
        "run_id": run_id, "kind": kind, "experiment": experiment.name, "spec_file": str(spec_path),
        "node": run_id, "accelerator": accelerator, "capacity": (capacity or settings.capacity).value,
        "zones": list(settings.zones), "bundle_sha256": bundle.sha256,
        "created": datetime.now(UTC).isoformat(timespec="seconds"), "keep": keep, "budget_usd": budget_usd,
        "target": experiment.target.model_dump() if experiment.target and kind == "train" else None,
    }


def _common_spec(settings: Settings, store: Store, run_id: str, experiment: Experiment,
                 features: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": 1,
        "run_id": run_id,
        "store_root": store.uri,
        "entry_point": experiment.model,
        "experiments_dir": "experiments",
        "hparams": experiment.hparams,
        "seed": experiment.seed,
        "mixed_precision": experiment.mixed_precision,
        "allow_cpu_fallback": settings.provider is Provider.LOCAL,
        "dataset": {"features": features, "label": experiment.dataset.label},
    }


def _experiment_run(spec_path: Path, run_id: str | None, suffix: str = "") -> tuple[Experiment, str]:
    experiment = load_experiment(spec_path)
    run_id = run_id or new_run_id(experiment.name + suffix)
    if not RUN_ID.match(run_id):
        raise UsageError(f"run name {run_id!r} is not allowed: use 1-63 lowercase letters, digits and '-', "
                         "starting with a letter")
    return experiment, run_id


def plan_infer(
    settings: Settings,
    spec_path: Path,
    store: Store,
    *,
    checkpoint: str,
    inputs: str,
    output: str | None = None,
    run_id: str | None = None,
    accelerator: str | None = None,
    capacity: Capacity | None = None,
    num_shards: int = 1,
    batch_size: int = 256,
    base_dir: Path | None = None,
    keep: bool = False,
) -> JobPlan:
    """Batch prediction with a trained model over a dataset: same bundle, same launch path as training.

    ``checkpoint`` is a run name (its SavedModel when it succeeded, else its checkpoints) or a
    store URI / path of a SavedModel or checkpoint directory; ``inputs`` a dataset reference
    (local folder with manifest.json, or a store prefix).
    """
    experiment, run_id = _experiment_run(spec_path, run_id, "-infer")
    acc = accelerators.parse_accelerator(accelerator or experiment.accelerator or settings.accelerator)
    dataset = _dataset(inputs, store, base_dir or Path.cwd())
    features = _features(dataset.manifest, inputs)
    model = _model_uri(store, checkpoint)
    bundle = build_bundle(spec_path.resolve().parent)
    spec = _common_spec(settings, store, run_id, experiment, features)
    if experiment.dataset.label not in features:
        spec["dataset"]["label"] = None
    spec["infer"] = {"input": dataset.patterns(store), "model": model, "output_prefix": output,
                     "num_shards": num_shards, "batch_size": batch_size}
    record = _record(run_id, "infer", experiment, spec_path, acc.type, capacity or experiment.capacity, settings,
                     bundle, keep=keep, budget_usd=None)
    up = _up_for(settings, store, record)
    return JobPlan(run_id=run_id, experiment=experiment, spec=spec, record=record, bundle=bundle,
                   datasets=(dataset,), up=up)


def _model_uri(store: Store, checkpoint: str) -> str:
    if RUN_ID.match(checkpoint) and store.exists(f"runs/{checkpoint}/run.json"):
        status = read_status(store, checkpoint) or {}
        kind = "model" if status.get("exit_class") == "succeeded" else "ckpt"
        return store.uri_of(f"runs/{checkpoint}/{kind}")
    if "://" in checkpoint or Path(checkpoint).is_absolute():
        return checkpoint
    raise UsageError(f"--checkpoint {checkpoint!r}: not a run in {store.uri} nor an absolute path or URI "
                     "of a SavedModel or checkpoint directory")


def refuse_over_budget(settings: Settings, ledger: Ledger, plan: JobPlan) -> None:
    """Refuse a launch whose projected cost exceeds what is left of the run's or the project's budget.

    The projection is the node's hourly price times the experiment's ``expected_hours``.
    """
    from tpuops.cost import catalog_for, check_budget, spent

    catalog = catalog_for(settings)
    hourly = catalog.price_per_hour(plan.up.request.accelerator, plan.up.request.capacity, plan.up.zones[0])
    projected = hourly * plan.experiment.expected_hours
    limits = [("run", plan.record.get("budget_usd"), 0.0),
              ("project", settings.budget_usd, spent(ledger, catalog, project=settings.project))]
    for scope, budget, used in limits:
        if budget is None:
            continue
        reason = check_budget(used, projected, float(budget))
        if reason:
            raise UsageError(f"{scope} budget: {reason}; raise the budget or lower expected_hours in the experiment")


def _put_once(store: Store, key: str, data: bytes) -> bool:
    """Write ``key`` only if absent; True if written. An existing key with other bytes is an error."""
    try:
        store.write_if_generation_match(key, data, 0)
        return True
    except PreconditionFailed:
        if store.read_bytes(key) != data:
            raise UsageError(f"{store.uri_of(key)} exists with other content: choose another run name") from None
        return False


def declare(plan: JobPlan, store: Store, settings: Settings, progress: Callable[[str], None]) -> None:
    """Upload data and bundle, write the run's spec and record: after this the run exists."""
    from tpuops.data.upload import upload

    for dataset in plan.datasets:
        if dataset.local_dir is not None:
            progress(f"uploading dataset {dataset.local_dir} to {store.uri_of(dataset.prefix)}")
            upload(dataset.local_dir, open_store(store.uri_of(dataset.prefix)), tpu_zone=settings.zones[0])
    if not store.exists(plan.bundle.key):
        progress(f"uploading bundle {plan.bundle.sha256[:12]} ({len(plan.bundle.data)} bytes)")
        _put_once(store, plan.bundle.key, plan.bundle.data)
    _put_once(store, f"runs/{plan.run_id}/spec.json", (json.dumps(plan.spec, indent=2) + "\n").encode())
    _put_once(store, f"runs/{plan.run_id}/run.json", (json.dumps(plan.record, indent=2) + "\n").encode())


def read_status(store: Store, run_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.read_bytes(f"runs/{run_id}/status.json"))
    except NotFound:
        return None


def read_record(store: Store, run_id: str) -> dict[str, Any]:
    try:
        return json.loads(store.read_bytes(f"runs/{run_id}/run.json"))
    except NotFound:
        raise UsageError(f"no run {run_id!r} in {store.uri} ('tpuops runs' lists them)") from None


class LogTail:
    """Reads the agent's log chunks in order, each once (contract in ``tpuops/agent/logs.py``)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.prefix = f"runs/{run_id}/logs/"
        self.seen = ""

    def new_lines(self) -> list[str]:
        names = sorted(o.key for o in self.store.list(self.prefix) if o.key.endswith(".log") and o.key > self.seen)
        lines: list[str] = []
        for key in names:
            try:
                lines.extend(self.store.read_bytes(key).decode(errors="replace").splitlines())
            except NotFound:
                break
            self.seen = key
        return lines


def plan_resume(settings: Settings, store: Store, run_id: str) -> tuple[dict[str, Any], UpPlan]:
    """The node that continues ``run_id``: same bundle, same run spec, same node name."""
    record = read_record(store, run_id)
    status = read_status(store, run_id) or {}
    if status.get("exit_class") in ("succeeded", "user-error"):
        raise UsageError(f"run {run_id} already ended ({status['exit_class']}): nothing to resume")
    return record, _up_for(settings, store, record)


def _up_for(settings: Settings, store: Store, record: dict[str, Any]) -> UpPlan:
    keep = {"tpuops-keep-node": "true"} if record.get("keep") else None
    return plan_up(settings, record["node"], accelerator=record["accelerator"], capacity=Capacity(record["capacity"]),
                   run_id=record["run_id"], job=job_argv(store, record["bundle_sha256"], record["run_id"],
                                                         record["kind"]), extra_metadata=keep)


def node_request(settings: Settings, store: Store, record: dict[str, Any]) -> NodeRequest:
    """The node a run's record asks for (the controller creates and recreates it from this)."""
    return _up_for(settings, store, record).request


def list_runs(store: Store) -> list[dict[str, Any]]:
    """Every run in the store with its latest status (phase, step, exit class)."""
    runs = []
    for obj in store.list("runs/"):
        parts = obj.key.split("/")
        if len(parts) == 3 and parts[2] == "run.json":
            record = json.loads(store.read_bytes(obj.key))
            status = read_status(store, parts[1]) or {}
            runs.append({**record, "phase": status.get("phase", "pending"), "step": status.get("step", 0),
                         "total_steps": status.get("total_steps"), "exit_class": status.get("exit_class"),
                         "heartbeat": status.get("heartbeat"), "metrics": status.get("metrics", {}),
                         "examples_per_sec": status.get("examples_per_sec"),
                         "last_checkpoint_step": status.get("last_checkpoint_step")})
    return sorted(runs, key=lambda r: r.get("created", ""))
