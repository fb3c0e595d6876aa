"""``tpuops.launch.jobs``: planning and declaring a run, without servers or TensorFlow.

The run spec is built through the agent's own schema and must survive the agent's parser; the
node request is frozen into the record at plan time (later config changes cannot reach it); a
declared run is in the store and in the index of active runs; bad input is one clear error and
writes nothing.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from helpers import REPO

from tpuops import runs
from tpuops.config import Settings
from tpuops.contract.runspec import RunSpec
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.core.resources import agent_pins, pin_file_text
from tpuops.data.samples import digits
from tpuops.launch import jobs
from tpuops.runs import RunKind
from tpuops.session import open_uri
from tpuops.store import LocalStore

pytestmark = pytest.mark.unit

ZONES = ["us-central1-a", "us-central1-b"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with the digits data and the digits experiment."""
    work = tmp_path_factory.mktemp("jobs")
    digits(work / "data" / "digits")
    shutil.copytree(REPO / "experiments", work / "experiments",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return work


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(zones=ZONES, home=tmp_path / "home", store=str(tmp_path / "store"), labels={"team": "ml"})


@pytest.fixture
def store(settings: Settings) -> LocalStore:
    return LocalStore(Path(settings.store_root))


def plan(work: Path, settings: Settings, store: LocalStore, **options: object) -> jobs.JobPlan:
    return jobs.plan_train(settings, work / "experiments" / "digits_cnn.yaml", store, run_id="digits-1",
                           base_dir=work, **options)  # type: ignore[arg-type]


def test_the_run_spec_is_the_agents_own_schema_and_survives_its_parser(work: Path, settings: Settings,
                                                                     store: LocalStore) -> None:
    made = plan(work, settings, store)
    data = made.spec_json()
    assert RunSpec.from_json(json.loads(json.dumps(data))) == made.spec
    assert made.spec.train is not None and made.spec.train.steps == 600
    assert made.spec.train.per_replica_batch_size == 64 and made.spec.entry_point == "models:digits_cnn"
    assert made.spec.allow_cpu_fallback  # provider local
    assert all(p.startswith(store.uri + "/data/train-") for p in made.spec.dataset.train)
    assert made.spec.dataset.label == "label" and made.spec.dataset.eval


def test_the_record_freezes_the_node_request_at_plan_time(work: Path, settings: Settings,
                                                          store: LocalStore) -> None:
    made = plan(work, settings, store, capacity=Capacity.ON_DEMAND, keep=True, sweep="sweep-7")
    record = made.record
    assert (record.kind, record.node.name, record.node.accelerator, record.node.runtime) == \
        (RunKind.TRAIN, "digits-1", "v3-8", "tpu-vm-tf-2.9.3")
    assert record.node.capacity is Capacity.ON_DEMAND and record.zones == ZONES
    assert record.node.labels == {"team": "ml", "managed-by": "tpuops", "tpuops-run": "digits-1",
                                  "tpuops-sweep": "sweep-7"}
    assert record.sweep == "sweep-7" and record.keep
    assert record.node.metadata[MetadataKey.KEEP_NODE] == "true"
    script = record.node.metadata["startup-script"]
    assert made.bundle.sha256 in script and "runs/digits-1/spec.json" in script
    assert made.up.request == record.node and made.up.zones == ZONES


def test_declare_writes_the_run_once_and_indexes_it(work: Path, settings: Settings, store: LocalStore) -> None:
    made = plan(work, settings, store)
    jobs.declare(made, store, settings, lambda _text: None)
    assert runs.read_record(store, "digits-1") == made.record
    assert json.loads(store.read_bytes(runs.spec_key("digits-1"))) == made.spec_json()
    assert store.exists(made.bundle.key)
    assert runs.active_run_ids(store) == ["digits-1"]
    jobs.declare(made, store, settings, lambda _text: None)  # the same run again: nothing changes
    assert runs.all_run_ids(store) == ["digits-1"]


def test_resume_refuses_a_run_that_ended_for_good(work: Path, settings: Settings, store: LocalStore) -> None:
    made = plan(work, settings, store)
    jobs.declare(made, store, settings, lambda _text: None)
    assert jobs.plan_resume(store, "digits-1") == made.record
    store.write_bytes(runs.status_key("digits-1"), b'{"attempt": 1, "phase": "done", "exit_class": "succeeded"}')
    with pytest.raises(UsageError, match="run digits-1 already ended \\(succeeded\\): nothing to resume"):
        jobs.plan_resume(store, "digits-1")


@pytest.mark.parametrize(("options", "message"), [
    ({"run_id": "Bad_Name"}, "run name 'Bad_Name' is not allowed"),
    ({"accelerator": "v9-8"}, "accelerator 'v9-8' is not a Cloud TPU type"),
])
def test_bad_input_is_one_clear_error_and_writes_nothing(work: Path, settings: Settings, store: LocalStore,
                                                         options: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        jobs.plan_train(settings, work / "experiments" / "digits_cnn.yaml", store, base_dir=work,
                        **{"run_id": "ok-1", **options})  # type: ignore[arg-type]
    assert store.list("") == []


def test_a_dataset_that_is_neither_local_nor_in_the_store_is_named(work: Path, settings: Settings,
                                                                   store: LocalStore, tmp_path: Path) -> None:
    spec = tmp_path / "experiments" / "nodata.yaml"
    spec.parent.mkdir()
    shutil.copy(work / "experiments" / "models.py", spec.parent / "models.py")
    spec.write_text((work / "experiments" / "digits_cnn.yaml").read_text().replace("data/digits/train", "nowhere"))
    with pytest.raises(UsageError, match=r"dataset 'nowhere': neither a local folder with manifest\.json"):
        jobs.plan_train(settings, spec, store, run_id="ok-1", base_dir=work)


def _with_determinism(work: Path, tmp_path: Path, value: str) -> Path:
    """The digits experiment with ``deterministic: value``, next to its models module."""
    spec = tmp_path / "experiments" / "digits_cnn.yaml"
    spec.parent.mkdir(exist_ok=True)
    shutil.copy(work / "experiments" / "models.py", spec.parent / "models.py")
    spec.write_text((work / "experiments" / "digits_cnn.yaml").read_text() + f"deterministic: {value}\n")
    return spec


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("false", False), ("auto", None)])
def test_the_experiments_determinism_reaches_the_run_spec(work: Path, settings: Settings, store: LocalStore,
                                                         tmp_path: Path, value: str, expected: bool | None) -> None:
    made = jobs.plan_train(settings, _with_determinism(work, tmp_path, value), store, run_id="det-1", base_dir=work)
    assert made.spec.deterministic is expected  # None: the agent's auto rule (on without a TPU)
    assert RunSpec.from_json(made.spec_json()).deterministic is expected


