"""TensorFlow 2.9 reads what tpuops writes without TensorFlow, and tpuops reads what TensorFlow writes.

Runs under .venv-tf29. The control plane cannot be imported here (other Python, other
protobuf), so its side runs as a subprocess with the control-plane interpreter: it writes
Examples and converted datasets, reads TF-written files, and uploads to fake-gcs-server.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.tf

REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE_PYTHON = REPO / ".venv" / "bin" / "python"

_CONTROL_PLANE = r"""
import base64, json, sys
from pathlib import Path

import numpy as np

mode, target = sys.argv[1], Path(sys.argv[2])

def b64(values):
    return [base64.b64encode(v).decode() for v in values]

if mode == "write":
    from PIL import Image
    from tpuops.data import tfrecord
    from tpuops.data import convert

    rng = np.random.default_rng(7)
    expected, records = [], []
    for n in range(60):
        ints = rng.integers(-(2**63), 2**63 - 1, size=int(rng.integers(0, 40)), dtype=np.int64)
        ints[: min(3, ints.size)] = [0, 2**63 - 1, -(2**63)][: min(3, ints.size)]
        floats = rng.standard_normal(int(rng.integers(0, 100))).astype(np.float32)
        blobs = [rng.bytes(int(rng.integers(0, 300))) for _ in range(int(rng.integers(0, 4)))]
        records.append(tfrecord.encode_example({
            "ints": tfrecord.int64_feature(ints),
            "small": tfrecord.int64_feature([n, -n]),
            "floats": tfrecord.float_feature(floats),
            "blobs": tfrecord.bytes_feature(blobs),
            "clé": tfrecord.bytes_feature(["ü".encode()]),
        }))
        expected.append({
            "ints": ["int64_list", ints.tolist()],
            "small": ["int64_list", [n, -n]],
            "floats": ["float_list", floats.tolist()],
            "blobs": ["bytes_list", b64(blobs)],
            "clé": ["bytes_list", b64(["ü".encode()])],
        })
    with open(target / "examples.tfrecord", "wb") as handle:
        writer = tfrecord.TFRecordWriter(handle)
        writer.write_all(records)
        writer.close()
    (target / "examples.json").write_text(json.dumps(expected))

    pixels, labels = [], []
    for label, name in enumerate(["cat", "dog"]):
        for i in range(3):
            array = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
            folder = target / "pets" / name
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(array).save(folder / f"{i}.png")
            pixels.append(array)
            labels.append(label)
    np.savez(target / "pets_expected.npz", pixels=np.stack(pixels), labels=np.array(labels))
    convert(target / "pets", "images", target / "pets_tfrecord", shards=2)

    np.savez(
        target / "table.npz",
        vec=rng.standard_normal((9, 3)).astype(np.float32),
        grid=rng.integers(-5, 5, (9, 2, 2)),
        kind=np.array(["b", "a", "c", "a", "b", "c", "a", "a", "b"]),
    )
    convert(target / "table.npz", "npz", target / "table_tfrecord", shards=3, label_from="column:kind")

elif mode == "read":
    from tpuops.data import tfrecord

    out = []
    with open(target, "rb") as handle:
        for record in tfrecord.read_records(handle):
            parsed = tfrecord.parse_example(record)
            out.append({k: b64(v) if v and isinstance(v[0], bytes) else v for k, v in parsed.items()})
    print(json.dumps(out))

elif mode == "upload":
    from tpuops.data import upload, verify
    from tpuops.store import gcs_client
    from fake_gcs import FakeGcsServer
    from tpuops.store.gcs import GcsStore

    with FakeGcsServer() as server:
        server.create_bucket("compat")
        store = GcsStore("compat", "data/pets", client=gcs_client(server.endpoint),
                         chunk_size=262144, resumable_threshold=1024)
        report = upload(target, store, workers=2)
        print(json.dumps({"sent": len(report.sent), "ok": verify(store).ok}))
