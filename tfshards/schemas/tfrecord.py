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

import struct
from collections.abc import Mapping

import google_crc32c

_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


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
