"""TFRecord files of ``tf.train.Example`` records, written and read without TensorFlow.

The control plane cannot import TensorFlow (docs/design.md, "Two planes"), so this module speaks
both formats itself:

TFRecord framing, per record::

    uint64 length (little endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

with ``masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8  (mod 2**32)`` over crc32c (Castagnoli).

The Example protobuf, encoded by hand from ``tensorflow/core/example/{example,feature}.proto``::

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }      // each entry: {string key = 1; Feature value = 2;}
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }   // little-endian float32, one run
    Int64List { repeated int64 value = 1 [packed = true]; }   // varints, negatives as 10-byte two's complement

Speed comes from doing per-array work in C: float lists are one ``numpy.tobytes()``, long int64
lists are varint-encoded with vectorised numpy, records are framed with precompiled ``struct``
and flushed in large joined writes, and crc32c is ``google_crc32c`` (hardware accelerated).

Writing is split so that callers control the bytes: ``bytes_feature`` / ``float_feature`` /
``int64_feature`` encode one ``Feature``; ``encode_example`` joins them into an ``Example``;
``frame`` wraps any record; ``TFRecordWriter`` frames, writes and checksums a whole file.
``read_records`` and ``parse_example`` are the inverse, for verification and tests.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Protocol

import google_crc32c
import numpy as np

from tpuops.core.errors import IntegrityError
from tpuops.store.files import digest_base64

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER = struct.Struct("<QI")
_HEADER_BYTES = _HEADER.size
_FLUSH_BYTES = 1 << 20

# Wire tags: (field_number << 3) | wire_type, with wire type 2 (length-delimited) throughout.
_TAG_1 = b"\x0a"
_TAG_2 = b"\x12"
_TAG_3 = b"\x1a"

_VARINT_CACHE_SIZE = 1 << 14


def _varint_slow(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VARINTS = [_varint_slow(n) for n in range(_VARINT_CACHE_SIZE)]


def _varint(value: int) -> bytes:
    """Varint of a non-negative int; lengths below 16 KiB come from a table."""
    return _VARINTS[value] if value < _VARINT_CACHE_SIZE else _varint_slow(value)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def varint(value: int) -> bytes:
    """A protocol buffer varint of a non-negative int (the event-file writer encodes its fields with it too)."""
    return _varint(value)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Protocol buffer field ``number`` of wire type 2 (a string, bytes or a message)."""
    return _delimited(_varint(number << 3 | 2), payload)


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def masked_crc32c(data: bytes) -> int:
    """The checksum TFRecord stores: crc32c rotated right by 15 bits plus a constant (mod 2**32)."""
    return _mask(google_crc32c.value(data))


def frame(record: bytes) -> bytes:
    """One record in TFRecord framing."""
    header = _LENGTH.pack(len(record))
    return b"".join((header, _CRC.pack(masked_crc32c(header)), record, _CRC.pack(masked_crc32c(record))))


def bytes_feature(values: Sequence[bytes]) -> bytes:
    """An encoded ``Feature`` holding a BytesList."""
    payload = b"".join([_TAG_1 + _varint(len(v)) + v for v in values])
    return _delimited(_TAG_1, payload)


def float_feature(values: np.ndarray | np.generic | Sequence[float]) -> bytes:
    """An encoded ``Feature`` holding a FloatList (values become float32, any shape is flattened)."""
    raw = np.ascontiguousarray(values, dtype="<f4").tobytes()
    return _delimited(_TAG_2, _delimited(_TAG_1, raw) if raw else b"")


def int64_feature(values: np.ndarray | np.generic | Sequence[int]) -> bytes:
    """An encoded ``Feature`` holding an Int64List (any shape is flattened)."""
    packed = _varints(values)
    return _delimited(_TAG_3, _delimited(_TAG_1, packed) if packed else b"")


_NUMPY_VARINT_MIN = 16


def _varints(values: np.ndarray | np.generic | Sequence[int]) -> bytes:
    if isinstance(values, np.ndarray | np.generic):
        array = np.asarray(values).ravel()
        if array.size >= _NUMPY_VARINT_MIN:
            return _varints_numpy(array)
        values = array.tolist()
    return b"".join([_varint(v) if v >= 0 else _varint_slow(v + (1 << 64)) for v in values])


