"""Source formats for ``convert``: a folder of images, an ``.npz`` archive, a CSV file.

Each reader validates everything it can before a single record is written (existence, sizes,
modes, lengths, types), then returns a ``Table``: the feature spec plus a generator of
serialized ``tf.train.Example`` records. Errors are one-line ``UsageError``s naming the file.

Feature mapping (see ``tpuops.data.manifest`` for how each is parsed back):

- images: ``image`` = raw uint8 pixels, shape [height, width, channels] (L=1, RGB=3, RGBA=4),
  ``label`` = int64 index into the sorted class folder names. Raw bytes rather than PNG/JPEG
  or a float list: fixed-size records that a TPU input pipeline decodes for free, at one
  byte per value. Records are shuffled with a fixed seed, because folder order groups
  classes and shards of one class defeat a shuffle buffer.
- npz: every array is a feature with per-record shape ``array.shape[1:]``; uint8 → raw bytes,
  other integers and bool → int64, floats → float32, unicode → UTF-8 bytes ("text").
- csv: a header row; every column is a scalar feature, int64 if all its values are integers,
  else float32. Only the label column may hold text.
- A label column (npz/csv) becomes the ``label`` feature: integers as they are, text as an
  index into the sorted distinct values (listed in the manifest's ``labels``).
"""

from __future__ import annotations

import csv
import random
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpuops.core.errors import UsageError
from tpuops.data import tfrecord
from tpuops.data.manifest import StoredFeature

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}
LABEL = "label"

RowEncoder = Callable[[int], bytes]


@dataclass(frozen=True)
class Table:
    """A validated source: what the records contain and how to produce them, in order."""

    features: dict[str, StoredFeature]
    labels: list[str] | None
    count: int
    description: str
    records: Callable[[], Iterator[bytes]]


def read_images(src: Path, *, seed: int | None = 0) -> Table:
    """A folder with one subfolder per class; every image must have the same size and mode."""
    if not src.is_dir():
        raise UsageError(f"{src}: not a folder (expected one subfolder of images per class)")
    stray = sorted(p.name for p in src.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if stray:
        raise UsageError(f"{src}: images must be in one subfolder per class; found {stray[0]} at the top level")
    classes = sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
    files = [
        (path, label)
        for label, name in enumerate(classes)
        for path in sorted((src / name).rglob("*"))
        if path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".") and path.is_file()
    ]
    if not files:
        raise UsageError(f"{src}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in class subfolders")
    width, height, mode = _common_geometry([path for path, _ in files])
    if seed is not None:
        random.Random(seed).shuffle(files)
    expected_bytes = width * height * _CHANNELS[mode]

    def records() -> Iterator[bytes]:
        for path, label in files:
            raw = _pixels(path)
            if len(raw) != expected_bytes:
                raise UsageError(f"{path}: decoded to {len(raw)} bytes, expected {expected_bytes}")
            yield tfrecord.encode_example({
                "image": tfrecord.bytes_feature([raw]),
                LABEL: tfrecord.int64_feature([label]),
            })

    return Table(
        features={
            "image": StoredFeature(kind="bytes", dtype="uint8", shape=[height, width, _CHANNELS[mode]],
                                 encoding="raw"),
            LABEL: StoredFeature(kind="int64", dtype="int64", shape=[]),
        },
        labels=classes,
        count=len(files),
        description=f"{len(files)} {mode} images of {width}x{height} in {len(classes)} classes",
        records=records,
    )


def _common_geometry(paths: list[Path]) -> tuple[int, int, str]:
    """Size and mode shared by every image (headers only, no decoding)."""
    from PIL import Image, UnidentifiedImageError

    first: tuple[int, int, str] | None = None
    for path in paths:
        try:
            with Image.open(path) as image:
                geometry = (image.size[0], image.size[1], image.mode)
        except (OSError, UnidentifiedImageError) as err:
            raise UsageError(f"{path}: not a readable image ({err})") from None
        if geometry[2] not in _CHANNELS:
            raise UsageError(f"{path}: image mode {geometry[2]} is not supported (convert to L, RGB or RGBA)")
        if first is None:
            first = geometry
        elif geometry != first:
            raise UsageError(
                f"{path}: {geometry[0]}x{geometry[1]} {geometry[2]} differs from {first[0]}x{first[1]} "
                f"{first[2]} of {paths[0]} (all images must have the same size and mode)"
            )
    assert first is not None
    return first


