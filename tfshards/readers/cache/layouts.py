"""The two record layouts of a disk cache entry's part files, behind one small interface.

Fixed (every record of one shape): each part is a plain array of uint8 records,
``part-K.image`` (height x width x channels, row-major) and ``part-K.mask`` (height x
width), read back with ``FixedLengthRecordDataset`` as byte strings and decoded a
whole batch at a time: no framing, no parsing.

Variable (records of many sizes): ``part-K.image`` and ``part-K.mask`` hold
TFRecord-framed pixels and ``part-K.shape`` each record's (height, width) as two
little-endian int32s; records are decoded one at a time.

Part K holds records K, K+P, K+2P, ... of the split (P = ``CACHE_PARTS``), so reading
the parts round-robin gives the records in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Protocol

import numpy as np
import tensorflow as tf

from tfshards.schemas.tfrecord import frame_record

# Part files, read at once in a new order each epoch: with the shuffle buffer they mix
# the records of a cached epoch.
CACHE_PARTS = 16
# Read-ahead per part file: 1 MiB read 1.5x faster than TF's 256 KiB default here.
READ_BUFFER_BYTES = 2**20
SHAPE_BYTES = 8  # (height, width) as little-endian int32, per record of a variable layout
Shape = tuple[int | None, int | None, int]


def part_count(records: int, part: int) -> int:
    """Records in part ``part`` of a split of ``records``."""
    return len(range(part, records, CACHE_PARTS))


class PartLayout(Protocol):
    """What a cache entry needs from a record layout."""

    shape: Shape
    kinds: tuple[str, ...]  # one file per kind and part: "image", "mask", ...

    def append(self, files: tuple[BinaryIO, ...], image: np.ndarray, mask: np.ndarray) -> None:
        """Write one decoded pair to the files of its part (one per kind)."""

    def expected_size(self, count: int, kind: str) -> int | None:
        """Bytes of a part file of ``count`` records; None where sizes vary."""

    def bytes_needed(self, records: int, stored_bytes: int) -> int:
        """Disk space to reserve before building an entry of ``records``."""

    def pairs(
        self, parts: tf.data.Dataset, *, deterministic: bool, at_once: int = CACHE_PARTS
    ) -> tf.data.Dataset:
        """Part files (one path per kind, record count, first record) -> uint8 pairs,
        ``at_once`` parts read at a time."""


@dataclass(frozen=True)
class FixedLayout:
    """Records of one shape: plain arrays of uint8 records, decoded a batch at a time."""

    shape: tuple[int, int, int]
    kinds: tuple[str, ...] = ("image", "mask")

    @property
    def image_bytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2]

    @property
    def mask_bytes(self) -> int:
        return self.shape[0] * self.shape[1]

    def append(self, files: tuple[BinaryIO, ...], image: np.ndarray, mask: np.ndarray) -> None:
        files[0].write(image.data)
        files[1].write(mask.data)

    def expected_size(self, count: int, kind: str) -> int | None:
        return count * (self.image_bytes if kind == "image" else self.mask_bytes)

    def bytes_needed(self, records: int, stored_bytes: int) -> int:
        return int(records * (self.image_bytes + self.mask_bytes) * 1.05) + 2**20

    def byte_records(
        self, parts: tf.data.Dataset, *, deterministic: bool, at_once: int = CACHE_PARTS
    ) -> tf.data.Dataset:
        """Part files -> (image bytes, mask bytes) records, each part from its first
        record, ``at_once`` parts read at a time."""

        def records(image_file, mask_file, count, start) -> tf.data.Dataset:
            start = start % tf.maximum(count, 1)
            return tf.data.Dataset.zip(
                _rotated(image_file, self.image_bytes, start, count),
                _rotated(mask_file, self.mask_bytes, start, count),
            )

        return parts.interleave(
            records,
            cycle_length=at_once,
            block_length=1,
            num_parallel_calls=at_once,
            deterministic=deterministic,
        )

    def decode(self, image: tf.Tensor, mask: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Byte records (one, or a batch) -> uint8 pixels, one op per field."""
        height, width, channels = self.shape
        lead = tf.shape(image)  # () for one record, (B,) for a batch
        return (
            tf.reshape(
                tf.io.decode_raw(image, tf.uint8), tf.concat([lead, [height, width, channels]], 0)
            ),
            tf.reshape(tf.io.decode_raw(mask, tf.uint8), tf.concat([lead, [height, width, 1]], 0)),
        )

    def pairs(
        self, parts: tf.data.Dataset, *, deterministic: bool, at_once: int = CACHE_PARTS
    ) -> tf.data.Dataset:
        return self.byte_records(parts, deterministic=deterministic, at_once=at_once).map(
            self.decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic
        )


