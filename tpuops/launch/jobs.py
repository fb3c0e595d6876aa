"""Jobs on TPU VMs: turn an experiment into a run and declare it (the launch half of a run's life).

``plan_train`` / ``plan_infer`` validate an experiment and its data and compute, without side
effects, everything the run is: the agent's run spec (built as ``tpuops.contract.runspec.RunSpec``,
the agent's own schema, and checked by its own parser), the run record with the node request
frozen into it (accelerator, runtime, capacity, zones, labels, metadata and the rendered startup
script), and the job bundle. ``declare`` uploads data and bundle and writes the run
(``tpuops.runs.declare``); from then on the controller creates and recreates exactly the frozen
node, whatever tpuops.toml says later. The node's startup script runs ``templates/fetch_bundle.py``,
which checks the bundle's sha256 and starts the agent.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tpuops import runs
from tpuops.config import Settings
from tpuops.contract.interval import FIRST_SAVE_S, young_daly_s
from tpuops.contract.runspec import DatasetSpec, FeatureSpec, InferSpec, RunSpec, ScriptSpec, SpecError, TrainSpec
from tpuops.core.clock import UTC
from tpuops.core.errors import NotFound, UsageError
from tpuops.core.kinds import Capacity, Cloud
from tpuops.core.naming import MetadataKey
from tpuops.core.notices import NotifyChoice
from tpuops.data.inventory import read_manifest
from tpuops.data.manifest import MANIFEST, Manifest, StoredFeature, parse_manifest
from tpuops.launch.bundle import Bundle, build_bundle
from tpuops.launch.experiment import METRICS, Batch, Elastic, Experiment, load_experiment
from tpuops.launch.planning import Learner, keys_of
from tpuops.launch.provision import NodeBasis, UpPlan
from tpuops.launch.usercode import check_experiment, may_compile
from tpuops.providers.registry import offers_of
from tpuops.runs import ExitClass, RunKind, RunRecord
from tpuops.store import Store, open_store

RUN_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
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
    spec: RunSpec
    record: RunRecord
    bundle: Bundle
    datasets: tuple[Dataset, ...]

    @property
    def up(self) -> UpPlan:
        """The node the run asks for (the record's frozen request) and the zones to try in order."""
        return UpPlan(request=self.record.node, zones=list(self.record.node.zones))

    def spec_json(self) -> dict[str, Any]:
        return _checked_spec_json(self.spec)


def _checked_spec_json(spec: RunSpec) -> dict[str, Any]:
    """The run spec as the agent reads it, checked by the agent's own parser (a round trip)."""
    data = runs.spec_json(spec)
    try:
        parsed = RunSpec.from_json(data)
    except SpecError as err:
        raise UsageError(f"run spec of {spec.run_id}: {err}") from None
    if parsed != spec:  # pragma: no cover - a field the schema drops or changes: a bug in this module
        raise AssertionError(f"run spec of {spec.run_id} does not survive the agent's parser")
    return data


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
        return _not_empty(Dataset(prefix=f"data/{local.name}-{digest}", manifest=manifest, local_dir=local), ref)
    prefix = ref.strip("/")
    try:
        manifest = read_manifest(store, f"{prefix}/{MANIFEST}")
    except NotFound:
        raise UsageError(f"dataset {ref!r}: neither a local folder with {MANIFEST} nor a dataset in the store "
                         f"({store.uri_of(prefix)}); make one with 'tpuops data convert' or "
                         f"'tpuops data sample digits data/digits'") from None
    return _not_empty(Dataset(prefix=prefix, manifest=manifest, local_dir=None), ref)


def _not_empty(dataset: Dataset, ref: str) -> Dataset:
    """A dataset whose manifest says it holds no record would only be found empty on a node, after its boot."""
    if dataset.manifest.records == 0:
        raise UsageError(f"dataset {ref!r}: its {MANIFEST} says 0 records: there is nothing to read; convert "
                         "records into it ('tpuops data convert') or name another dataset")
    return dataset


def _features(manifest: Manifest, where: str) -> dict[str, FeatureSpec]:
    features = {}
    for name, feature in manifest.features.items():
        if feature.kind == "bytes" and feature.encoding == "raw":
            features[name] = FeatureSpec(dtype="uint8", shape=tuple(feature.shape), encoding="raw")
        elif feature.kind in _AGENT_DTYPES:
            features[name] = FeatureSpec(dtype=_AGENT_DTYPES[feature.kind], shape=tuple(feature.shape))
        else:
            raise UsageError(f"{where}: feature {name!r} ({feature.kind}, {feature.encoding}) cannot feed a model")
    return features


def _describe(feature: StoredFeature) -> str:
    encoding = f" {feature.encoding} bytes" if feature.encoding else ""
    return f"{feature.dtype}{encoding} of shape {feature.shape}"


def _check_eval_features(experiment: Experiment, train: Manifest, evaluation: Manifest, spec_path: Path) -> None:
    """The built-in parser reads dataset.eval with dataset.train's features: each must be there, alike."""
    where = f"{spec_path}: dataset.eval {experiment.dataset.eval}"
    for name, feature in train.features.items():
        other = evaluation.features.get(name)
        if other is None:
            raise UsageError(f"{where} has no feature {name!r}, which dataset.train {experiment.dataset.train} has: "
                             "both are read with dataset.train's features (convert them alike)")
        if other != feature:
            raise UsageError(f"{where}: feature {name!r} is {_describe(other)}, but {_describe(feature)} in "
                             f"dataset.train {experiment.dataset.train}: both are read with dataset.train's "
                             "features (convert them alike)")


def check_measured(experiment: Experiment, metric: str, what: str, where: Path, experiments_dir: Path, *,
                   has_eval: bool) -> None:
    """Refuse a ``metric`` (a target's, a sweep's objective) that the run would never report, before any node.

    ``where`` is the file named in the message; ``experiments_dir`` holds the model's code. A run reports eval
    metrics only when it evaluates, so only with a dataset.eval (script mode: whatever the script reports,
    unseen here). The built-in loop measures ``eval.metrics``; a model that comes back compiled reports its own
    names instead, so a model whose code may compile itself (``usercode.may_compile``) is trusted with any name.

    Raises:
        UsageError: the metric cannot be measured (one line naming the metrics that are).
    """
    if experiment.program is not None:
        return
    if not has_eval:
        raise UsageError(f"{where}: {what} = {metric!r} cannot be measured: a run evaluates only on dataset.eval, "
                         "and this experiment has none (add dataset.eval)")
    assert experiment.model is not None  # Experiment checks the mode
    measured = experiment.eval.metrics
    if metric in measured or may_compile(experiments_dir, experiment.model):
        return
    hint = f"add {metric} to eval.metrics" if metric in METRICS else f"eval.metrics can hold {', '.join(METRICS)}"
    raise UsageError(f"{where}: {what} = {metric!r} is not an eval metric this run measures: the built-in loop "
                     f"measures eval.metrics = [{', '.join(measured)}] ({hint}), and {experiment.model} comes back "
                     "uncompiled (no compile call in its code), so no metric names of its own")


def _check_batch(experiment: Experiment, batch: Batch, replicas: int, train: Dataset, spec_path: Path) -> None:
    """A global batch larger than the training set repeats records within every step, at a fraction of the
    speed: the built-in parser's batches are records, so this is known before paying."""
    records, per_replica = train.manifest.records, batch.per_replica_for(replicas)
    if per_replica * replicas > records:
        given = (f"batch.per_replica = {per_replica} ({per_replica * replicas} over {replicas} replicas)"
                 if batch.per_replica is not None else f"batch.global = {per_replica * replicas}")
        raise UsageError(f"{spec_path}: {given} is more than the {records} records of dataset.train "
                         f"{experiment.dataset.train}: every step would repeat records; use at most "
                         f"{records // replicas} per replica")


def check_slice_store(settings: Settings, store: Store, accelerator: str) -> None:
    """Refuse a pod run whose store worker 0's host cannot reach: in single-client TensorFlow the checkpoint and
    output ops run on ``/job:worker/task:0``, not where ``tpuops`` runs. Cloud Storage is reachable from every
    host; a path on this machine only from an emulator's workers on this machine (a local cloud, its TPU API
    on loopback)."""
    acc = offers_of(settings.node_provider).shape(accelerator)
    if not acc.multi_host or store.uri.startswith("gs://"):
        return
    host = urlparse(settings.endpoint_url).hostname if settings.endpoint_url else "localhost"
    if settings.cloud is Cloud.LOCAL and (host == "localhost" or (host or "").startswith("127.")):
        return
    raise UsageError(f"{acc.type} is a pod slice whose checkpoints are written on worker 0's host, which cannot "
                     f"reach the store {store.uri} (a path on this machine); use a gs://BUCKET/PREFIX store")


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
    sweep: str | None = None,
    learner: Learner | None = None,
) -> JobPlan:
    """Validate the experiment and its data and compute the run; nothing is written or created.

    ``sweep`` ties the run to a sweep: its record and its node's labels carry the sweep id. ``learner`` gives
    what a deadline or ``every: auto`` rests on (``tpuops.launch.planning``), asked only for such an experiment;
    without one the settings' assumptions apply.
    """
    experiment, run_id = _experiment_run(spec_path, run_id)
    deadline = _deadline(experiment)
    check_experiment(experiment, spec_path.resolve().parent)
    basis = _basis(settings, experiment, accelerator, capacity, keep=keep, sweep=sweep)
    check_slice_store(settings, store, basis.accelerator)
    base = base_dir or Path.cwd()
    train = _dataset(experiment.dataset.train, store, base)
    evaluation = _dataset(experiment.dataset.eval, store, base) if experiment.dataset.eval else None
    features = _features(train.manifest, experiment.dataset.train)
    label = experiment.dataset.label if experiment.dataset.label in features else None
    if label is None and experiment.mode == "model":  # an input_fn or a script may do without one
        raise UsageError(f"{spec_path}: dataset.label = {experiment.dataset.label!r} is not a feature of "
                         f"{experiment.dataset.train} (it has {', '.join(sorted(features))})")
    if evaluation is not None and experiment.mode == "model":
        _check_eval_features(experiment, train.manifest, evaluation.manifest, spec_path)
    if experiment.target is not None:
        check_measured(experiment, experiment.target.metric, "target.metric", spec_path, spec_path.resolve().parent,
                       has_eval=evaluation is not None)
    bundle = build_bundle(spec_path.resolve().parent)
    dataset = DatasetSpec(features=features, label=label, train=train.patterns(store),
                          eval=evaluation.patterns(store) if evaluation else [],
                          shuffle_buffer=experiment.dataset.shuffle_buffer, cache=experiment.dataset.cache)
    record = _record(settings, store, run_id, RunKind.TRAIN, experiment, spec_path, basis, bundle, keep=keep,
                     budget_usd=budget_usd, sweep=sweep, deadline=deadline)
    if accelerator is None and len(experiment.sizes or []) > 1:
        record = _elastic(settings, store, record, experiment, basis, bundle)
    if learner is not None and (deadline or experiment.checkpoint.every == "auto"):
        record = record.model_copy(update={"inputs": learner(keys_of(record))})
    lost_rate = record.inputs.lost_work_per_hour.value if record.inputs else settings.lost_work_per_hour
    program = experiment.program
    if program is not None:
        spec = _run_spec(settings, store, run_id, experiment, dataset, script=ScriptSpec(
            command=program,
            hparams_as_flags=experiment.hparams_as_flags,
            **_schedule(experiment, lost_rate, auto_rate=False),
            keep_checkpoints=experiment.checkpoint.keep,
            total_steps=experiment.steps,
        ))
    else:
        assert experiment.batch is not None and experiment.steps is not None  # Experiment checks the mode
        replicas = offers_of(settings.node_provider).shape(basis.accelerator).replicas  # a global batch's share
        if experiment.mode == "model":  # an input_fn makes its own batches from the records
            _check_batch(experiment, experiment.batch, replicas, train, spec_path)
        per_replica = experiment.batch.per_replica_for(replicas)
        spec = _run_spec(settings, store, run_id, experiment, dataset, train=TrainSpec(
            per_replica_batch_size=per_replica,
            global_batch=_elastic_batch(settings, record, per_replica, replicas),
            steps=experiment.steps,
            steps_per_call=experiment.steps_per_call,
            **_schedule(experiment, lost_rate, auto_rate=True),
            keep_checkpoints=experiment.checkpoint.keep,
            eval_every_steps=experiment.eval.every_steps,
            eval_steps=experiment.eval.steps,
            metrics=tuple(experiment.eval.metrics),
            profile_at_step=experiment.profile.at_step if experiment.profile else None,
            profile_steps=experiment.profile.steps if experiment.profile else 0,
        ))
    datasets = tuple(d for d in (train, evaluation) if d is not None)
    return _checked(JobPlan(run_id=run_id, experiment=experiment, spec=spec, record=record, bundle=bundle,
                            datasets=datasets))


