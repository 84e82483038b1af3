"""Byte-level writing of TFRecord files and tf.train.Example messages, without TensorFlow.

The converter runs in worker processes that never import TensorFlow (it takes
seconds and hundreds of MB per process), so the two formats are written here.

TFRecord framing, per record (all integers little-endian)::

    uint64  length of data
    uint32  masked CRC-32C of the 8 length bytes
    bytes   data (a serialized tf.train.Example)
    uint32  masked CRC-32C of data

A masked CRC is ``((crc >> 15) | (crc << 17)) + 0xA282EAD8`` modulo 2**32.
A compressed shard is the whole framed stream inside one gzip or zlib stream,
which is what ``tf.data.TFRecordDataset(compression_type="GZIP"|"ZLIB")`` reads.

tf.train.Example is written with sorted feature names, so the same record
always serializes to the same bytes.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import BinaryIO

import google_crc32c

_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    return mask_crc(google_crc32c.value(data))


def mask_crc(crc: int) -> int:
    """TFRecord's masked form of a CRC-32C."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@functools.cache
def crc32c_at() -> Callable[[int, int, int], int] | None:
    """google-crc32c's own C function ``crc32c_extend(crc, address, size)``, called
    through ctypes; None where its library cannot be found.

    Its Python API takes ``bytes`` only (not an array's memory: pixels read straight
    into a batch would need a copy to be checked) and holds the GIL; through ctypes
    it reads any memory by address, and ctypes releases the GIL for the call. Looked up
    on first use, by readers only (the converter's workers never load it)."""
    if google_crc32c.implementation != "c":
        return None
    try:
        from google_crc32c import _crc32c

        extend = ctypes.CDLL(_crc32c.__file__).crc32c_extend  # found in its linked library
    except (ImportError, OSError, AttributeError):
        return None
    extend.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
    extend.restype = ctypes.c_uint32
    return extend


def frame_record(data: bytes) -> bytes:
    """Return one TFRecord: header, data and footer."""
    length = struct.pack("<Q", len(data))
    return b"".join(
        (
            length,
            struct.pack("<I", masked_crc32c(length)),
            data,
            struct.pack("<I", masked_crc32c(data)),
        )
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint((field_number << 3) | 2) + _varint(len(payload)) + payload


def _feature(value: bytes | int) -> bytes:
    # Feature: bytes_list = 1, int64_list = 3; each list holds `repeated value = 1`.
    if isinstance(value, bytes):
        return _length_delimited(1, _length_delimited(1, value))
    if value < 0:
        raise ValueError(f"negative int64 features are not written by tfshards: {value}")
    return _length_delimited(3, _length_delimited(1, _varint(value)))


def serialize_example(features: Mapping[str, bytes | int]) -> bytes:
    """Serialize a tf.train.Example with one value per feature, names in sorted order."""
    entries = b"".join(
        _length_delimited(
            1,  # Features.feature map entry
            _length_delimited(1, name.encode("utf-8"))
            + _length_delimited(2, _feature(features[name])),
        )
        for name in sorted(features)
    )
    return _length_delimited(1, entries)


class RecordError(ValueError):
    """A TFRecord stream or an Example message is malformed."""


def iter_records(stream: BinaryIO) -> Iterator[bytes]:
    """Yield the data of each TFRecord in an uncompressed stream, checking both CRCs."""
    index = 0
    while True:
        header = stream.read(12)
        if not header:
            return
        if len(header) < 12:
            raise RecordError(f"record {index}: truncated header ({len(header)} of 12 bytes)")
        (length,) = struct.unpack("<Q", header[:8])
        if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
            raise RecordError(f"record {index}: length CRC mismatch (corrupt header)")
        data = stream.read(length)
        footer = stream.read(4)
        if len(data) < length or len(footer) < 4:
            raise RecordError(f"record {index}: truncated data ({len(data)} of {length} bytes)")
        if struct.unpack("<I", footer)[0] != masked_crc32c(data):
            raise RecordError(f"record {index}: data CRC mismatch (corrupt bytes)")
        yield data
        index += 1


Span = tuple[int, int]  # [start, stop) of a bytes value within the serialized Example


def _read_varint(data: bytes | memoryview, position: int, end: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``position``, which must end before ``end``."""
    if position >= end:
        raise RecordError("truncated varint")
    byte = data[position]
    if byte < 0x80:  # tags and short lengths: one byte, the common case
        return byte, position + 1
    value = shift = 0
    while True:
        if position >= end:
            raise RecordError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _field(data: bytes | memoryview, position: int, end: int) -> tuple[int, int, int, int]:
    """(number, wire type, value, next position) of the field at ``position``: a varint's
    value, or where a length-delimited value starts (it stops at the next position)."""
    tag, position = _read_varint(data, position, end)
    wire = tag & 7
    if wire == 0:
        value, position = _read_varint(data, position, end)
        return tag >> 3, 0, value, position
    if wire != 2:
        raise RecordError(f"unexpected protobuf wire type {wire}")
    length, position = _read_varint(data, position, end)
    stop = position + length
    if stop > end:
        raise RecordError("truncated field")
    return tag >> 3, 2, position, stop


def example_fields(data: bytes | memoryview) -> dict[str, Span | int]:
    """The features of a tf.train.Example holding one bytes or int64 value each: a bytes
    value as its span in ``data``, an int64 as its value (None for other kinds).

    A walk over offsets, without slicing or generators: a 256x256 record's nine features
    took 52 us through nested generators and take about 30 here, in pure Python."""
    features: dict[str, Span | int] = {}
    position, end = 0, len(data)
    while position < end:
        number, wire, start, position = _field(data, position, end)
        if number != 1 or wire != 2:  # Example.features
            continue
        while start < position:
            entry, kind, first, start = _field(data, start, position)
            if entry == 1 and kind == 2:  # one map entry: (name, Feature)
                name, value = _map_entry(data, first, start)
                features[name] = value
    return features


def parse_example(data: bytes | memoryview) -> dict[str, bytes | int]:
    """The features of a tf.train.Example holding one bytes or int64 value each; given a
    memoryview, the bytes values are memoryviews into it (a large record is not copied)."""
    return {
        name: data[value[0] : value[1]] if isinstance(value, tuple) else value
        for name, value in example_fields(data).items()
    }


def _map_entry(data: bytes | memoryview, position: int, end: int) -> tuple[str, Span | int]:
    name, value = "", None
    while position < end:
        number, wire, start, position = _field(data, position, end)
        if wire != 2:
            continue
        if number == 1:
            name = str(data[start:position], "utf-8")  # bytes, or a memoryview (no copies)
        elif number == 2:
            value = _feature_value(data, start, position)
    return name, value


def _feature_value(data: bytes | memoryview, position: int, end: int) -> Span | int | None:
    """A Feature's first value: bytes_list (1) as a span, int64_list (3) as an int."""
    while position < end:
        kind, wire, start, position = _field(data, position, end)
        if wire != 2:
            continue
        while start < position:
            number, inner, first, start = _field(data, start, position)
            if number != 1:
                continue
            if kind == 1:
                return (first, start) if inner == 2 else first
            if kind == 3:
                return first if inner == 0 else _read_varint(data, first, start)[0]
    return None
