"""`tfshards.read`: a tf.data pipeline over the shards of one split.

manifest -> shard files -> [shuffle files] -> interleave(TFRecordDataset)
  -> batched parse -> parallel decode -> resize -> [cache] -> [shuffle]
  -> to float / augment / one-hot -> batch -> cardinality -> [repeat] -> prefetch

Each arrow is one small function below.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import tensorflow as tf

from tfshards.errors import OptionsError
from tfshards.readers.cache import cached_pairs
from tfshards.readers.decode import (
    Augment,
    decoded_pairs,
    finisher,
    raw_batch_decoder,
    raw_same_size,
)
from tfshards.readers.shards import SplitShards, split_shards

AUTOTUNE = tf.data.AUTOTUNE


@dataclass(frozen=True)
class ReadOptions:
    """Pipeline knobs; the defaults follow from the shard count and record size.

    cycle_length: shards read at once (default: min(shards, 8); 1 when not shuffling
        or when building a disk cache, so records come in the manifest's order).
    block_length: consecutive records taken from one shard before moving on.
    parse_batch_size: records parsed per vectorized ``parse_example`` call.
    shuffle_buffer: records mixed by the shuffle buffer (default: as many as fit in
        about 256 MiB of uint8 pixels, at most 10,000).
    read_buffer_bytes: TFRecordDataset read-ahead buffer per shard (default: TF's).
    deterministic: element order independent of thread timing (default: True when
        not shuffling or when a seed is given).
    """

    cycle_length: int | None = None
    block_length: int = 1
    parse_batch_size: int = 64
    shuffle_buffer: int | None = None
    read_buffer_bytes: int | None = None
    deterministic: bool | None = None

    def __post_init__(self) -> None:
        for name in ("cycle_length", "shuffle_buffer", "read_buffer_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionsError(f"{name} must be at least 1, got {value}")
        if self.block_length < 1 or self.parse_batch_size < 1:
            raise OptionsError("block_length and parse_batch_size must be at least 1")


def read(
    path: str | os.PathLike,
    *,
    split: str = "train",
    batch_size: int = 32,
    image_size: tuple[int, int] | None = None,
    cache: bool | str | os.PathLike | None = None,
    augment: Augment | None = None,
    seed: int | None = None,
    shuffle: bool | None = None,
    image_dtype: str = "float32",
    one_hot: bool = False,
    drop_remainder: bool = False,
    repeat: bool = False,
    input_context: tf.distribute.InputContext | None = None,
    service: str | None = None,
    options: ReadOptions | None = None,
) -> tf.data.Dataset:
    """Stream ``(image, mask)`` batches of one split of a converted dataset.

    image: float32 in [0, 1] (or uint8 with ``image_dtype="uint8"``), [B, H, W, C].
    mask: int32 class indices [B, H, W, 1] (float32 one-hot [B, H, W, K] with ``one_hot``).

    cache: None streams; "memory" caches in RAM; True caches decoded uint8 pairs on disk
    beside the shards (or in the user cache folder); a path caches there. A disk cache is
    keyed by the shards' hashes and the options, so it is rebuilt when either changes.

    >>> train = tfshards.read("shards/", split="train", batch_size=32,
    ...                       image_size=(256, 256), cache=True, seed=0)  # doctest: +SKIP
    >>> model.fit(train, validation_data=tfshards.read("shards/", split="val"))  # doctest: +SKIP
    """
    options = options or ReadOptions()
    _check_arguments(batch_size, image_dtype, cache, service)
    shuffle = split == "train" if shuffle is None else shuffle
    pipeline = (
        (input_context.input_pipeline_id, input_context.num_input_pipelines)
        if input_context is not None
        else (0, 1)
    )
    if input_context is not None:
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    shards = split_shards(path, split, pipeline=pipeline)
    shape = _target_shape(shards, image_size)
    deterministic = options.deterministic
    if deterministic is None:
        deterministic = not shuffle or seed is not None
    disk = cache not in (None, False, "memory") and service is None
    # A disk cache must see the same element order in every process, so the
    # files are not shuffled before it; shards are pre-shuffled at conversion.
    shuffle_files = shuffle and not disk
    files = _file_dataset(shards, shuffle=shuffle_files, seed=seed)
    records = _records(
        files,
        shards,
        options,
        # A disk cache holds the manifest's order, whoever builds it: one shard at a time.
        parallel=(shuffle and not disk) or options.cycle_length,
        deterministic=deterministic or disk,
    )
    finish = finisher(shards, image_dtype, augment, one_hot)
    batching = dict(
        batch_size=batch_size, drop_remainder=drop_remainder, deterministic=deterministic
    )
    if cache in (None, False) and service is None:
        # Streaming: shuffle the small serialized records, not decoded pixels.
        if shuffle:
            records = records.shuffle(
                _shuffle_buffer(shards, shape, options, serialized=True),
                seed=seed,
                reshuffle_each_iteration=True,
            )
        if raw_same_size(shards, shape) and augment is None:
            # Raw pixels of one size: parse, decode and cast whole batches, no per-record op.
            batches = (
                records.batch(batch_size, drop_remainder=drop_remainder)
                .map(
                    raw_batch_decoder(shape),
                    num_parallel_calls=AUTOTUNE,
                    deterministic=deterministic,
                )
                .map(finish, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
            )
        else:
            pairs = decoded_pairs(
                records, shards, shape, options.parse_batch_size, deterministic=deterministic
            )
            batches = _batched(pairs, finish, augment, **batching)
    else:
        pairs = decoded_pairs(
            records, shards, shape, options.parse_batch_size, deterministic=deterministic or disk
        )
        if service is None:
            pairs = cached_pairs(pairs, cache, shards, shape, pipeline)
        else:
            pairs = pairs.apply(
                tf.data.experimental.service.distribute("distributed_epoch", service)
            )
        if shuffle:
            pairs = pairs.shuffle(
                _shuffle_buffer(shards, shape, options), seed=seed, reshuffle_each_iteration=True
            )
        batches = _batched(pairs, finish, augment, **batching)
    count = (
        shards.records // batch_size if drop_remainder else math.ceil(shards.records / batch_size)
    )
    batches = batches.apply(tf.data.experimental.assert_cardinality(count))
    if repeat:
        batches = batches.repeat()
    return batches.prefetch(AUTOTUNE)


def _batched(
    pairs: tf.data.Dataset,
    finish,
    augment: Augment | None,
    *,
    batch_size: int,
    drop_remainder: bool,
    deterministic: bool,
) -> tf.data.Dataset:
    """uint8 pairs -> finished batches; augment runs per example, else one cast per batch."""
    if augment is not None:  # per example, so random transforms differ within a batch
        pairs = pairs.map(finish, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    batches = pairs.batch(
        batch_size,
        drop_remainder=drop_remainder,
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )
    if augment is None:  # one vectorized cast per batch: far cheaper than one per example
        batches = batches.map(finish, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    return batches


def _check_arguments(batch_size: int, image_dtype: str, cache, service: str | None) -> None:
    if batch_size < 1:
        raise OptionsError(f"batch_size must be at least 1, got {batch_size}")
    if image_dtype not in ("float32", "uint8"):
        raise OptionsError(f"image_dtype must be 'float32' or 'uint8', got {image_dtype!r}")
    if service is not None and cache not in (None, False):
        raise OptionsError(
            "cache and service cannot be combined: the tf.data service "
            "workers decode on other machines; pass cache=None"
        )


def _target_shape(shards: SplitShards, image_size: tuple[int, int] | None) -> tuple[int, int, int]:
    channels = shards.manifest.image["channels"]
    if image_size is not None:
        if len(image_size) != 2 or min(image_size) < 1:
            raise OptionsError(f"image_size must be (height, width), got {image_size}")
        return (int(image_size[0]), int(image_size[1]), channels)
    stored = shards.manifest.image_shape
    if stored is None:
        raise OptionsError(
            "the records of this dataset differ in size, so they cannot be batched as they "
            "are; pass image_size=(height, width) to resize them"
        )
    return stored


def _file_dataset(shards: SplitShards, *, shuffle: bool, seed: int | None) -> tf.data.Dataset:
    files = tf.data.Dataset.from_tensor_slices(list(shards.paths))
    if shuffle:
        files = files.shuffle(len(shards.paths), seed=seed, reshuffle_each_iteration=True)
    return files


def _records(
    files: tf.data.Dataset,
    shards: SplitShards,
    options: ReadOptions,
    *,
    parallel,
    deterministic: bool,
) -> tf.data.Dataset:
    cycle = options.cycle_length or (min(len(shards.paths), 8) if parallel else 1)
    compression = shards.compression_type
    buffer = options.read_buffer_bytes

    def open_shard(path: tf.Tensor) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=buffer)

    if cycle == 1:
        return files.interleave(open_shard, cycle_length=1, block_length=options.block_length)
    return files.interleave(
        open_shard,
        cycle_length=cycle,
        block_length=options.block_length,
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )


def _shuffle_buffer(
    shards: SplitShards,
    shape: tuple[int, int, int],
    options: ReadOptions,
    *,
    serialized: bool = False,
) -> int:
    """Records that fit in about 256 MiB: decoded pixels, or serialized records."""
    if options.shuffle_buffer is not None:
        return options.shuffle_buffer
    record_bytes = shape[0] * shape[1] * (shape[2] + 1)
    if serialized and shards.manifest.image["encoding"] != "raw":
        record_bytes = max(1, shards.manifest.splits[shards.split].bytes // max(shards.records, 1))
    return max(1, min(shards.records, 10_000, (256 * 2**20) // record_bytes))