def _checked(plan: JobPlan) -> JobPlan:
    plan.spec_json()  # the agent's parser must accept it now, not on the node
    return plan


def check_notify(settings: Settings, choice: NotifyChoice | None, where: str) -> None:
    """A ``notify:`` naming a target that ``[notify]`` does not configure: one ``UsageError`` line."""
    unknown = [name for name in (choice.to or []) if name not in settings.notify.targets] if choice else []
    if unknown:
        known = ", ".join(sorted(settings.notify.targets)) or "none configured"
        raise UsageError(f"{where}: notify: target {unknown[0]!r} is not in tpuops.toml's [notify.targets] "
                         f"(known: {known})")


def _basis(settings: Settings, experiment: Experiment, accelerator: str | None, capacity: Capacity | None, *,
           keep: bool, sweep: str | None = None) -> NodeBasis:
    """What the run's node is built on (``NodeBasis.of_settings``: the flags, else the experiment, else the config)."""
    return NodeBasis.of_settings(settings, accelerator=accelerator, capacity=capacity, experiment=experiment,
                                 sweep_id=sweep, extra_metadata={MetadataKey.KEEP_NODE.value: "true"} if keep else None)


def _record(settings: Settings, store: Store, run_id: str, kind: RunKind, experiment: Experiment,
            spec_path: Path, basis: NodeBasis, bundle: Bundle, *, keep: bool,
            budget_usd: float | None, sweep: str | None = None,
            deadline: dict[str, float] | None = None) -> RunRecord:
    """The run's record (``run.json``): its node request, frozen now from the current config, and its limits."""
    check_notify(settings, experiment.notify, str(spec_path))
    up = basis.run_node(run_id, kind, store_uri=store.uri, bundle_sha256=bundle.sha256)
    return RunRecord(
        **(deadline or {}),
        run_id=run_id, kind=kind, node=up.frozen(), experiment=experiment.name,
        spec_file=str(spec_path), bundle_sha256=bundle.sha256,
        created=datetime.now(UTC).isoformat(timespec="seconds"), keep=keep, budget_usd=budget_usd,
        target=experiment.target.model_dump() if experiment.target and kind is RunKind.TRAIN else None,
        sweep=sweep, notify=experiment.notify,
    )


