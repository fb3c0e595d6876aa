"""The one node-request builder (``tpuops.launch.provision``): what a node is asked for is resolved once.

Accelerator and capacity are the flag, else the experiment's, else tpuops.toml's, in ``NodeBasis.of_settings``
only; ``plan_train`` and ``plan_infer`` take them from there. A frozen node is built again exactly on its own
basis (``NodeBasis.of_frozen``), which is how a sweep's later trials are built without the config of the moment.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO, settings_at

from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.launch.experiment import load_experiment
from tpuops.launch.provision import NodeBasis, plan_up
from tpuops.runs import RunKind

pytestmark = pytest.mark.unit

CONFIG = """zones = ["us-central1-a", "us-central1-b"]
accelerator = "v3-8"
capacity = "spot"
max_run_hours = 10
service_account = "trainer@p.iam.gserviceaccount.com"

[labels]
team = "ml"
"""



@pytest.mark.parametrize(("flags", "wanted", "expected"), [
    ({}, {}, ("v3-8", Capacity.SPOT)),  # the config's
    ({}, {"accelerator": "v2-8", "capacity": "on-demand"}, ("v2-8", Capacity.ON_DEMAND)),  # the experiment's
    ({"accelerator": "v4-8", "capacity": Capacity.PREEMPTIBLE}, {"accelerator": "v2-8", "capacity": "on-demand"},
     ("v4-8", Capacity.PREEMPTIBLE)),  # the flags'
])
def test_accelerator_and_capacity_are_the_flag_else_the_experiments_else_the_configs(
        tmp_path: Path, flags: dict[str, object], wanted: dict[str, str], expected: tuple[str, Capacity]) -> None:
    text = (REPO / "experiments" / "digits_cnn.yaml").read_text()
    text = text.replace("accelerator: v3-8\n", "").replace("capacity: spot\n", "")
    text += "".join(f"{key}: {value}\n" for key, value in wanted.items())
    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    settings = settings_at(tmp_path, CONFIG, store=tmp_path / "store")
    basis = NodeBasis.of_settings(settings, experiment=load_experiment(path), **flags)  # type: ignore[arg-type]
    assert (basis.accelerator, basis.capacity) == expected
    up = basis.run_node("digits-1", RunKind.TRAIN, store_uri="/s", bundle_sha256="0" * 64)
    assert (up.request.accelerator, up.request.capacity) == expected


@pytest.mark.parametrize("kind", [RunKind.TRAIN, RunKind.INFER])
def test_a_frozen_node_is_built_again_exactly_on_its_basis(tmp_path: Path, kind: RunKind) -> None:
    settings = settings_at(tmp_path, CONFIG, store=tmp_path / "store").model_copy(
        update={"wake_job": "projects/p/locations/us-central1/jobs/wake"})
    basis = NodeBasis.of_settings(settings, sweep_id="s", extra_metadata={MetadataKey.KEEP_NODE.value: "true"})
    first = basis.run_node("s-t0000", kind, store_uri="/s", bundle_sha256="a" * 64).frozen()
    again = NodeBasis.of_frozen(first, project=settings.project, store_root=settings.store_root)
    assert again.run_node("s-t0000", kind, store_uri="/s", bundle_sha256="a" * 64).frozen() == first
    other = again.run_node("s-t0007", kind, store_uri="/s", bundle_sha256="a" * 64).frozen()
    assert other.labels == {**first.labels, "tpuops-run": "s-t0007"} and other.name == "s-t0007"
    assert {k: v for k, v in other.metadata.items() if k != MetadataKey.STARTUP_SCRIPT.value} == \
        {MetadataKey.MAX_RUN_SECONDS.value: "36000", MetadataKey.WAKE_JOB.value: settings.wake_job,
         MetadataKey.KEEP_NODE.value: "true"}
    assert "s-t0007" in other.metadata[MetadataKey.STARTUP_SCRIPT.value]
    assert "s-t0000" not in other.metadata[MetadataKey.STARTUP_SCRIPT.value]


def test_up_builds_its_node_through_the_same_basis(tmp_path: Path) -> None:
    settings = settings_at(tmp_path, CONFIG, store=tmp_path / "store")
    up = plan_up(settings, "n1", zone="us-central1-b")
    assert up.zones == ["us-central1-b"] and up.request.capacity is Capacity.SPOT
    assert up.request == NodeBasis.of_settings(settings, zone="us-central1-b").node("n1").request
