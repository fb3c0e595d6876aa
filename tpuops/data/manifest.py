"""``manifest.json``: the one file a dataset reader trusts (docs/design.md, ``data/<dataset>/manifest.json``).

It is written last, after every shard is complete (locally by ``convert``, in the store by
``upload``), so its presence means "every shard it lists exists with this size and crc32c".
A folder or prefix without it is not a dataset, whatever shards it holds.

Format (version ``tpuops.dataset/1``), JSON::

    {
      "format": "tpuops.dataset/1",
      "created": "2024-05-01T12:00:00Z",
      "source": {"format": "images", "path": "/data/pets", "description": "1200 images in 2 classes"},
      "records": 1200,
      "bytes": 3700000,
      "features": {
        "image": {"kind": "bytes", "dtype": "uint8", "shape": [32, 32, 3], "encoding": "raw"},
        "label": {"kind": "int64", "dtype": "int64", "shape": []}
      },
      "labels": ["cat", "dog"],
      "shards": [{"name": "shard-00000-of-00002.tfrecord", "records": 600, "bytes": 1850000,
                  "crc32c": "mnG7TA=="}, ...]
    }

Each feature says how to parse it in TensorFlow: ``kind`` is the ``tf.train.Feature`` list
(``bytes`` / ``float`` / ``int64``), ``shape`` the per-record shape. Fixed-size numbers are
``tf.io.FixedLenFeature(shape, tf.float32 | tf.int64)``. ``encoding: "raw"`` bytes hold one
C-order array per record: parse as ``FixedLenFeature([], tf.string)`` then
``tf.reshape(tf.io.decode_raw(x, dtype), shape)`` — the TPU-friendly layout (fixed size, no
decoding cost). ``encoding: "text"`` bytes are UTF-8 strings. ``labels[i]`` names label ``i``
when labels came from folder names or text; it is null for numeric labels.
``crc32c`` is base64 of the big-endian crc32c, as Cloud Storage reports it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tpuops.core.clock import UTC
from tpuops.core.errors import UsageError

MANIFEST = "manifest.json"
FORMAT = "tpuops.dataset/1"


class StoredFeature(BaseModel):
    """How one feature is stored and how to parse it back."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["bytes", "float", "int64"]
    dtype: str
    shape: list[int]
    encoding: Literal["raw", "text"] | None = None


class Shard(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    records: int = Field(ge=0)
    bytes: int = Field(ge=0)
    crc32c: str


class Origin(BaseModel):
    """Where the dataset was converted from: the source format, its path and what it held."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str
    path: str
    description: str


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["tpuops.dataset/1"] = FORMAT
    created: str
    source: Origin
    records: int = Field(ge=0)
    bytes: int = Field(ge=0)
    features: dict[str, StoredFeature]
    labels: list[str] | None = None
    shards: list[Shard]

    def to_bytes(self) -> bytes:
        """Canonical JSON (stable key order), so two manifests compare equal as bytes."""
        return (json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n").encode()


def parse_manifest(data: bytes, where: str) -> Manifest:
    """Validate a manifest read from ``where``.

    Raises:
        UsageError: not a tpuops dataset manifest (one line naming ``where`` and the first problem).
    """
    from tpuops.core.documents import parse_json

    try:
        manifest = Manifest.model_validate(parse_json(data, where))
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(part) for part in first.get("loc", ())) or "manifest"
        raise UsageError(f"{where}: not a {FORMAT} manifest ({loc}: {first.get('msg')})") from None
    if sum(shard.records for shard in manifest.shards) != manifest.records:
        raise UsageError(f"{where}: shard record counts do not add up to {manifest.records}")
    return manifest


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