def _elastic(settings: Settings, store: Store, record: RunRecord, experiment: Experiment, basis: NodeBasis,
             bundle: Bundle) -> RunRecord:
    """An elastic run's record: its smaller sizes frozen like its largest (``basis``), and how it moves between
    them. A flag's ``--accelerator`` runs one size only, so it never gets here."""
    elastic = experiment.elastic or Elastic()
    smaller = []
    for size in (experiment.sizes or [])[1:]:
        sized = basis.at_size(settings, size)
        check_slice_store(settings, store, sized.accelerator)
        smaller.append(sized.run_node(record.run_id, record.kind, store_uri=store.uri,
                                      bundle_sha256=bundle.sha256).frozen())
    return record.model_copy(update={"smaller": smaller, "elastic_wait_s": elastic.wait_s,
                                     "probe_every_s": elastic.probe_every_s})


def _elastic_batch(settings: Settings, record: RunRecord, per_replica: int, replicas: int) -> int | None:
    """The global batch an elastic run keeps on every size (the agent accumulates gradients on a smaller one:
    ``per_replica x replicas x accumulation = global``), or None for a run of one size. Each smaller size must
    split it into whole micro-batches; one that cannot is refused here, before anything is written."""
    if not record.smaller:
        return None
    global_batch = per_replica * replicas
    offers = offers_of(settings.node_provider)
    for node in record.smaller:
        micro = per_replica * offers.shape(node.accelerator).replicas
        if global_batch % micro:
            raise UsageError(f"accelerator {node.accelerator}: a micro-batch of {per_replica} x "
                             f"{micro // per_replica} replicas = {micro} examples does not divide the global batch "
                             f"{global_batch} of {record.node.accelerator}; list sizes whose replicas divide "
                             f"{replicas}")
    return global_batch


