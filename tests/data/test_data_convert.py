"""``tpuops.data.convert``: images / npz / csv → shards + manifest, and what bad input leaves behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tpuops.core.errors import UsageError
from tpuops.data import convert, format_size, parse_size, tfrecord
from tpuops.data.manifest import MANIFEST, parse_manifest
from tpuops.store.files import crc32c_of_file

pytestmark = pytest.mark.unit


def _records(folder: Path) -> list[dict[str, list]]:
    """Every record of the dataset in ``folder``, in manifest order, decoded."""
    manifest = parse_manifest((folder / MANIFEST).read_bytes(), "test")
    out = []
    for shard in manifest.shards:
        with open(folder / shard.name, "rb") as handle:
            out.extend(tfrecord.parse_example(r) for r in tfrecord.read_records(handle, name=shard.name))
    return out


def _image(path: Path, color: tuple[int, ...], size: tuple[int, int] = (8, 6), mode: str = "RGB") -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new(mode, size, color if mode != "L" else color[0])
    image.save(path)
    return image.tobytes()


@pytest.fixture
def pets(tmp_path: Path) -> tuple[Path, dict[bytes, int]]:
    """Two classes of tiny RGB images; returns the folder and {pixels: label}."""
    src = tmp_path / "pets"
    expected = {}
    for label, name in enumerate(["cat", "dog"]):
        for i in range(5):
            expected[_image(src / name / f"{i}.png", (label * 100 + i, i, 7))] = label
    (src / "README.txt").write_text("ignored: not an image")
    (src / "cat" / "._0.png").write_bytes(b"ignored: a hidden macOS resource fork")
    return src, expected


def test_parse_size() -> None:
    assert parse_size("100MB") == 100 * 10**6
    assert parse_size("1GiB") == 2**30
    assert parse_size("1.5 kb") == 1500
    assert parse_size("64KiB") == 65536
    assert parse_size("4096") == 4096
    for bad in ("", "MB", "12 parsecs", "0", "-5MB"):
        with pytest.raises(UsageError):
            parse_size(bad)
    assert format_size(999) == "999 B"
    assert format_size(1_500_000) == "1.5 MB"


def test_images_round_trip_with_labels_and_manifest(pets: tuple[Path, dict[bytes, int]], tmp_path: Path) -> None:
    src, expected = pets
    out = tmp_path / "out"
    report = convert(src, "images", out, shards=3)
    manifest = report.manifest
    assert manifest.records == 10 and [s.records for s in manifest.shards] == [3, 3, 4]
    assert manifest.labels == ["cat", "dog"]
    assert manifest.features["image"].model_dump() == {"kind": "bytes", "dtype": "uint8", "shape": [6, 8, 3],
                                                       "encoding": "raw"}
    assert manifest.features["label"].kind == "int64"
    assert manifest.source.format == "images" and "10 RGB images of 8x6 in 2 classes" in manifest.source.description
    for shard in manifest.shards:
        assert (out / shard.name).stat().st_size == shard.bytes
        assert crc32c_of_file(out / shard.name) == shard.crc32c
    assert manifest.bytes == sum(s.bytes for s in manifest.shards)
    assert parse_manifest((out / MANIFEST).read_bytes(), "test") == manifest
    decoded = {record["image"][0]: record["label"] for record in _records(out)}
    assert decoded == {pixels: [label] for pixels, label in expected.items()}
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, *(s.name for s in manifest.shards)])


def test_images_are_shuffled_by_seed_and_kept_in_order_without(pets: tuple[Path, dict], tmp_path: Path) -> None:
    src, _ = pets
    in_order = [r["label"][0] for r in _records(convert(src, "images", tmp_path / "a", seed=None).out_dir)]
    shuffled = [r["label"][0] for r in _records(convert(src, "images", tmp_path / "b", seed=0).out_dir)]
    again = [r["label"][0] for r in _records(convert(src, "images", tmp_path / "c", seed=0).out_dir)]
    assert in_order == [0] * 5 + [1] * 5
    assert shuffled != in_order and shuffled == again and sorted(shuffled) == in_order


def test_shard_size_bounds_every_shard(tmp_path: Path) -> None:
    rows = np.arange(500 * 30, dtype=np.float32).reshape(500, 30)
    np.savez(tmp_path / "x.npz", x=rows)
    manifest = convert(tmp_path / "x.npz", "npz", tmp_path / "out", shard_size=parse_size("10KB")).manifest
    assert len(manifest.shards) > 5
    assert all(shard.bytes <= 10_000 for shard in manifest.shards)
    assert sum(shard.records for shard in manifest.shards) == 500
    assert manifest.shards[-1].name == f"shard-{len(manifest.shards) - 1:05d}-of-{len(manifest.shards):05d}.tfrecord"
    decoded = _records(tmp_path / "out")
    assert np.array([r["x"] for r in decoded], dtype=np.float32).tolist() == rows.tolist()


def test_npz_types_and_text_labels(tmp_path: Path) -> None:
    np.savez(
        tmp_path / "d.npz",
        pixels=np.arange(4 * 2 * 2, dtype=np.uint8).reshape(4, 2, 2),
        ints=np.array([-3, 0, 2**40, 7], dtype=np.int64),
        flags=np.array([True, False, True, False]),
        vec=np.array([[0.5, 1.5], [2.5, -1.0], [0, 0], [1e-3, 3]], dtype=np.float64),
        names=np.array(["ü", "b", "c", "d"]),
        species=np.array(["setosa", "virginica", "setosa", "versicolor"]),
    )
    manifest = convert(tmp_path / "d.npz", "npz", tmp_path / "out", label_from="column:species").manifest
    kinds = {name: (spec.kind, spec.dtype, spec.shape, spec.encoding) for name, spec in manifest.features.items()}
    assert kinds == {
        "pixels": ("bytes", "uint8", [2, 2], "raw"),
        "ints": ("int64", "int64", [], None),
        "flags": ("int64", "int64", [], None),
        "vec": ("float", "float32", [2], None),
        "names": ("bytes", "string", [], "text"),
        "label": ("int64", "int64", [], None),
    }
    assert manifest.labels == ["setosa", "versicolor", "virginica"]
    records = _records(tmp_path / "out")
    assert [r["label"] for r in records] == [[0], [2], [0], [1]]
    assert [r["ints"] for r in records] == [[-3], [0], [2**40], [7]]
    assert [r["flags"] for r in records] == [[1], [0], [1], [0]]
    assert records[1]["vec"] == [2.5, -1.0]
    assert records[0]["names"] == ["ü".encode()]
    assert records[3]["pixels"] == [bytes(range(12, 16))]


def test_csv_numeric_columns_and_label(tmp_path: Path) -> None:
    (tmp_path / "iris.csv").write_text(
        "sepal, petal ,count,species\n5.1,1.4,3,setosa\n6.2,4.5,2,versicolor\n5.9,5.1,1,setosa\n"
    )
    manifest = convert(tmp_path / "iris.csv", "csv", tmp_path / "out", label_from="species").manifest
    assert {n: s.kind for n, s in manifest.features.items()} == {
        "sepal": "float", "petal": "float", "count": "int64", "label": "int64",
    }
    assert manifest.labels == ["setosa", "versicolor"]
    records = _records(tmp_path / "out")
    assert [r["label"] for r in records] == [[0], [1], [0]]
    assert [r["count"] for r in records] == [[3], [2], [1]]
    assert records[1]["petal"] == [pytest.approx(4.5)]


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str, dict]]:
    mixed_size = tmp_path / "mixed_size"
    _image(mixed_size / "a" / "1.png", (1, 2, 3))
    _image(mixed_size / "b" / "2.png", (1, 2, 3), size=(9, 6))
    mixed_mode = tmp_path / "mixed_mode"
    _image(mixed_mode / "a" / "1.png", (1, 2, 3))
    _image(mixed_mode / "a" / "2.png", (1,), mode="L")
    garbage = tmp_path / "garbage"
    _image(garbage / "a" / "1.png", (1, 2, 3))
    (garbage / "a" / "2.png").write_bytes(b"not a png at all")
    flat = tmp_path / "flat"
    _image(flat / "1.png", (1, 2, 3))
    (tmp_path / "empty").mkdir()
    np.savez(tmp_path / "lengths.npz", a=np.zeros(3), b=np.zeros(4))
    np.savez(tmp_path / "zero.npz", a=np.zeros((0, 2)))
    np.save(tmp_path / "single.npy", np.zeros(3))
    (tmp_path / "text.csv").write_text("a,b\n1,x\n2,y\n")
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n3\n")
    (tmp_path / "blank.csv").write_text("")
    (tmp_path / "header.csv").write_text("a,b\n")
    (tmp_path / "ok.csv").write_text("a,b\n1,2\n3,4\n")
    return {
        "missing": (tmp_path / "nope.npz", "npz", {}),
        "mixed sizes": (mixed_size, "images", {}),
        "mixed modes": (mixed_mode, "images", {}),
        "unreadable image": (garbage, "images", {}),
        "images outside class folders": (flat, "images", {}),
        "no images": (tmp_path / "empty", "images", {}),
        "mismatched lengths": (tmp_path / "lengths.npz", "npz", {}),
        "empty arrays": (tmp_path / "zero.npz", "npz", {}),
        "npy not npz": (tmp_path / "single.npy", "npz", {}),
        "text column": (tmp_path / "text.csv", "csv", {}),
        "ragged csv": (tmp_path / "ragged.csv", "csv", {}),
        "empty csv": (tmp_path / "blank.csv", "csv", {}),
        "header only": (tmp_path / "header.csv", "csv", {}),
        "no such label column": (tmp_path / "ok.csv", "csv", {"label_from": "column:c"}),
        "dirname for csv": (tmp_path / "ok.csv", "csv", {"label_from": "dirname"}),
        "more shards than records": (tmp_path / "ok.csv", "csv", {"shards": 3}),
        "shards and size": (tmp_path / "ok.csv", "csv", {"shards": 1, "shard_size": 100}),
        "unknown format": (tmp_path / "ok.csv", "parquet", {}),
    }


@pytest.mark.parametrize("case", [
    "missing", "mixed sizes", "mixed modes", "unreadable image", "images outside class folders", "no images",
    "mismatched lengths", "empty arrays", "npy not npz", "text column", "ragged csv", "empty csv", "header only",
    "no such label column", "dirname for csv", "more shards than records", "shards and size", "unknown format",
])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    src, format_name, options = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    with pytest.raises(UsageError) as raised:
        convert(src, format_name, out, **options)
    message = str(raised.value)
    assert message and "\n" not in message
    assert not out.exists() or list(out.iterdir()) == []


def test_failure_after_shards_were_written_removes_them(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i in range(6):
        _image(src / "a" / f"{i}.png", (i, i, i))
    # A PNG whose header is fine but whose pixel data is cut off: it passes the header check
    # and fails only when decoded, after earlier shards are complete.
    noise = np.random.default_rng(0).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    Image.fromarray(noise).save(src / "a" / "5.png")
    whole = (src / "a" / "5.png").read_bytes()
    (src / "a" / "5.png").write_bytes(whole[: len(whole) * 2 // 3])
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=r"5\.png"):
        convert(src, "images", out, shards=6, seed=None)
    assert list(out.iterdir()) == []


def test_existing_dataset_needs_overwrite(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("a\n" + "\n".join(str(i) for i in range(10)) + "\n")
    out = tmp_path / "out"
    first = convert(tmp_path / "a.csv", "csv", out, shards=4).manifest
    with pytest.raises(UsageError, match="overwrite"):
        convert(tmp_path / "a.csv", "csv", out, shards=2)
    assert parse_manifest((out / MANIFEST).read_bytes(), "test") == first
    second = convert(tmp_path / "a.csv", "csv", out, shards=2, overwrite=True).manifest
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, *(s.name for s in second.shards)])


def test_stale_temp_shards_of_a_killed_run_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".shard-00000.deadbeef.tmp").write_bytes(b"half a shard")
    (tmp_path / "a.csv").write_text("a\n1\n2\n")
    manifest = convert(tmp_path / "a.csv", "csv", out).manifest
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, manifest.shards[0].name])