"""


def control_plane(mode: str, target: Path) -> str:
    assert CONTROL_PLANE_PYTHON.exists(), f"{CONTROL_PLANE_PYTHON} is missing: run 'make setup'"
    result = subprocess.run(
        [str(CONTROL_PLANE_PYTHON), "-c", _CONTROL_PLANE, mode, str(target)],
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},  # fake_gcs: test-only, not in the package
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("written")
    control_plane("write", folder)
    return folder


def _values(feature: Any, kind: str) -> list[Any]:
    values = list(getattr(feature, kind).value)
    if kind == "bytes_list":
        return [base64.b64encode(v).decode() for v in values]
    if kind == "float_list":
        return [float(np.float32(v)) for v in values]
    return [int(v) for v in values]


def test_tensorflow_parses_every_example_with_the_right_values(written: Path) -> None:
    expected = json.loads((written / "examples.json").read_text())
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(written / "examples.tfrecord"))]
    assert len(records) == len(expected) == 60
    for raw, want in zip(records, expected):
        features = tf.train.Example.FromString(raw).features.feature
        assert set(features) == set(want)
        for key, (kind, values) in want.items():
            assert features[key].WhichOneof("kind") == kind
            assert _values(features[key], kind) == values


def test_framing_is_byte_identical_to_tensorflows_writer(written: Path, tmp_path: Path) -> None:
    ours = (written / "examples.tfrecord").read_bytes()
    theirs = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for record in tf.data.TFRecordDataset(str(written / "examples.tfrecord")):
            writer.write(record.numpy())
    assert theirs.read_bytes() == ours


def test_tensorflow_rejects_a_corrupted_record(written: Path, tmp_path: Path) -> None:
    data = bytearray((written / "examples.tfrecord").read_bytes())
    data[40] ^= 0x01
    corrupt = tmp_path / "corrupt.tfrecord"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(corrupt)))


def _parse_spec(features: dict[str, Any]) -> dict[str, Any]:
    spec = {}
    for name, feature in features.items():
        if feature["kind"] == "bytes":
            spec[name] = tf.io.FixedLenFeature([], tf.string)
        else:
            dtype = {"float": tf.float32, "int64": tf.int64}[feature["kind"]]
            spec[name] = tf.io.FixedLenFeature(feature["shape"], dtype)
    return spec


def _load(folder: Path) -> list[dict[str, Any]]:
    """Parse a converted dataset the way an input pipeline would: from its manifest alone."""
    manifest = json.loads((folder / "manifest.json").read_text())
    files = [str(folder / shard["name"]) for shard in manifest["shards"]]
    features = manifest["features"]
    dataset = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, _parse_spec(features)))
    rows = []
    for parsed in dataset:
        row = {}
        for name, feature in features.items():
            value = parsed[name]
            if feature.get("encoding") == "raw":
                value = tf.reshape(tf.io.decode_raw(value, tf.dtypes.as_dtype(feature["dtype"])), feature["shape"])
            row[name] = value.numpy()
        rows.append(row)
    assert len(rows) == manifest["records"] == sum(shard["records"] for shard in manifest["shards"])
    return rows


def test_converted_images_parse_from_the_manifest(written: Path) -> None:
    expected = np.load(written / "pets_expected.npz")
    rows = _load(written / "pets_tfrecord")
    got = sorted((int(row["label"]), row["image"].tobytes()) for row in rows)
    want = sorted((int(label), pixels.tobytes()) for label, pixels in zip(expected["labels"], expected["pixels"]))
    assert got == want
    assert rows[0]["image"].shape == (4, 5, 3) and rows[0]["image"].dtype == np.uint8


def test_converted_npz_parses_from_the_manifest(written: Path) -> None:
    source = np.load(written / "table.npz")
    rows = _load(written / "table_tfrecord")
    np.testing.assert_array_equal(np.stack([row["vec"] for row in rows]), source["vec"])
    np.testing.assert_array_equal(np.stack([row["grid"] for row in rows]), source["grid"])
    names = json.loads((written / "table_tfrecord" / "manifest.json").read_text())["labels"]
    assert [names[int(row["label"])] for row in rows] == source["kind"].tolist()


def test_our_reader_reads_what_tensorflow_writes(tmp_path: Path) -> None:
    path = tmp_path / "tf.tfrecord"
    values = []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for n in range(20):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "i": tf.train.Feature(int64_list=tf.train.Int64List(value=[n, -n, 2**40])),
                        "f": tf.train.Feature(float_list=tf.train.FloatList(value=[n / 4, -0.5])),
                        "b": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([n]) * n])),
                    }
                )
            )
            writer.write(example.SerializeToString())
            values.append({"i": [n, -n, 2**40], "f": [n / 4, -0.5], "b": [base64.b64encode(bytes([n]) * n).decode()]})
    assert json.loads(control_plane("read", path)) == values


def test_converted_dataset_uploads_and_verifies(written: Path) -> None:
    assert json.loads(control_plane("upload", written / "pets_tfrecord")) == {"sent": 2, "ok": True}