def _rotated(path, record_bytes: int, start: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
    """Records start..count-1 then 0..start-1 of one part file.

    TensorFlow skips ``header_bytes`` by reading them, not by seeking (measured: 200 MB
    read to deliver the last 50 MB of a 200 MB file), so a rotated part reads about 1.5x
    its size on average: from the page cache a copy, from a cold disk real I/O.
    """
    tail = tf.data.FixedLengthRecordDataset(
        path, record_bytes, header_bytes=start * record_bytes, buffer_size=READ_BUFFER_BYTES
    )
    head = tf.data.FixedLengthRecordDataset(
        path,
        record_bytes,
        footer_bytes=(count - start) * record_bytes,
        buffer_size=READ_BUFFER_BYTES,
    )
    return tail.concatenate(head)


@dataclass(frozen=True)
class VariableLayout:
    """Records of many sizes: framed pixels and a .shape file; decoded one at a time."""

    shape: Shape  # (None, None, channels)
    kinds: tuple[str, ...] = ("image", "mask", "shape")

    def append(self, files: tuple[BinaryIO, ...], image: np.ndarray, mask: np.ndarray) -> None:
        files[0].write(frame_record(image.tobytes()))
        files[1].write(frame_record(mask.tobytes()))
        files[2].write(np.array(image.shape[:2], "<i4").tobytes())

    def expected_size(self, count: int, kind: str) -> int | None:
        return count * SHAPE_BYTES if kind == "shape" else None

    def bytes_needed(self, records: int, stored_bytes: int) -> int:
        # Native sizes are unknown before decoding: a generous estimate.
        return int(stored_bytes * 4) + 2**20

    def pairs(
        self, parts: tf.data.Dataset, *, deterministic: bool, at_once: int = CACHE_PARTS
    ) -> tf.data.Dataset:
        channels = self.shape[2]

        def decode(image, mask, size):
            height_width = tf.ensure_shape(tf.io.decode_raw(size, tf.int32), [2])
            image = tf.reshape(
                tf.io.decode_raw(image, tf.uint8), tf.concat([height_width, [channels]], 0)
            )
            mask = tf.reshape(tf.io.decode_raw(mask, tf.uint8), tf.concat([height_width, [1]], 0))
            return (
                tf.ensure_shape(image, (None, None, channels)),
                tf.ensure_shape(mask, (None, None, 1)),
            )

        def part_pairs(image_file, mask_file, shape_file, count, start) -> tf.data.Dataset:
            return tf.data.Dataset.zip(
                tf.data.TFRecordDataset(image_file),  # a set buffer_size logs an INFO line
                tf.data.TFRecordDataset(mask_file),
                tf.data.FixedLengthRecordDataset(shape_file, SHAPE_BYTES),
            ).map(decode)

        return parts.interleave(
            part_pairs,
            cycle_length=at_once,
            block_length=1,
            num_parallel_calls=at_once,
            deterministic=deterministic,
        )


def layout_for(shape: Shape) -> PartLayout:
    """Fixed when every record has ``shape``; variable when height and width are None."""
    if shape[0] is None:
        return VariableLayout(shape)
    return FixedLayout(shape)