def _schedule(experiment: Experiment, lost_rate: float, *, auto_rate: bool) -> dict[str, Any]:
    """The agent's checkpoint schedule: the experiment's, or for ``every: auto`` by time only, starting at the
    Young/Daly interval of an assumed save at ``lost_rate`` losses an hour (``tpuops.launch.planning``); the built-in
    loop (``auto_rate``) re-chooses it after each save, a script keeps that first interval."""
    every = experiment.checkpoint
    if every.every != "auto":
        return {"checkpoint_every_steps": every.every_steps, "checkpoint_every_seconds": float(every.every_seconds)}
    first = young_daly_s(FIRST_SAVE_S, lost_rate)
    rate = {"checkpoint_loss_rate_per_hour": lost_rate} if auto_rate else {}
    return {"checkpoint_every_steps": 0, "checkpoint_every_seconds": first, **rate}


def _deadline(experiment: Experiment) -> dict[str, float]:
    """The record's deadline fields for a run launched now (``load_experiment`` refused a deadline already passed
    or nearer than the run's ``expected_hours``)."""
    due = experiment.deadline_at(datetime.now(UTC).timestamp())
    return {} if due is None else {"deadline_at": due, "expected_s": experiment.expected_hours * 3600}


def _run_spec(settings: Settings, store: Store, run_id: str, experiment: Experiment, dataset: DatasetSpec, *,
              train: TrainSpec | None = None, infer: InferSpec | None = None,
              script: ScriptSpec | None = None, deterministic: bool | None = None) -> RunSpec:
    """The agent's run spec; ``deterministic`` None leaves op determinism to the experiment's choice."""
    if deterministic is None and experiment.deterministic != "auto":
        deterministic = experiment.deterministic
    return RunSpec(
        run_id=run_id,
        store_root=store.uri,
        dataset=dataset,
        entry_point=experiment.model,
        input_fn=experiment.input,
        experiments_dir="experiments",
        hparams=dict(experiment.hparams),
        seed=experiment.seed,
        mixed_precision=experiment.mixed_precision,
        deterministic=deterministic,
        allow_cpu_fallback=settings.cloud is Cloud.LOCAL,  # a local cloud's nodes run on this CPU
        train=train,
        infer=infer,
        script=script,
    )


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
    deterministic: bool | None = None,
    latency: bool = False,
    open_uri: Callable[[str], Store],
) -> JobPlan:
    """Batch prediction with a trained model over a dataset: same bundle, same launch path as training.

    ``checkpoint`` is a run name (its SavedModel when it succeeded, else its checkpoints) or a
    store URI / path of a SavedModel or checkpoint directory; ``inputs`` a dataset reference
    (local folder with manifest.json, or a store prefix). ``deterministic`` overrides the
    experiment's ``deterministic`` for this run (None: the experiment's); ``latency`` predicts one
    batch per call, each batch written as soon as it exists (small batches, someone waiting).
    """
    experiment, run_id = _experiment_run(spec_path, run_id, "-infer")
    if experiment.program is not None:
        raise UsageError(f"{spec_path}: infer needs a model entry point; this experiment runs a script")
    basis = _basis(settings, experiment, accelerator, capacity, keep=keep)
    check_slice_store(settings, store, basis.accelerator)
    dataset = _dataset(inputs, store, base_dir or Path.cwd())
    features = _features(dataset.manifest, inputs)
    model = _model_uri(open_uri, store, checkpoint)
    bundle = build_bundle(spec_path.resolve().parent)
    label = experiment.dataset.label if experiment.dataset.label in features else None
    spec = _run_spec(settings, store, run_id, experiment, DatasetSpec(features=features, label=label),
                     infer=InferSpec(input=dataset.patterns(store), model=model, output_prefix=output,
                                     num_shards=num_shards, batch_size=batch_size, latency=latency),
                     deterministic=deterministic)
    record = _record(settings, store, run_id, RunKind.INFER, experiment, spec_path, basis, bundle, keep=keep,
                     budget_usd=None)
    return _checked(JobPlan(run_id=run_id, experiment=experiment, spec=spec, record=record, bundle=bundle,
                            datasets=(dataset,)))