def _pixels(path: Path) -> bytes:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.tobytes()
    except (OSError, UnidentifiedImageError) as err:
        raise UsageError(f"{path}: not a readable image ({err})") from None


def read_npz(src: Path, *, label_column: str | None = None) -> Table:
    """An ``.npz`` archive of arrays sharing their first dimension (the record index)."""
    arrays = _load_npz(src)
    lengths = {name: len(array) for name, array in arrays.items()}
    count = next(iter(lengths.values()))
    if any(length != count for length in lengths.values()):
        listed = ", ".join(f"{name}={length}" for name, length in lengths.items())
        raise UsageError(f"{src}: arrays have different lengths ({listed}); each must have one row per record")
    if count == 0:
        raise UsageError(f"{src}: the arrays are empty (no records)")
    columns = {name: _numpy_column(src, name, array) for name, array in arrays.items() if name != label_column}
    labels, label_encoder = _label(src, label_column, arrays, columns)
    if label_encoder is not None:
        columns[LABEL] = label_encoder
    return _table(src, columns, labels, count, f"{count} records of {len(arrays)} arrays")


def _load_npz(src: Path) -> dict[str, np.ndarray]:
    try:
        archive = np.load(src, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"{src}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # EOFError: an empty file
        raise UsageError(f"{src}: not a readable .npz archive ({err or 'empty file'})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UsageError(f"{src}: a single .npy array, not an .npz archive (use numpy.savez)")
    with archive:
        try:
            arrays = {name: archive[name] for name in archive.files}
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise UsageError(f"{src}: not a readable .npz archive ({err})") from None
    if not arrays:
        raise UsageError(f"{src}: the archive holds no arrays")
    for name, array in arrays.items():
        if array.ndim == 0:
            raise UsageError(f"{src}: array {name!r} is a scalar; each array needs one row per record")
    return arrays


@dataclass(frozen=True)
class _Column:
    spec: StoredFeature
    encode: RowEncoder


def _numpy_column(src: Path, name: str, array: np.ndarray) -> _Column:
    shape = list(array.shape[1:])
    kind = array.dtype.kind
    if array.dtype == np.uint8:
        flat = np.ascontiguousarray(array).reshape(len(array), -1)
        return _Column(StoredFeature(kind="bytes", dtype="uint8", shape=shape, encoding="raw"),
                       lambda i: tfrecord.bytes_feature([flat[i].tobytes()]))
    if kind in "biu":
        if kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
            raise UsageError(f"{src}: array {name!r} has values above the int64 range")
        ints = array.astype(np.int64)
        return _Column(StoredFeature(kind="int64", dtype="int64", shape=shape),
                       lambda i: tfrecord.int64_feature(ints[i]))
    if kind == "f":
        floats = np.ascontiguousarray(array, dtype="<f4")
        return _Column(StoredFeature(kind="float", dtype="float32", shape=shape),
                       lambda i: tfrecord.float_feature(floats[i]))
    if kind == "U":
        return _Column(StoredFeature(kind="bytes", dtype="string", shape=shape, encoding="text"),
                       lambda i: tfrecord.bytes_feature([s.encode() for s in np.ravel(array[i])]))
    if kind == "S":
        return _Column(StoredFeature(kind="bytes", dtype="bytes", shape=shape),
                       lambda i: tfrecord.bytes_feature(list(np.ravel(array[i]))))
    raise UsageError(f"{src}: array {name!r} has dtype {array.dtype}, which has no TFRecord feature type")


def _label(
    src: Path, column: str | None, arrays: dict[str, np.ndarray], others: dict[str, _Column]
) -> tuple[list[str] | None, _Column | None]:
    """The label feature built from ``column``: (label names or None, its column)."""
    if column is None:
        return None, None
    if column not in arrays:
        raise UsageError(f"{src}: no column {column!r} to take labels from (have: {', '.join(arrays)})")
    if LABEL in others:
        raise UsageError(f"{src}: a column is named {LABEL!r} already; it would clash with the labels from {column!r}")
    values = arrays[column]
    if values.ndim != 1:
        raise UsageError(f"{src}: label column {column!r} must hold one value per record")
    spec = StoredFeature(kind="int64", dtype="int64", shape=[])
    if values.dtype.kind in "iub":
        ints = values.astype(np.int64)
        return None, _Column(spec, lambda i: tfrecord.int64_feature([int(ints[i])]))
    if values.dtype.kind in "US":
        names, ids = np.unique(values.astype(str), return_inverse=True)
        return [str(n) for n in names], _Column(spec, lambda i: tfrecord.int64_feature([int(ids[i])]))
    raise UsageError(f"{src}: label column {column!r} holds {values.dtype} values; labels must be integers or text")


def _table(src: Path, columns: dict[str, _Column], labels: list[str] | None, count: int, what: str) -> Table:
    encoders = [(name, column.encode) for name, column in columns.items()]

    def records() -> Iterator[bytes]:
        for i in range(count):
            yield tfrecord.encode_example({name: encode(i) for name, encode in encoders})

    return Table(
        features={name: column.spec for name, column in columns.items()},
        labels=labels,
        count=count,
        description=what,
        records=records,
    )


def read_csv(src: Path, *, label_column: str | None = None) -> Table:
    """A CSV file with a header row; numeric columns, plus text in the label column only."""
    header, rows = _csv_rows(src)
    if label_column is not None and label_column not in header:
        raise UsageError(f"{src}: no column {label_column!r} to take labels from (have: {', '.join(header)})")
    cells = {name: [row[j] for row in rows] for j, name in enumerate(header)}
    arrays: dict[str, np.ndarray] = {}
    for name, values in cells.items():
        if name == label_column:
            arrays[name] = _label_values(values)
        else:
            arrays[name] = _numeric(src, name, values)
    columns = {name: _numpy_column(src, name, array) for name, array in arrays.items() if name != label_column}
    labels, label_encoder = _label(src, label_column, arrays, columns)
    if label_encoder is not None:
        columns[LABEL] = label_encoder
    return _table(src, columns, labels, len(rows), f"{len(rows)} rows of {len(header)} columns")


def _csv_rows(src: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with open(src, newline="", encoding="utf-8") as handle:
            lines = list(csv.reader(handle))
    except FileNotFoundError:
        raise UsageError(f"{src}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UsageError(f"{src}: not a readable UTF-8 CSV file ({err})") from None
    if not lines:
        raise UsageError(f"{src}: empty file (expected a header row and records)")
    header = [name.strip() for name in lines[0]]
    if len(set(header)) != len(header) or not all(header):
        raise UsageError(f"{src}: the header row needs distinct, non-empty column names")
    rows = lines[1:]
    if not rows:
        raise UsageError(f"{src}: a header but no records")
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise UsageError(f"{src}:{number}: {len(row)} fields, the header has {len(header)}")
        for name, value in zip(header, row, strict=True):
            if not value.strip():
                raise UsageError(f"{src}:{number}: column {name!r} is empty")
    return header, rows


def _numeric(src: Path, name: str, values: list[str]) -> np.ndarray:
    try:
        return np.array([int(v) for v in values], dtype=np.int64)
    except (ValueError, OverflowError):
        pass
    floats: list[float] = []
    for number, value in enumerate(values, start=2):
        try:
            floats.append(float(value))
        except ValueError:
            raise UsageError(
                f"{src}:{number}: column {name!r} holds {value.strip()!r}, which is not a number "
                "(only the label column may hold text)"
            ) from None
    return np.array(floats, dtype=np.float64)


def _label_values(values: list[str]) -> np.ndarray:
    stripped = [v.strip() for v in values]
    try:
        return np.array([int(v) for v in stripped], dtype=np.int64)
    except ValueError:
        return np.array(stripped, dtype=str)
