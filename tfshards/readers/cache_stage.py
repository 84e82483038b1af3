"""The disk cache as a tf.data stage: build it during the first pass, read it afterwards.

Each pass (epoch) decides once, when it starts, whether the entry is ready:
ready, it reads the part files with ``FixedLengthRecordDataset`` (no parsing,
no decoding); not ready, it streams the decoded pairs through and appends
them to a private building folder, published when the pass is complete.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfshards.readers.cache import (
    BUILDING_PREFIX,
    CACHE_PARTS,
    READ_BUFFER_BYTES,
    SHAPE_BYTES,
    CacheLayout,
)
from tfshards.schemas.tfrecord import frame_record

_FILE_BUFFER = 2**20
log = logging.getLogger("tfshards")


class CacheBuilder:
    """Writes the pairs of one pass in record order; publishes the entry when it is whole.

    ``write`` is called through ``tf.py_function`` with each pair's index. Index 0
    starts a new build (abandoning an unfinished one); an index out of sequence (an
    interrupted pass) abandons the build; the last index publishes it.
    """

    def __init__(self, layout: CacheLayout) -> None:
        self.layout = layout
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._files: list = []
        self._next = 0

    def write(self, index, image, mask) -> bool:
        index = int(index)
        with self._lock:
            if index == 0:
                self._abandon()
                self._start()
            elif self._folder is None or index != self._next:
                self._abandon()
                return False
            self._append(self._files[index % CACHE_PARTS], image.numpy(), mask.numpy())
            self._next = index + 1
            if self._next == self.layout.records:
                self._publish()
        return True

    def _append(self, files, image: np.ndarray, mask: np.ndarray) -> None:
        if not self.layout.variable:
            files[0].write(image.data)
            files[1].write(mask.data)
            return
        files[0].write(frame_record(image.tobytes()))
        files[1].write(frame_record(mask.tobytes()))
        files[2].write(np.array(image.shape[:2], "<i4").tobytes())

    def _start(self) -> None:
        name = f"{BUILDING_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._folder = self.layout.entry / name
        self._folder.mkdir(parents=True)
        self._files = [
            tuple(
                open(self.layout.part(self._folder, k, what), "wb", buffering=_FILE_BUFFER)  # noqa: SIM115
                for what in self.layout.kinds()
            )
            for k in range(CACHE_PARTS)
        ]
        self._next = 0

    def _close(self, *, sync: bool) -> None:
        for handle in (h for pair in self._files for h in pair):
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
            handle.close()
        self._files = []

    def _abandon(self) -> None:
        if self._folder is not None:
            self._close(sync=False)
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _publish(self) -> None:
        self._close(sync=True)
        folder, self._folder = self._folder, None
        try:
            os.rename(folder, self.layout.ready)
        except OSError:  # another process published first: its entry holds the same pairs
            shutil.rmtree(folder, ignore_errors=True)
            return
        log.info("disk cache ready: %s", self.layout.ready)


def disk_cached_pairs(
    pairs: tf.data.Dataset, layout: CacheLayout, *, shuffle: bool, seed: int | None
) -> tf.data.Dataset:
    """uint8 pairs in record order -> the same pairs, from the cache once it is built.

    With ``shuffle`` a cached pass reads the part files in a new order each epoch.
    """
    builder = CacheBuilder(layout)

    def build_pass() -> tf.data.Dataset:
        def write(index, pair):
            image, mask = pair
            written = tf.py_function(builder.write, [index, image, mask], Tout=tf.bool)
            with tf.control_dependencies([written]):
                return tf.identity(image), tf.identity(mask)

        return pairs.enumerate().map(write)  # sequential: records reach the writer in order

    def one_pass(_) -> tf.data.Dataset:
        ready = tf.py_function(layout.is_ready, [], Tout=tf.bool)
        return tf.cond(ready, lambda: read_parts(layout, shuffle=shuffle, seed=seed), build_pass)

    return tf.data.Dataset.range(1).flat_map(one_pass)


def read_parts(layout: CacheLayout, *, shuffle: bool, seed: int | None) -> tf.data.Dataset:
    """The published part files as uint8 pairs; in record order unless ``shuffle``."""
    if layout.variable:
        return _read_variable_parts(layout, shuffle=shuffle, seed=seed)
    return _read_fixed_parts(layout, shuffle=shuffle, seed=seed)


def _read_variable_parts(
    layout: CacheLayout, *, shuffle: bool, seed: int | None
) -> tf.data.Dataset:
    """Records of many sizes: TFRecord-framed pixels, their sizes in the .shape parts."""
    channels = layout.shape[2]
    parts = tf.data.Dataset.from_tensor_slices(
        tuple(
            [str(layout.part(layout.ready, k, what)) for k in range(CACHE_PARTS)]
            for what in layout.kinds()
        )
    )
    if shuffle:
        parts = parts.shuffle(CACHE_PARTS, seed=seed, reshuffle_each_iteration=True)

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

    def part_pairs(image_file, mask_file, shape_file) -> tf.data.Dataset:
        return tf.data.Dataset.zip(
            tf.data.TFRecordDataset(image_file, buffer_size=READ_BUFFER_BYTES),
            tf.data.TFRecordDataset(mask_file, buffer_size=READ_BUFFER_BYTES),
            tf.data.FixedLengthRecordDataset(shape_file, SHAPE_BYTES),
        ).map(decode)

    return parts.interleave(
        part_pairs,
        cycle_length=CACHE_PARTS,
        block_length=1,
        num_parallel_calls=CACHE_PARTS,
        deterministic=not shuffle or seed is not None,
    )


def _read_fixed_parts(layout: CacheLayout, *, shuffle: bool, seed: int | None) -> tf.data.Dataset:
    """The published part files as uint8 pairs; in record order unless ``shuffle``.

    Shuffled, each epoch reads the parts in a new order, each one rotated to start
    at a new random record (a seek, via the header/footer sizes), so a record's
    place in the epoch changes every epoch before the shuffle buffer mixes further.
    """
    counts = [len(range(k, layout.records, CACHE_PARTS)) for k in range(CACHE_PARTS)]
    parts = tf.data.Dataset.from_tensor_slices(
        (
            [str(layout.part(layout.ready, k, "image")) for k in range(CACHE_PARTS)],
            [str(layout.part(layout.ready, k, "mask")) for k in range(CACHE_PARTS)],
            tf.constant(counts, tf.int64),
        )
    )
    if shuffle:
        parts = parts.shuffle(CACHE_PARTS, seed=seed, reshuffle_each_iteration=True)
        starts = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    else:
        starts = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()

    def part_pairs(part, start) -> tf.data.Dataset:
        image_file, mask_file, count = part
        start = start % tf.maximum(count, 1)
        return _records_from(layout, image_file, mask_file, start, count).map(
            lambda image, mask: _decode(layout, image, mask)
        )

    return tf.data.Dataset.zip(parts, starts).interleave(
        part_pairs,
        cycle_length=CACHE_PARTS,
        block_length=1,
        num_parallel_calls=CACHE_PARTS,
        deterministic=not shuffle or seed is not None,
    )


def _records_from(
    layout: CacheLayout, image_file, mask_file, start: tf.Tensor, count: tf.Tensor
) -> tf.data.Dataset:
    """Records start..count-1 then 0..start-1 of one part, as (image bytes, mask bytes)."""

    def rotated(path, record_bytes: int) -> tf.data.Dataset:
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

    return tf.data.Dataset.zip(
        rotated(image_file, layout.image_bytes), rotated(mask_file, layout.mask_bytes)
    )


def _decode(layout: CacheLayout, image: tf.Tensor, mask: tf.Tensor):
    height, width, channels = layout.shape
    return (
        tf.reshape(tf.io.decode_raw(image, tf.uint8), (height, width, channels)),
        tf.reshape(tf.io.decode_raw(mask, tf.uint8), (height, width, 1)),
    )
