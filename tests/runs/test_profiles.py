"""Profiles without a server or TensorFlow: the request the agent accepts, the workers it traces, and the control
plane's side (``tpuops.api.profiles``) over a real local store: what it refuses, what it writes, what it reads.

``tests/runs/test_profile_e2e.py`` captures real profiles with TF 2.9 on the emulator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuops import api, runs
from tpuops.agent.profiles import REQUEST, Window, profiler_addresses
from tpuops.api.profiles import captures
from tpuops.config import Settings
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.launch.provision import plan_up
from tpuops.runs import NodeSpec, RunKind, RunRecord
from tpuops.store import open_store

pytestmark = pytest.mark.unit

ZONE = "us-central1-b"


def test_the_agent_takes_a_request_with_one_positive_window() -> None:
    window = Window.parse(json.dumps({"id": "p1", "steps": 5, "seconds": None}))
    assert (window.request, window.steps, window.seconds) == ("p1", 5, None)
    assert Window.parse(json.dumps({"id": "p2", "seconds": 1.5})).seconds == 1.5
    for bad in ({"id": "p", "steps": 5, "seconds": 2}, {"id": "p"}, {"id": "p", "steps": 0}, {"steps": 3},
                {"id": "experiment", "steps": 3}, {"id": "p", "steps": True}, {"id": "p", "seconds": -1}):
        with pytest.raises(ValueError):
            Window.parse(json.dumps(bad))


def test_a_slice_is_traced_at_each_workers_profiler_service() -> None:
    workers = ("10.0.0.2:8470", "10.0.0.3:8470")
    assert profiler_addresses(workers, on_tpu=True) == ("grpc://10.0.0.2:8466", "grpc://10.0.0.3:8466")
    assert profiler_addresses(workers, on_tpu=False) == ("grpc://10.0.0.2:8470", "grpc://10.0.0.3:8470")


def _declare(settings: Settings, run_id: str, *, spec: dict | None = None, status: dict | None = None) -> None:
    store = open_store(settings.store_root)
    request = plan_up(settings, run_id, accelerator="v2-8", capacity=Capacity.SPOT, zone=ZONE, run_id=run_id).request
    record = RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=NodeSpec.of(request, [ZONE]), experiment="x")
    runs.declare(store, record, spec or {"version": 1, "run_id": run_id})
    if status is not None:
        store.write_bytes(runs.status_key(run_id), runs.AgentStatus.model_validate(
            {"command": "train", "attempt": 1, "run_id": run_id, **status}).model_dump_json().encode())


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(zones=[ZONE], home=tmp_path / "home", store=str(tmp_path / "store"))


def test_a_run_that_is_not_running_is_refused_in_one_line_with_nothing_written(settings: Settings) -> None:
    _declare(settings, "done", status={"phase": "finished", "step": 60, "exit_class": "succeeded"})
    _declare(settings, "own", spec={"version": 1, "run_id": "own", "script": {"command": ["python", "t.py"]}})
    for run_id, words in (("done", "run done is not running (succeeded)"), ("own", "runs its own script"),
                          ("nowhere", "nowhere")):
        with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
            api.request_profile(settings, run_id, steps=5, wait=False)
    with pytest.raises(UsageError, match="--steps N or --seconds S"):
        api.request_profile(settings, "done", steps=5, seconds=1.0)
    store = open_store(settings.store_root)
    assert not any(info.key.endswith(REQUEST) for info in store.list("runs/"))


def test_a_request_is_written_for_the_agent_and_only_recorded_captures_are_read(settings: Settings) -> None:
    _declare(settings, "going", status={"phase": "training", "step": 10})
    request = api.request_profile(settings, "going", seconds=2.0, wait=False)
    store = open_store(settings.store_root)
    asked = Window.parse(store.read_bytes(f"runs/going/{REQUEST}").decode())
    assert (asked.request, asked.seconds, asked.steps) == (request, 2.0, None)
    record = {"request": request, "state": "complete", "attempt": 2, "first_step": 40, "last_step": 45,
              "seconds": 1.2, "hosts": ["h0"], "reason": None}
    store.write_bytes("runs/going/profiles/2-step40/record.json", json.dumps(record).encode())
    store.write_bytes("runs/going/profiles/1-step10/plugins/profile/s/h0.xplane.pb", b"killed before its record")
    store.write_bytes("runs/going/profiles/1-step12/record.json", b"{not json")
    found = captures(store, "going")
    assert [(c.name, c.state, c.hosts) for c in found] == [("2-step40", "complete", ["h0"])]
    assert api.list_profiles(settings, "going") == found


def test_an_experiment_asks_for_one_window_of_a_model_run_only() -> None:
    from pydantic import ValidationError

    from tpuops.contract.runspec import SpecError, TrainSpec
    from tpuops.launch.experiment import Experiment

    base = {"name": "x", "dataset": {"train": "data/x"}}
    model = Experiment.model_validate({**base, "model": "m:f", "batch": {"per_replica": 8}, "steps": 100,
                                       "profile": {"at_step": 40}})
    assert model.profile is not None and (model.profile.at_step, model.profile.steps) == (40, 10)
    for bad in ({**base, "script": "train.py", "profile": {"at_step": 4}},
                {**base, "model": "m:f", "batch": {"per_replica": 8}, "steps": 9, "profile": {"at_step": -1}},
                {**base, "model": "m:f", "batch": {"per_replica": 8}, "steps": 9, "profile": {"at_step": 1,
                                                                                             "steps": 0}}):
        with pytest.raises(ValidationError):
            Experiment.model_validate(bad)
    window = TrainSpec.from_json({"per_replica_batch_size": 8, "steps": 9, "profile_at_step": 3,
                                  "profile_steps": 2}, "train")
    assert (window.profile_at_step, window.profile_steps) == (3, 2)
    with pytest.raises(SpecError, match="profile_at_step"):
        TrainSpec.from_json({"per_replica_batch_size": 8, "steps": 9, "profile_at_step": -3}, "train")
