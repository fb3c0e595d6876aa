"""``infer --checkpoint URI``: a model folder in a store is checked before anything is planned, so before any node.

The folder is reached as the node would reach it (``session.open_uri``): ``file://`` locally (unit
lane), ``gs://`` on fake-gcs-server (emulator lane). Empty, it is one clear line; holding a
SavedModel or a TensorFlow checkpoint's state file, it is planned as given.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from helpers import REPO, local_or_gcs_store
from lanes import LOCAL_AND_GCS

from tpuops.config import Settings
from tpuops.core.errors import UsageError
from tpuops.launch import jobs
from tpuops.session import open_uri
from tpuops.store import LocalStore, Store

MANIFEST = {  # the digits test set's, as 'tpuops data sample digits' writes it (planning reads no shard)
    "format": "tpuops.dataset/1", "created": "2024-05-01T12:00:00Z", "records": 180, "bytes": 55800, "labels": None,
    "features": {"image": {"dtype": "float32", "encoding": None, "kind": "float", "shape": [8, 8, 1]},
                 "label": {"dtype": "int64", "encoding": None, "kind": "int64", "shape": []}},
    "shards": [{"bytes": 55800, "crc32c": "XRf4Jw==", "name": "shard-00000-of-00001.tfrecord", "records": 180}],
    "source": {"description": "180 records of 2 arrays", "format": "npz", "path": "digits-test.npz"}}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("infer-checkpoint")
    (work / "data" / "digits" / "test").mkdir(parents=True)
    (work / "data" / "digits" / "test" / "manifest.json").write_text(json.dumps(MANIFEST))
    shutil.copytree(REPO / "experiments", work / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    return work


@pytest.fixture(params=LOCAL_AND_GCS)
def models(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """Where the model folders are: a local store, or a bucket that STORAGE_EMULATOR_HOST serves."""
    if request.param == "gcs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", request.getfixturevalue("fake_gcs").endpoint)
    return local_or_gcs_store(request, tmp_path)


def _uri(models: Store, key: str) -> str:
    uri = models.uri_of(key)
    return uri if "://" in uri else f"file://{uri}"


def _plan(work: Path, tmp_path: Path, checkpoint: str) -> tuple[jobs.JobPlan, LocalStore]:
    settings = Settings(zones=["us-central1-a"], home=tmp_path / "home", store=str(tmp_path / "runs"))
    runs_store = LocalStore(Path(settings.store_root))
    return jobs.plan_infer(settings, work / "experiments" / "digits_cnn.yaml", runs_store, checkpoint=checkpoint,
                           inputs="data/digits/test", run_id="infer-1", base_dir=work,
                           open_uri=functools.partial(open_uri, settings)), runs_store


def test_an_empty_model_folder_in_a_store_is_refused_in_one_line(work: Path, tmp_path: Path, models: Store) -> None:
    models.write_bytes("elsewhere/saved_model.pb", b"")  # the bucket exists and has a model, but not there
    uri = _uri(models, "empty")
    with pytest.raises(UsageError) as refused:
        _plan(work, tmp_path, uri)
    assert str(refused.value) == (f"--checkpoint {uri}: holds neither a SavedModel (saved_model.pb) nor a "
                                  "TensorFlow checkpoint (a 'checkpoint' file with its .index and data files)")
    assert not (tmp_path / "runs").exists()  # nothing declared, so no node was asked for


@pytest.mark.parametrize("marker", ["saved_model.pb", "checkpoint"])
def test_a_saved_model_or_a_checkpoint_in_a_store_is_planned_as_given(work: Path, tmp_path: Path, models: Store,
                                                                      marker: str) -> None:
    models.write_bytes(f"model/{marker}", b"model_checkpoint_path: \"ckpt-5\"\n")
    plan, _ = _plan(work, tmp_path, _uri(models, "model"))
    assert plan.spec.require_infer().model == _uri(models, "model")


@pytest.mark.unit
def test_a_bucket_the_local_provider_does_not_serve_is_refused_before_any_node(work: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    with pytest.raises(UsageError, match="provider local serves no Cloud Storage for gs://elsewhere"):
        _plan(work, tmp_path, "gs://elsewhere/model")