@pytest.mark.parametrize("override", [True, False, None])
def test_infer_overrides_the_experiments_determinism(work: Path, settings: Settings, store: LocalStore,
                                                     tmp_path: Path, override: bool | None) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "saved_model.pb").write_bytes(b"")  # a local checkpoint must be there before anything is planned
    made = jobs.plan_infer(settings, _with_determinism(work, tmp_path, "true"), store, checkpoint=str(model),
                           inputs="data/digits/test", run_id="det-infer-1", base_dir=work, deterministic=override,
                           latency=override is True, open_uri=functools.partial(open_uri, settings))
    assert made.spec.deterministic is (True if override is None else override)
    assert made.spec.require_infer().latency is (override is True)
    assert RunSpec.from_json(made.spec_json()).require_infer().latency is (override is True)


def test_only_an_infer_node_is_told_to_install_the_agent_pins(work: Path, settings: Settings, store: LocalStore,
                                                              tmp_path: Path) -> None:
    """A training job's boot needs no package index; an infer job's installs orjson where the image lacks it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "saved_model.pb").write_bytes(b"")
    spec = _with_determinism(work, tmp_path, "auto")
    inferred = jobs.plan_infer(settings, spec, store, checkpoint=str(model), inputs="data/digits/test",
                               run_id="pins-infer-1", base_dir=work, open_uri=functools.partial(open_uri, settings))
    trained = jobs.plan_train(settings, spec, store, run_id="pins-train-1", base_dir=work)
    script = MetadataKey.STARTUP_SCRIPT.value
    pins = " ".join(agent_pins(pin_file_text()))
    assert f"\nAGENT_PINS=({pins})\n" in inferred.record.node.metadata[script]
    assert "\nAGENT_PINS=()\n" in trained.record.node.metadata[script]


def test_a_determinism_that_is_not_true_false_or_auto_is_one_clear_error(work: Path, settings: Settings,
                                                                        store: LocalStore, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"deterministic = 'sometimes' is not allowed: .*True, False or 'auto'"):
        jobs.plan_train(settings, _with_determinism(work, tmp_path, "sometimes"), store, run_id="ok-1", base_dir=work)
    assert store.list("") == []


def test_a_compiled_models_own_metric_and_the_edges_of_the_ranges_are_planned(work: Path, settings: Settings,
                                                                              store: LocalStore,
                                                                              tmp_path: Path) -> None:
    """What the pre-launch checks must not refuse: a target on a compiled model's own metric name (``mae``: its
    module calls compile), a seed of 2**32 - 1, 10**12 steps, a global batch just within the training set."""
    spec = tmp_path / "experiments" / "edges.yaml"
    spec.parent.mkdir()
    for module in ("models.py", "regression.py"):
        shutil.copy(work / "experiments" / module, spec.parent / module)
    spec.write_text((work / "experiments" / "digits_cnn.yaml").read_text()
                    .replace("models:digits_cnn", "regression:diabetes_mlp").replace("metric: accuracy", "metric: mae")
                    .replace("steps: 600", "steps: 1000000000000\nseed: 4294967295")
                    .replace("per_replica: 64", "global: 1432"))  # 179 on each of v3-8's 8 replicas, of 1437
    made = jobs.plan_train(settings, spec, store, run_id="edges-1", base_dir=work)
    assert (made.spec.seed, made.spec.require_train().steps, made.record.target) == (
        4294967295, 10**12, {"metric": "mae", "at_least": 0.95, "at_most": None})
    assert store.list("") == []
