"""A sweep's trials come from the template frozen at ``sweep start``, never from the config of the moment.

Editing ``tpuops.toml`` mid-sweep (zones, labels, service account, accelerator, project, run-time
limit) changes no later trial's node request: each trial's node is exactly the one the config of
``sweep start`` plans for that trial's name. A ``sweep.json`` from before the template froze the
project and store root is upgraded once (by ``sweep repair`` or the next pass) and then gives the
same trials.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import REPO

from tpuops import api, runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings, load_settings
from tpuops.core.errors import DamagedDocument
from tpuops.data.samples import digits
from tpuops.launch.bundle import job_argv
from tpuops.launch.provision import plan_up
from tpuops.runs import NodeSpec
from tpuops.store import LocalStore, Store
from tpuops.store.lease import Leases
from tpuops.sweeps import ops
from tpuops.sweeps.advance import SweepPass
from tpuops.sweeps.models import SweepRecord
from tpuops.sweeps.start import plan_sweep, start_sweep
from tpuops.sweeps.template import trial_run_id

pytestmark = pytest.mark.unit

SWEEP = """
name: frozen
experiment: ../experiments/digits_cnn.yaml
space:
  learning_rate: {type: float, low: 0.001, high: 0.1, log: true}
sampler: {type: random, seed: 5}
trials: 4
parallel: 2
"""
BEFORE = """
project = "before-project"
zones = ["us-central1-a", "us-central1-b"]
accelerator = "v3-8"
labels = {team = "vision"}
service_account = "trainer@before-project.iam.gserviceaccount.com"
max_run_hours = 10
"""
AFTER = """
project = "after-project"
zones = ["europe-west4-a"]
accelerator = "v2-8"
labels = {team = "speech", cost-center = "42"}
service_account = "other@after-project.iam.gserviceaccount.com"
max_run_hours = 2
"""


class Work:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "tpuops.toml"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")},
                    "TPUOPS_HOME": str(root / "home"), "TPUOPS_STORE": str(root / "store")}

    def settings(self, text: str) -> Settings:
        self.config.write_text(text)
        return load_settings(config_path=self.config, environ=self.env)

    def started(self, text: str) -> tuple[Settings, Store]:
        """Settings from ``text``, their store, and the ``frozen`` sweep started in it (no pass yet)."""
        from tpuops.session import store

        settings = self.settings(text)
        root = store(settings)
        start_sweep(plan_sweep(settings, self.root / "sweeps" / "frozen.yaml", root, base_dir=self.root), root,
                    lambda _: None)
        return settings, root


@pytest.fixture
def work(tmp_path: Path) -> Work:
    digits(tmp_path / "data" / "digits")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "experiments" / "models.py").write_text((REPO / "experiments" / "models.py").read_text())
    experiment = (REPO / "experiments" / "digits_cnn.yaml").read_text()
    assert "accelerator: v3-8\n" in experiment  # the config names the accelerator, not the experiment
    (tmp_path / "experiments" / "digits_cnn.yaml").write_text(experiment.replace("accelerator: v3-8\n", ""))
    (tmp_path / "sweeps" / "frozen.yaml").write_text(SWEEP)
    return Work(tmp_path)


def _pass(settings: Settings, store: LocalStore) -> None:
    ledger = Ledger(settings.ledger_path)
    SweepPass(settings, store, ledger, Leases(store, "test", ttl_s=60), held=set(), progress=lambda _: None).run()


def _finish(store: LocalStore, run_id: str) -> None:
    memory, generation = runs.load_memory(store, run_id)
    memory.finish(0.0, runs.Outcome.SUCCEEDED, "test")
    runs.save_memory(store, run_id, memory, generation)


def _planned(settings: Settings, store: LocalStore, record: runs.RunRecord) -> NodeSpec:
    """The node the given config plans for this run, as ``jobs`` plans any run's."""
    up = plan_up(settings, record.run_id, accelerator=settings.accelerator, capacity=record.node.capacity,
                 run_id=record.run_id, sweep_id=record.sweep,
                 job=job_argv(store.uri, record.bundle_sha256 or "", record.run_id, record.kind.value))
    return NodeSpec.of(up.request, up.zones)


def test_editing_the_config_mid_sweep_changes_no_later_trials_node(work: Work) -> None:
    before = work.settings(BEFORE)
    store = LocalStore(Path(before.store_root))
    start_sweep(plan_sweep(before, work.root / "sweeps" / "frozen.yaml", store, base_dir=work.root), store,
                lambda _: None)
    _pass(before, store)
    first = [runs.read_record(store, trial_run_id("frozen", n)) for n in (0, 1)]
    after = work.settings(AFTER)
    for record in first:
        _finish(store, record.run_id)
    _pass(after, store)
    later = [runs.read_record(store, trial_run_id("frozen", n)) for n in (2, 3)]
    for record in first + later:
        node = record.node
        assert (node.zones, node.accelerator, node.service_account, node.labels["team"]) == (
            ["us-central1-a", "us-central1-b"], "v3-8", "trainer@before-project.iam.gserviceaccount.com", "vision")
        assert "cost-center" not in node.labels and node.metadata["tpuops-max-run-seconds"] == "36000"
        assert "before-project" in node.metadata["startup-script"]
        assert "after-project" not in node.metadata["startup-script"]
        assert node == _planned(before, store, record)
        assert node != _planned(after, store, record)


