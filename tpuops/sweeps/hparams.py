"""Each ended trial in TensorBoard's HParams format, written by the control plane without TensorFlow.

``tensorboard --logdir <store>/sweeps/<sweep>/tb`` then compares the trials in its HParams tab:
every trial is one session, the folder ``trial-NNNN``, holding one event file with

- ``_hparams_/session_start_info``: the trial's params (a ``SessionStartInfo`` in the plugin's
  ``HParamsPluginData``, version 0, on a null float tensor, as ``tensorboard.plugins.hparams.summary``
  writes it);
- the objective, a scalar tagged with the sweep's metric at the trial's last reported step (the
  HParams tab finds metrics among a session's scalars);
- ``_hparams_/session_end_info``: SUCCESS for a COMPLETE or PRUNED trial, FAILURE otherwise.

The protos are encoded here by field number (tensorboard's ``plugin_data.proto``, ``api.proto``,
``event.proto``, ``summary.proto``) and framed as TFRecords by ``tpuops.data.tfrecord``. The file is
named after the trial, not the time, and written whole: telling a trial again rewrites it, never
adds a second session. A tf-lane test reads it back with TensorBoard's own readers.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping
from typing import Any

from tpuops.data.tfrecord import TFRecordWriter, length_delimited, varint
from tpuops.store import Store
from tpuops.sweeps.decide import TrialState

PLUGIN = b"hparams"
START_TAG = "_hparams_/session_start_info"
END_TAG = "_hparams_/session_end_info"
NULL_TENSOR = b"\x08\x01\x12\x02\x12\x00"
"""TensorProto(dtype=DT_FLOAT, tensor_shape=[0]): what the plugin's summaries carry as their value."""
SUCCESS, FAILURE = 1, 2
"""``tensorboard.plugins.hparams.api_pb2.Status`` values."""
ENDED_WELL = frozenset({TrialState.COMPLETE, TrialState.PRUNED})


def tb_dir(sweep: str) -> str:
    return f"sweeps/{sweep}/tb/"


def event_key(sweep: str, number: int) -> str:
    return f"{tb_dir(sweep)}trial-{number:04d}/events.out.tfevents.0.tpuops-hparams"


def _double(number: int, value: float) -> bytes:
    return varint(number << 3 | 1) + struct.pack("<d", value)


def _float(number: int, value: float) -> bytes:
    return varint(number << 3 | 5) + struct.pack("<f", value)


def _uint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def _text(number: int, value: str) -> bytes:
    return length_delimited(number, value.encode())


def _value(param: Any) -> bytes:
    """A ``google.protobuf.Value``: bools, numbers and text; anything else as its text."""
    if isinstance(param, bool):
        return _uint(4, int(param))
    if isinstance(param, int | float):
        return _double(2, float(param))
    return _text(3, str(param))


def _plugin_summary(tag: str, plugin_data: bytes) -> bytes:
    """A ``Summary`` of one value carrying ``HParamsPluginData`` (version 0) in its metadata."""
    metadata = length_delimited(1, length_delimited(1, PLUGIN) + length_delimited(2, plugin_data))
    return length_delimited(1, _text(1, tag) + length_delimited(9, metadata) + length_delimited(8, NULL_TENSOR))


def _event(wall_time: float, step: int, summary: bytes | None = None, file_version: str | None = None) -> bytes:
    body = _double(1, wall_time) + (_uint(2, step) if step else b"")
    if file_version is not None:
        body += _text(3, file_version)
    if summary is not None:
        body += length_delimited(5, summary)
    return body


def trial_events(params: Mapping[str, Any], metric: str, value: float | None, step: int, state: TrialState,
                 started: float, ended: float) -> bytes:
    """The whole event file of one ended trial (see the module docstring)."""
    hparams = b"".join(length_delimited(1, _text(1, name) + length_delimited(2, _value(param)))
                       for name, param in sorted(params.items()))
    start = length_delimited(3, hparams + _double(5, started))
    end = length_delimited(4, _uint(1, SUCCESS if state in ENDED_WELL else FAILURE) + _double(2, ended))
    records = [_event(started, 0, file_version="brain.Event:2"),
               _event(started, 0, _plugin_summary(START_TAG, start))]
    if value is not None:
        records.append(_event(ended, step, length_delimited(1, _text(1, metric) + _float(2, value))))
    records.append(_event(ended, step, _plugin_summary(END_TAG, end)))
    out = io.BytesIO()
    writer = TFRecordWriter(out)
    writer.write_all(records)
    writer.flush()
    return out.getvalue()


def write_trial(store: Store, sweep: str, number: int, params: Mapping[str, Any], metric: str,
                value: float | None, step: int, state: TrialState, started: float, ended: float) -> str:
    """Write (or rewrite) the trial's session under the sweep's TensorBoard folder; its key."""
    key = event_key(sweep, number)
    store.write_bytes(key, trial_events(params, metric, value, step, state, started, ended))
    return key