def _varints_numpy(values: np.ndarray) -> bytes:
    """Varint-encode an int array without a Python loop over values.

    Each value becomes ten 7-bit groups (int64 as uint64 two's complement, so negatives take
    ten bytes as protobuf requires); the groups past the highest non-zero one are dropped with
    one boolean mask, which keeps row-major (value) order.
    """
    unsigned = values.astype(np.int64, copy=False).view(np.uint64)
    shifts = np.arange(0, 70, 7, dtype=np.uint64)
    groups = ((unsigned[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    nonzero = groups != 0
    lengths = np.where(nonzero.any(axis=1), 10 - np.argmax(nonzero[:, ::-1], axis=1), 1)
    columns = np.arange(10)
    keep = columns < lengths[:, None]
    groups[columns < (lengths - 1)[:, None]] |= 0x80
    return groups[keep].tobytes()


_KEY_PREFIXES: dict[str, bytes] = {}


def _key_prefix(key: str) -> bytes:
    prefix = _KEY_PREFIXES.get(key)
    if prefix is None:
        prefix = _delimited(_TAG_1, key.encode("utf-8")) + _TAG_2
        _KEY_PREFIXES[key] = prefix
    return prefix


def encode_example(features: Mapping[str, bytes]) -> bytes:
    """Serialize an ``Example`` from already encoded ``Feature`` messages, keyed by feature name."""
    entries = []
    for key, feature in features.items():
        entry = _key_prefix(key) + _varint(len(feature)) + feature
        entries.append(_TAG_1 + _varint(len(entry)) + entry)
    return _delimited(_TAG_1, b"".join(entries))


class TFRecordWriter:
    """Frame records into a binary file object, counting records and bytes and the file's crc32c.

    Records are buffered and flushed in writes of about 1 MiB; ``close`` flushes (it does not
    close the file object). ``crc32c`` is the checksum of everything written, in the base64
    form Cloud Storage reports, so a manifest can be checked against the bucket's listing.
    """

    def __init__(self, fileobj: IO[bytes]) -> None:
        self._file = fileobj
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._checksum = google_crc32c.Checksum()
        self.records = 0
        self.bytes = 0

    def write(self, record: bytes) -> int:
        """Append one record; returns the framed size in bytes."""
        header = _LENGTH.pack(len(record))
        pending = self._pending
        pending.append(header)
        pending.append(_CRC.pack(masked_crc32c(header)))
        pending.append(record)
        pending.append(_CRC.pack(masked_crc32c(record)))
        size = len(record) + _HEADER_BYTES + _CRC.size
        self.records += 1
        self.bytes += size
        self._pending_bytes += size
        if self._pending_bytes >= _FLUSH_BYTES:
            self.flush()
        return size

    def write_all(self, records: Iterable[bytes]) -> None:
        for record in records:
            self.write(record)

    def flush(self) -> None:
        if self._pending:
            chunk = b"".join(self._pending)
            self._checksum.update(chunk)
            self._file.write(chunk)
            self._pending.clear()
            self._pending_bytes = 0

    def close(self) -> None:
        self.flush()

    @property
    def crc32c(self) -> str:
        self.flush()
        return digest_base64(self._checksum)


def framed_size(record: bytes) -> int:
    """Bytes a record takes in a TFRecord file."""
    return len(record) + _HEADER_BYTES + _CRC.size


class Readable(Protocol):
    """What ``read_records`` needs of a file: ``read(size)``, returning fewer bytes only at the end."""

    def read(self, size: int = -1, /) -> bytes: ...


_READ_BYTES = 1 << 22
_READ_MAX_BYTES = 1 << 26


def read_records(fileobj: Readable, *, name: str = "<stream>") -> Iterator[bytes]:
    """Yield each record's data, checking both checksums.

    The file is read in chunks of 4 MiB (up to 64 MiB at once for a larger record) and framed in
    memory, so a shard of small records costs about a microsecond per record, not three reads.

    Raises:
        IntegrityError: a truncated record or a checksum mismatch, naming ``name``, the record's
            number (from 0) and the byte offset where it starts.
    """
    buffer, pos, base, index = b"", 0, 0, 0
    crc32c = google_crc32c.value
    need = _HEADER_BYTES
    while True:
        more = fileobj.read(min(max(_READ_BYTES, need), _READ_MAX_BYTES))  # a forged length cannot ask for 2**63
        buffer, base, pos = buffer[pos:] + more, base + pos, 0
        end = len(buffer)
        while True:
            if pos + _HEADER_BYTES > end:
                need = _HEADER_BYTES - (end - pos)
                break
            length, length_crc = _HEADER.unpack_from(buffer, pos)
            if _mask(crc32c(buffer[pos : pos + _LENGTH.size])) != length_crc:
                raise IntegrityError(f"{name}: record {index} at byte {base + pos}: corrupt record length "
                                     "(its crc32c does not match)")
            stop = pos + _HEADER_BYTES + length
            if stop + _CRC.size > end:
                need = stop + _CRC.size - end
                break
            data = buffer[pos + _HEADER_BYTES : stop]
            if _mask(crc32c(data)) != _CRC.unpack_from(buffer, stop)[0]:
                raise IntegrityError(f"{name}: record {index} at byte {base + pos}: corrupt record data "
                                     "(its crc32c does not match)")
            pos = stop + _CRC.size
            index += 1
            yield data
        if not more:
            if pos < end:
                what = "header" if end - pos < _HEADER_BYTES else "data"
                raise IntegrityError(f"{name}: record {index} at byte {base + pos}: truncated record {what} "
                                     f"(the file ends {end - pos} bytes into it)")
            return


FeatureValues = list[bytes] | list[float] | list[int]


def parse_example(data: bytes) -> dict[str, FeatureValues]:
    """Decode a serialized ``Example`` into ``{name: values}`` (bytes, float or int lists).

    Accepts packed and unpacked repeated numbers, as any protobuf writer may emit either.

    Raises:
        IntegrityError: the bytes are not a well-formed Example.
    """
    try:
        features: dict[str, FeatureValues] = {}
        for number, _, example_field in _fields(data):
            if number != 1:
                continue
            for entry_number, _, entry in _fields(example_field):
                if entry_number == 1:
                    key, values = _parse_entry(entry)
                    features[key] = values
        return features
    except (IndexError, TypeError, ValueError, UnicodeDecodeError) as err:
        raise IntegrityError(f"not a serialized tf.train.Example: {err}") from err


def _parse_entry(entry: bytes) -> tuple[str, FeatureValues]:
    key = ""
    values: FeatureValues = []
    for number, _, payload in _fields(entry):
        if number == 1:
            key = payload.decode("utf-8")
        elif number == 2:
            values = _parse_feature(payload)
    return key, values


def _parse_feature(feature: bytes) -> FeatureValues:
    for kind, _, payload in _fields(feature):
        if kind == 1:
            return [value for _, _, value in _fields(payload)]
        if kind == 2:
            return _parse_floats(payload)
        if kind == 3:
            return _parse_int64s(payload)
    return []


def _parse_floats(payload: bytes) -> list[float]:
    raw = bytearray()
    for _, wire_type, value in _fields(payload):
        raw += value if wire_type == 2 else value.to_bytes(4, "little")
    return np.frombuffer(bytes(raw), dtype="<f4").tolist()


def _parse_int64s(payload: bytes) -> list[int]:
    out: list[int] = []
    for _, wire_type, value in _fields(payload):
        numbers = _read_varints(value) if wire_type == 2 else [value]
        out.extend(n - (1 << 64) if n >= 1 << 63 else n for n in numbers)
    return out


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _read_varints(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        value, pos = _read_varint(data, pos)
        out.append(value)
    return out


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """Yield ``(field number, wire type, value)``: bytes for length-delimited, int otherwise."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
            yield number, wire_type, value
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError("length-delimited field runs past the end")
            yield number, wire_type, data[pos : pos + length]
            pos += length
        elif wire_type == 5:
            if pos + 4 > len(data):
                raise ValueError("fixed32 field runs past the end")
            yield number, wire_type, int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        elif wire_type == 1:
            if pos + 8 > len(data):
                raise ValueError("fixed64 field runs past the end")
            yield number, wire_type, int.from_bytes(data[pos : pos + 8], "little")
            pos += 8
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
