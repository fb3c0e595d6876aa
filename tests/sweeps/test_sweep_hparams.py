"""Trials in TensorBoard's HParams format, written without TensorFlow (tpuops/sweeps/hparams.py), read back by
TensorBoard's own event reader and HParams plugin parsers in the TF 2.9 runtime."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import TF_PYTHON

from tpuops.data.tfrecord import read_records
from tpuops.store import LocalStore
from tpuops.sweeps.decide import TrialState
from tpuops.sweeps.hparams import event_key, write_trial

READ_BACK = """
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata

out = {}
for folder in sys.argv[1:]:
    acc = EventAccumulator(folder)
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    hparams = {}
    for name, value in start.hparams.items():
        kind = value.WhichOneof("kind")
        hparams[name] = getattr(value, kind)
    scalars = {tag: [(s.step, s.value) for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    out[folder] = {"hparams": hparams, "start": start.start_time_secs, "status": end.status,
                   "end": end.end_time_secs, "scalars": scalars}
print(json.dumps(out))
"""


def _trials(store: LocalStore) -> None:
    write_trial(store, "lr", 0, {"learning_rate": 0.01, "filters": 16, "optimizer": "adam", "bn": True},
                "accuracy", 0.875, 60, TrialState.COMPLETE, 1000.0, 1100.5)
    write_trial(store, "lr", 1, {"learning_rate": 0.2, "filters": 8, "optimizer": "sgd", "bn": False},
                "accuracy", None, 20, TrialState.FAIL, 1000.0, 1040.0)


@pytest.mark.unit
def test_one_event_file_per_trial_whole_tfrecords_and_a_retold_trial_is_rewritten(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _trials(store)
    _trials(store)
    files = sorted(p.relative_to(tmp_path / "store").as_posix() for p in (tmp_path / "store").rglob("*tfevents*"))
    assert files == [event_key("lr", 0), event_key("lr", 1)]
    assert files[0] == "sweeps/lr/tb/trial-0000/events.out.tfevents.0.tpuops-hparams"
    with (tmp_path / "store" / files[0]).open("rb") as fileobj:
        records = list(read_records(fileobj))  # checks every length and crc
    assert len(records) == 4 and b"brain.Event:2" in records[0] and b"_hparams_/session_start_info" in records[1]


@pytest.mark.tf
def test_tensorboard_reads_each_trial_as_a_session_with_its_params_objective_and_end(tmp_path: Path) -> None:
    if not TF_PYTHON.exists():
        pytest.skip(f"needs the TF 2.9 runtime at {TF_PYTHON} (tpuops runtime install)")
    store = LocalStore(tmp_path / "store")
    _trials(store)
    folders = [str(tmp_path / "store" / "sweeps" / "lr" / "tb" / f"trial-000{n}") for n in (0, 1)]
    done = subprocess.run([str(TF_PYTHON), "-c", READ_BACK, *folders], capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = read[folders[0]], read[folders[1]]
    assert first["hparams"] == {"learning_rate": 0.01, "filters": 16.0, "optimizer": "adam", "bn": True}
    assert (first["start"], first["end"], first["status"]) == (1000.0, 1100.5, 1)  # STATUS_SUCCESS
    assert first["scalars"] == {"accuracy": [[60, 0.875]]}
    assert second["hparams"]["optimizer"] == "sgd" and second["hparams"]["bn"] is False
    assert (second["status"], second["scalars"]) == (2, {})  # STATUS_FAILURE, no objective