_NOT_A_MODEL = ("holds neither a SavedModel (saved_model.pb) nor a TensorFlow checkpoint "
                "(a 'checkpoint' file with its .index and data files)")


def _local_model(folder: Path) -> str:
    """A local SavedModel or checkpoint folder, checked before any node is made for it."""
    if not folder.is_dir():
        raise UsageError(f"--checkpoint {folder}: no such directory (give a SavedModel or checkpoint directory)")
    if not (folder / "saved_model.pb").is_file() and not (folder / "checkpoint").is_file():
        raise UsageError(f"--checkpoint {folder}: {_NOT_A_MODEL}")
    return str(folder)


def _stored_model(open_uri: Callable[[str], Store], uri: str) -> str:
    """A SavedModel or checkpoint folder in a store (``gs://``), checked before any node is made for it.

    Opened as the node would reach it (``open_uri`` is ``session.open_uri`` bound to the settings: on provider
    local only a bucket the emulator or STORAGE_EMULATOR_HOST serves; handed in, so that planning a launch does
    not depend on the wiring), and two object lookups, not a listing of the folder.
    """
    folder = open_uri(uri)
    if not folder.exists("saved_model.pb") and not folder.exists("checkpoint"):
        raise UsageError(f"--checkpoint {uri}: {_NOT_A_MODEL}")
    return uri


