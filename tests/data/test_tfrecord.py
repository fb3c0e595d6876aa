"""The hand-written Example encoder and TFRecord framing (tpuops/data/tfrecord.py).

The encoding is checked against the real protobuf runtime: the Example messages are built
here from a descriptor (the field layout of tensorflow/core/example/*.proto), so no generated
classes and no TensorFlow are needed. tests/agent/test_tfrecord_compat.py checks the same
files against TensorFlow 2.9 itself.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tpuops.data import tfrecord
from tpuops.store import IntegrityError

pytestmark = pytest.mark.unit

INT64_EDGES = [0, 1, 127, 128, 16383, 16384, 2**31, 2**63 - 1, -1, -128, -(2**31), -(2**63)]


def _example_class() -> type:
    """``tf.train.Example`` as a dynamic protobuf message class (same field numbers and types)."""
    proto = descriptor_pb2.FileDescriptorProto(name="example_for_test.proto", package="t", syntax="proto3")
    label = descriptor_pb2.FieldDescriptorProto

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> descriptor_pb2.DescriptorProto:
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, cardinality, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=kind, label=cardinality)
            if type_name:
                field.type_name = type_name
        return msg

    repeated, optional = label.LABEL_REPEATED, label.LABEL_OPTIONAL
    message("BytesList", ("value", 1, label.TYPE_BYTES, repeated, ""))
    message("FloatList", ("value", 1, label.TYPE_FLOAT, repeated, ""))
    message("Int64List", ("value", 1, label.TYPE_INT64, repeated, ""))
    feature = message(
        "Feature",
        ("bytes_list", 1, label.TYPE_MESSAGE, optional, ".t.BytesList"),
        ("float_list", 2, label.TYPE_MESSAGE, optional, ".t.FloatList"),
        ("int64_list", 3, label.TYPE_MESSAGE, optional, ".t.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features", ("feature", 1, label.TYPE_MESSAGE, repeated, ".t.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=label.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=label.TYPE_MESSAGE, label=optional, type_name=".t.Feature")
    message("Example", ("features", 1, label.TYPE_MESSAGE, optional, ".t.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.Example"))


Example = _example_class()


def _sample() -> dict[str, bytes]:
    return {
        "image": tfrecord.bytes_feature([bytes(range(256)) * 3]),
        "names": tfrecord.bytes_feature([b"", b"cat", "é".encode()]),
        "empty_bytes": tfrecord.bytes_feature([]),
        "floats": tfrecord.float_feature(np.linspace(-1, 1, 300, dtype=np.float64).reshape(3, 100)),
        "one_float": tfrecord.float_feature([math.pi]),
        "no_floats": tfrecord.float_feature([]),
        "label": tfrecord.int64_feature([7]),
        "edges": tfrecord.int64_feature(INT64_EDGES),
        "many": tfrecord.int64_feature(np.arange(-500, 500, 7, dtype=np.int64)),
        "no_ints": tfrecord.int64_feature(np.array([], dtype=np.int64)),
        "ключ": tfrecord.int64_feature([1]),
    }


def test_protobuf_parses_our_examples_with_the_right_values() -> None:
    parsed = Example.FromString(tfrecord.encode_example(_sample())).features.feature
    assert parsed["image"].bytes_list.value == [bytes(range(256)) * 3]
    assert parsed["names"].bytes_list.value == [b"", b"cat", "é".encode()]
    assert parsed["empty_bytes"].WhichOneof("kind") == "bytes_list"
    assert list(parsed["floats"].float_list.value) == np.linspace(-1, 1, 300).astype(np.float32).tolist()
    assert parsed["one_float"].float_list.value[0] == np.float32(math.pi)
    assert parsed["no_floats"].WhichOneof("kind") == "float_list"
    assert list(parsed["label"].int64_list.value) == [7]
    assert list(parsed["edges"].int64_list.value) == INT64_EDGES
    assert list(parsed["many"].int64_list.value) == list(range(-500, 500, 7))
    assert parsed["no_ints"].WhichOneof("kind") == "int64_list"
    assert list(parsed["ключ"].int64_list.value) == [1]


def test_our_parser_reads_protobuf_serializations() -> None:
    message = Example()
    feature = message.features.feature
    feature["b"].bytes_list.value.extend([b"x", b"yz"])
    feature["f"].float_list.value.extend([0.5, -2.0])
    feature["i"].int64_list.value.extend(INT64_EDGES)
    assert tfrecord.parse_example(message.SerializeToString()) == {
        "b": [b"x", b"yz"], "f": [0.5, -2.0], "i": INT64_EDGES,
    }


def test_parser_inverts_encoder() -> None:
    parsed = tfrecord.parse_example(tfrecord.encode_example(_sample()))
    assert parsed["edges"] == INT64_EDGES
    assert parsed["many"] == list(range(-500, 500, 7))
    assert parsed["names"] == [b"", b"cat", "é".encode()]
    assert parsed["no_floats"] == [] and parsed["empty_bytes"] == []


def test_vectorised_varints_match_the_scalar_encoder() -> None:
    rng = np.random.default_rng(1)
    values = np.concatenate([
        np.array(INT64_EDGES, dtype=np.int64),
        rng.integers(-(2**63), 2**63 - 1, size=500, dtype=np.int64),
        rng.integers(0, 300, size=500, dtype=np.int64),
    ])
    assert tfrecord._varints_numpy(values) == tfrecord._varints(values.tolist())


def test_crc32c_mask_on_the_standard_check_value() -> None:
    # crc32c("123456789") is 0xE3069283 (RFC 3720 check value); masking rotates right by 15 and adds.
    crc = 0xE3069283
    expected = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert tfrecord.masked_crc32c(b"123456789") == expected


def test_writer_and_reader_round_trip_with_checksums() -> None:
    records = [tfrecord.encode_example({"i": tfrecord.int64_feature([n])}) for n in range(2000)]
    buffer = io.BytesIO()
    writer = tfrecord.TFRecordWriter(buffer)
    writer.write_all(records)
    writer.close()
    data = buffer.getvalue()
    assert writer.records == 2000
    assert writer.bytes == len(data) == sum(tfrecord.framed_size(r) for r in records)
    assert b"".join(tfrecord.frame(r) for r in records) == data
    from tpuops.store.files import crc32c_of_bytes

    assert writer.crc32c == crc32c_of_bytes(data)
    assert list(tfrecord.read_records(io.BytesIO(data))) == records


@pytest.mark.parametrize(
    ("position", "message"),
    [(0, "corrupt record length"), (13, "corrupt record data"), (-1, "corrupt record data")],
)
def test_reader_names_corruption(position: int, message: str) -> None:
    data = bytearray(tfrecord.frame(b"hello world") * 2)
    data[position] ^= 0x01
    with pytest.raises(IntegrityError, match=message):
        list(tfrecord.read_records(io.BytesIO(bytes(data)), name="shard-00000.tfrecord"))


def test_reader_rejects_truncated_files() -> None:
    data = tfrecord.frame(b"hello world")
    for cut in (5, len(data) - 2):
        with pytest.raises(IntegrityError, match="truncated"):
            list(tfrecord.read_records(io.BytesIO(data[:cut])))


def test_parse_example_rejects_garbage() -> None:
    with pytest.raises(IntegrityError):
        tfrecord.parse_example(b"\x0a\xff\xff\xff\x0f")


def test_reader_frames_across_its_read_chunks_and_names_the_offset() -> None:
    """Records larger than a 4-MiB read and records straddling reads come back whole; a bad one far into the
    file is named by its number and its byte offset from the file's start."""
    records = [b"a" * 100, b"b" * (5 << 20), *(bytes([n % 256]) * 70_001 for n in range(80))]
    data = b"".join(tfrecord.frame(r) for r in records)
    assert list(tfrecord.read_records(io.BytesIO(data))) == records
    index = 70
    at = sum(tfrecord.framed_size(r) for r in records[:index])
    assert at > 2 * (4 << 20)
    damaged = bytearray(data)
    damaged[at + 12 + 5] ^= 0x80
    with pytest.raises(IntegrityError, match=rf"^s: record {index} at byte {at}: corrupt record data"):
        list(tfrecord.read_records(io.BytesIO(bytes(damaged)), name="s"))
    with pytest.raises(IntegrityError, match=rf"^s: record {len(records) - 1} at byte .*truncated record data"):
        list(tfrecord.read_records(io.BytesIO(data[:-1]), name="s"))