def test_trial_zero_of_the_template_is_the_planned_run_and_an_old_sweep_json_gives_the_same_trials(
        work: Work) -> None:
    settings = work.settings(BEFORE)
    store = LocalStore(Path(settings.store_root))
    plan = plan_sweep(settings, work.root / "sweeps" / "frozen.yaml", store, base_dir=work.root)
    template = plan.template
    zero = template.for_trial(0, {})
    assert zero.record.node == plan.job.record.node and zero.spec == plan.job.spec
    trial = template.for_trial(7, {"learning_rate": 0.02})
    assert (trial.record.run_id, trial.spec.run_id, trial.record.node.name) == ("frozen-t0007",) * 3
    assert trial.spec.hparams == {**plan.job.spec.hparams, "learning_rate": 0.02}
    store.write_bytes(ops.record_key("frozen"), _older_format(plan.record()))
    assert ops.upgrade_sweep(store, "frozen", project=settings.project, store_root=settings.store_root)
    assert ops.read_sweep(store, "frozen").template.for_trial(7, {"learning_rate": 0.02}).record.node == \
        trial.record.node


def _older_format(record: SweepRecord) -> bytes:
    """``record`` as a sweep.json written before the template froze project and store root."""
    current = json.loads(record.to_bytes())
    return json.dumps({**current, "template": {k: current["template"][k] for k in ("record", "spec")}}).encode()


def test_a_sweep_json_of_the_older_format_is_upgraded_by_repair_and_by_the_next_pass(work: Work) -> None:
    settings = work.settings(BEFORE)
    store = LocalStore(Path(settings.store_root))
    plan = plan_sweep(settings, work.root / "sweeps" / "frozen.yaml", store, base_dir=work.root)
    start_sweep(plan, store, lambda _: None)
    older = _older_format(plan.record())
    store.write_bytes(ops.record_key("frozen"), older)
    said = api.sweep_repair(settings, "frozen", dry_run=True)
    assert list(said["damaged"]) == [ops.OLDER] and "older tpuops" in said["damaged"][ops.OLDER]
    assert said["repairable"] and said["done"] == [] and store.read_bytes(ops.record_key("frozen")) == older
    repaired = api.sweep_repair(settings, "frozen")
    assert repaired["done"] == [f"sweep.json upgraded: its trial template holds project before-project and store "
                                f"root {settings.store_root}"] and repaired["repairable"]
    assert ops.diagnose_sweep(store, "frozen") == {}
    assert store.read_bytes(ops.record_key("frozen") + ops.OLDER_SUFFIX) == older
    assert ops.read_sweep(store, "frozen").template == plan.template
    store.write_bytes(ops.record_key("frozen"), older)  # an older sweep that nobody repaired: the pass upgrades it
    _pass(settings, store)
    assert ops.read_sweep(store, "frozen").template == plan.template
    assert runs.read_record(store, trial_run_id("frozen", 1)).node == plan.template.for_trial(1, {}).record.node


@pytest.mark.parametrize("record", [
    [1],
    {"node": "n"},
    {"node": {"metadata": {"startup-script": "x\nTPUOPS_CONTEXT_LINE\n"}}},
    {"node": {"metadata": {"startup-script": "x\nTPUOPS_CONTEXT_LINE'{\"store_root\": \"/s\"}'\n"}}},
    {"node": {"metadata": {"startup-script": "x\nTPUOPS_CONTEXT_LINE'not json'\n"}}},
])
def test_a_damaged_old_sweep_json_is_refused_naming_the_missing_field(record: object, tmp_path: Path) -> None:
    from pydantic import ValidationError

    from tpuops.core.naming import MetadataKey
    text = json.dumps(record).replace("TPUOPS_CONTEXT_LINE", "CONTEXT_JSON=")
    record = json.loads(text.replace("startup-script", MetadataKey.STARTUP_SCRIPT.value))
    document = {"spec": {}, "projected_usd": 1.0, "template": {"record": record, "spec": {}}}
    with pytest.raises(ValidationError) as refused:
        SweepRecord.model_validate(document)
    assert ("template", "project") in [error["loc"] for error in refused.value.errors()]
    store = LocalStore(tmp_path)  # nor does an upgrade make it a sweep's: it stays as it was, damaged
    store.write_bytes(ops.record_key("old"), json.dumps(document).encode())
    with pytest.raises(DamagedDocument):
        ops.upgrade_sweep(store, "old", project="p", store_root="/s")
    assert store.read_bytes(ops.record_key("old")) == json.dumps(document).encode()
    assert not store.exists(ops.record_key("old") + ops.OLDER_SUFFIX)


def test_an_elastic_experiments_trials_each_freeze_every_size_under_their_own_name(work: Work) -> None:
    spec = work.root / "experiments" / "digits_cnn.yaml"
    spec.write_text(spec.read_text().replace("per_replica: 64", "per_replica: 8")
                    + "accelerator: [v2-32, v2-8]\nelastic:\n  wait: 5m\n")
    settings = work.settings(BEFORE)
    store = LocalStore(Path(settings.store_root))
    start_sweep(plan_sweep(settings, work.root / "sweeps" / "frozen.yaml", store, base_dir=work.root), store,
                lambda _: None)
    _pass(settings, store)
    for number in (0, 1):
        record = runs.read_record(store, trial_run_id("frozen", number))
        assert [(node.accelerator, node.zones) for node in record.sizes] == [
            ("v2-32", ["us-central1-a"]), ("v2-8", ["us-central1-b"])]
        assert {node.name for node in record.sizes} == {record.run_id}
        scripts = [node.metadata["startup-script"] for node in record.sizes]
        assert all(f"export TPUOPS_RUN_ID={record.run_id}\n" in script for script in scripts)
        assert (record.elastic_wait_s, record.probe_every_s, record.zones) == (
            300.0, 600.0, ["us-central1-a", "us-central1-b"])