_CHECKPOINT_INDEX = re.compile(r"/ckpt-\d+\.index$")
"""A checkpoint the agent can restore is named by its index file (``tpuops.agent.checkpoints.candidates``)."""


def _run_model(store: Store, run_id: str) -> str:
    """A run's SavedModel when it succeeded, else its checkpoints: refused when the store holds neither, as a
    node would only find that out after its boot."""
    status = runs.read_status(store, run_id)
    if status is not None and status.exit_class is ExitClass.SUCCEEDED:
        key = runs.layout.run_key(run_id, "model")
        if store.exists(f"{key}/saved_model.pb"):
            return store.uri_of(key)
    key = runs.layout.run_key(run_id, "ckpt")
    if not any(_CHECKPOINT_INDEX.search(info.key) for info in store.list(f"{key}/")):
        state = f"{status.phase}, step {status.step}" if status is not None else "it has not started"
        raise UsageError(f"--checkpoint {run_id}: the run has no SavedModel and no checkpoint yet ({state}); "
                         "give a run that saved one, or a SavedModel or checkpoint directory")
    return store.uri_of(key)


def _model_uri(open_uri: Callable[[str], Store], store: Store, checkpoint: str) -> str:
    if RUN_ID.match(checkpoint) and runs.run_exists(store, checkpoint):
        return _run_model(store, checkpoint)
    if "://" in checkpoint:
        return _stored_model(open_uri, checkpoint)
    if Path(checkpoint).is_absolute():
        return _local_model(Path(checkpoint))
    raise UsageError(f"--checkpoint {checkpoint!r}: not a run in {store.uri} nor an absolute path or URI "
                     "of a SavedModel or checkpoint directory")


def declare(plan: JobPlan, store: Store, settings: Settings, progress: Callable[[str], None]) -> None:
    """Upload data and bundle, then write the run (spec, record, index): after this the run exists."""
    upload_inputs(plan, store, progress)
    runs.declare(store, plan.record, plan.spec_json())


def upload_inputs(plan: JobPlan, store: Store, progress: Callable[[str], None]) -> None:
    """Upload the plan's local datasets and its bundle, each only once (a sweep's trials share them)."""
    from tpuops.data.upload import upload

    for dataset in plan.datasets:
        if dataset.local_dir is not None:
            progress(f"uploading dataset {dataset.local_dir} to {store.uri_of(dataset.prefix)}")
            upload(dataset.local_dir, open_store(store.uri_of(dataset.prefix)), tpu_zone=plan.up.zones[0])
    if not store.exists(plan.bundle.key):
        progress(f"uploading bundle {plan.bundle.sha256[:12]} ({len(plan.bundle.data)} bytes)")
        runs.ops.put_once(store, plan.bundle.key, plan.bundle.data)


def plan_resume(store: Store, run_id: str) -> RunRecord:
    """The run that ``train --resume`` drives again: same bundle, same run spec, same frozen node (a damaged run
    is refused: ``DamagedDocument``, exit 1)."""
    run = runs.whole_run(store, run_id)
    if run.status is not None and run.status.exit_class is not None and run.status.exit_class.complete:
        raise UsageError(f"run {run_id} already ended ({run.status.exit_class}): nothing to resume")
    return run.record
