"""`tfshards.read`: a tf.data pipeline over the shards of one split, as a chain of stages.

    open files -> records -> [shuffle records] -> decode -> [cache] -> [shuffle pairs]
      -> batch -> finish (dtype, augment, one-hot) -> cardinality, repeat, prefetch

Streaming (no cache) shuffles the small serialized records and, for raw or deflate
records of one size, decodes whole batches. With a cache, pairs are decoded in
record order, cached (memory, or the disk cache: ``cache_stage.py``), then shuffled.
The ordering decisions (file shuffle, cycle length, determinism) are made once,
in :func:`ordering`; the ``cache`` argument becomes a :class:`CachePlan` once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tensorflow as tf

if TYPE_CHECKING:
    import keras

from tfshards.errors import OptionsError
from tfshards.readers.cache import (
    CacheLayout,
    cache_fingerprint,
    default_cache_root,
    prepare_entry,
)
from tfshards.readers.cache_stage import disk_cached_pairs
from tfshards.readers.decode import (
    Augment,
    PairDecoder,
    decoded_batches,
    decoded_pairs,
    finisher,
    is_keras_layer,
    layer_augmenter,
    pair_decoder,
)
from tfshards.readers.options import (
    DEFAULT_READ_BUFFER,
    SHUFFLE_BUFFER_BYTES,
    CachePlan,
    Ordering,
    ReadOptions,
    ordering,
)
from tfshards.readers.shards import SplitShards, split_shards
from tfshards.readers.sizing import DEFAULT_PAD_LABEL, Sizing, sized_pairs
from tfshards.schemas.format import COMPRESSIONS

AUTOTUNE = tf.data.AUTOTUNE
Finish = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


def read(
    path: str | os.PathLike,
    *,
    split: str = "train",
    batch_size: int = 32,
    image_size: tuple[int, int] | None = None,
    crop_size: tuple[int, int] | None = None,
    pad_to: tuple[int, int] | None = None,
    cache: bool | str | os.PathLike | None = None,
    augment: Augment | keras.layers.Layer | None = None,
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

    augment: a Keras 3 augmentation layer (or ``keras.Sequential`` of them), applied to
    whole batches as ``{"images", "segmentation_masks"}`` so each mask moves with its
    image (give the layers a ``seed`` for reproducible runs); or a function
    ``(image, mask) -> (image, mask)`` applied to each pair. Both run after the cache
    and the shuffle, so they stay random every epoch.

    Records of different sizes: ``crop_size=(h, w)`` trains on random crops at native
    resolution (``ReadOptions(crop_scale=(0.5, 2.0))`` scales randomly first; smaller
    pairs are padded, masks with the ignore label, or 255 when none is declared);
    ``pad_to=(h, w)`` or ``batch_size=1`` evaluates at native size; ``image_size``
    resizes every record instead.

    cache: None streams; "memory" caches in RAM; True caches decoded uint8 pairs on disk
    beside the shards (or in the user cache folder); a path caches there. A disk cache is
    keyed by the shards' hashes and the options, so it is rebuilt when either changes.

    >>> train = tfshards.read("shards/", split="train", batch_size=32,
    ...                       cache=True, seed=0)  # doctest: +SKIP
    >>> model.fit(train, validation_data=tfshards.read("shards/", split="val"))  # doctest: +SKIP
    """
    options = options or ReadOptions()
    plan = CachePlan.of(cache)
    _check_arguments(batch_size, image_dtype, plan, service)
    shuffle = split == "train" if shuffle is None else shuffle
    pipeline = (0, 1)
    if input_context is not None:
        pipeline = (input_context.input_pipeline_id, input_context.num_input_pipelines)
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    shards = split_shards(path, split, pipeline=pipeline)
    sizing = Sizing(crop_size, options.crop_scale, pad_to)
    shape = _target_shape(shards, image_size, sizing, batch_size)
    decoder = pair_decoder(shards, shape)
    order = ordering(
        shards, options, shuffle=shuffle, seed=seed, cached=plan.kind != "none" or bool(service)
    )
    records = _records(_shard_files(shards, order, seed), shards, options, order)
    batching = dict(batch_size=batch_size, drop_remainder=drop_remainder)
    layer = layer_augmenter(augment, shards, one_hot) if is_keras_layer(augment) else None
    if layer is not None:  # whole batches through the Keras layer, after the finish
        augment, one_hot = None, False
    finish = finisher(shards, image_dtype, augment, one_hot)
    if plan.kind == "none" and service is None:
        pairs = _streamed(
            records, decoder, shards, options, order, seed, augment, sizing, **batching
        )
    else:
        pairs = decoded_pairs(
            records, decoder, options.parse_batch_size, deterministic=order.deterministic
        )
        if service is not None:
            pairs = pairs.apply(
                tf.data.experimental.service.distribute("distributed_epoch", service)
            )
        else:
            pairs = _cached(pairs, plan, shards, shape, pipeline, order, seed)
        pairs = _shuffled_pairs(pairs, shards, shape, options, order, seed)
    if isinstance(pairs, BatchedPairs):
        batches = pairs.batches
    else:
        pairs = _sized(pairs, sizing, shards, seed)
        batches = _batched_pairs(pairs, finish, augment, order, **batching)
    return _finished(batches, finish, augment, layer, order, shards, repeat=repeat, **batching)


def _shuffled_pairs(
    pairs: tf.data.Dataset,
    shards: SplitShards,
    shape: tuple[int | None, int | None, int],
    options: ReadOptions,
    order: Ordering,
    seed: int | None,
) -> tf.data.Dataset:
    """Decoded pairs mixed by the shuffle buffer, anew every epoch (when shuffling)."""
    if not order.shuffle:
        return pairs
    buffer = _shuffle_buffer(shards, shape, options)
    return pairs.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)


def _streamed(
    records: tf.data.Dataset,
    decoder: PairDecoder,
    shards: SplitShards,
    options: ReadOptions,
    order: Ordering,
    seed: int | None,
    augment: Augment | None,
    sizing: Sizing,
    *,
    batch_size: int,
    drop_remainder: bool,
) -> tf.data.Dataset | BatchedPairs:
    """Streaming: shuffle the small serialized records, not decoded pixels, then decode
    (whole batches at once where the records allow it)."""
    if order.shuffle:
        buffer = _shuffle_buffer(shards, decoder.shape, options, serialized=True)
        records = records.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if decoder.whole_batches and augment is None and not sizing.active:
        return BatchedPairs(
            decoded_batches(
                records,
                decoder,
                batch_size=batch_size,
                drop_remainder=drop_remainder,
                deterministic=order.deterministic,
            )
        )
    return decoded_pairs(
        records, decoder, options.parse_batch_size, deterministic=order.deterministic
    )


@dataclass(frozen=True)
class BatchedPairs:
    """Streamed records already decoded into batches (raw or deflate of one size)."""

    batches: tf.data.Dataset


def _sized(
    pairs: tf.data.Dataset, sizing: Sizing, shards: SplitShards, seed: int | None
) -> tf.data.Dataset:
    if not sizing.active:
        return pairs
    ignore = shards.manifest.mask.ignore_label
    return sized_pairs(pairs, sizing, DEFAULT_PAD_LABEL if ignore is None else ignore, seed=seed)


def _cached(
    pairs: tf.data.Dataset,
    plan: CachePlan,
    shards: SplitShards,
    shape: tuple[int, int, int],
    pipeline: tuple[int, int],
    order: Ordering,
    seed: int | None,
) -> tf.data.Dataset:
    """Pairs through the cache asked for: memory, or a disk entry (built or read)."""
    if plan.kind == "memory":
        return pairs.cache()
    dataset = Path(shards.paths[0]).parent
    root = plan.root if plan.root is not None else default_cache_root(dataset)
    layout = CacheLayout(root / cache_fingerprint(shards, shape, pipeline), shape, shards.records)
    info = {
        "dataset": str(dataset),
        "split": shards.split,
        "shape": list(shape),
        "pipeline": list(pipeline),
        "records": shards.records,
    }
    if layout.variable:  # native sizes are unknown before decoding: a generous estimate
        stored = shards.manifest.splits[shards.split].bytes
        needed = int(stored * 4) + 2**20
    else:
        needed = int(shards.records * (layout.image_bytes + layout.mask_bytes) * 1.05) + 2**20
    prepare_entry(layout, info, needed)
    return disk_cached_pairs(pairs, layout, shuffle=order.shuffle, seed=seed)


def _batched_pairs(
    pairs: tf.data.Dataset,
    finish: Finish,
    augment: Augment | None,
    order: Ordering,
    *,
    batch_size: int,
    drop_remainder: bool,
) -> tf.data.Dataset:
    """Pairs -> batches; with augment, each pair is finished first, so random transforms
    differ within a batch (without, the batch is finished by one vectorized op)."""
    if augment is not None:
        pairs = pairs.map(finish, num_parallel_calls=AUTOTUNE, deterministic=order.deterministic)
    return pairs.batch(
        batch_size,
        drop_remainder=drop_remainder,
        num_parallel_calls=AUTOTUNE,
        deterministic=order.deterministic,
    )


def _finished(
    batches: tf.data.Dataset,
    finish: Finish,
    augment: Augment | None,
    layer: Finish | None,
    order: Ordering,
    shards: SplitShards,
    *,
    repeat: bool,
    batch_size: int,
    drop_remainder: bool,
) -> tf.data.Dataset:
    """Output dtypes (one vectorized cast per batch), known cardinality, repeat, prefetch."""
    if augment is None:  # with augment, _batched_pairs finished each pair
        batches = batches.map(
            finish, num_parallel_calls=AUTOTUNE, deterministic=order.deterministic
        )
    if layer is not None:
        batches = batches.map(layer, num_parallel_calls=AUTOTUNE, deterministic=order.deterministic)
    records = shards.records
    count = records // batch_size if drop_remainder else math.ceil(records / batch_size)
    batches = batches.apply(tf.data.experimental.assert_cardinality(count))
    if repeat:
        batches = batches.repeat()
    return batches.prefetch(AUTOTUNE)


def _check_arguments(
    batch_size: int, image_dtype: str, plan: CachePlan, service: str | None
) -> None:
    if batch_size < 1:
        raise OptionsError(f"batch_size must be at least 1, got {batch_size}")
    if image_dtype not in ("float32", "uint8"):
        raise OptionsError(f"image_dtype must be 'float32' or 'uint8', got {image_dtype!r}")
    if service is not None and plan.kind != "none":
        raise OptionsError(
            "cache and service cannot be combined: the tf.data service "
            "workers decode on other machines; pass cache=None"
        )


def _target_shape(
    shards: SplitShards, image_size: tuple[int, int] | None, sizing: Sizing, batch_size: int
) -> tuple[int | None, int | None, int]:
    """The decoded shape: resized, stored, or (None, None, C) to keep each record's own."""
    channels = shards.manifest.image.channels
    if image_size is not None:
        if sizing.active:
            raise OptionsError("pass image_size (resize) or crop_size/pad_to, not both")
        if len(image_size) != 2 or min(image_size) < 1:
            raise OptionsError(f"image_size must be (height, width), got {image_size}")
        return (int(image_size[0]), int(image_size[1]), channels)
    stored = shards.manifest.image_shape
    if stored is not None:
        return stored
    if sizing.active or batch_size == 1:
        return (None, None, channels)
    raise OptionsError(
        "the records of this dataset differ in size, so they cannot be batched as they "
        "are; pass crop_size=(h, w) to train on random crops, pad_to=(h, w) or "
        "batch_size=1 to evaluate at native size, or image_size=(h, w) to resize them all"
    )


def _shard_files(shards: SplitShards, order: Ordering, seed: int | None) -> tf.data.Dataset:
    files = tf.data.Dataset.from_tensor_slices(list(shards.paths))
    if order.shuffle_files:
        files = files.shuffle(len(shards.paths), seed=seed, reshuffle_each_iteration=True)
    return files


def _records(
    files: tf.data.Dataset, shards: SplitShards, options: ReadOptions, order: Ordering
) -> tf.data.Dataset:
    compression = shards.compression_type
    buffer = options.read_buffer_bytes or DEFAULT_READ_BUFFER

    def open_shard(path: tf.Tensor) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=buffer)

    if order.cycle_length == 1:
        return files.interleave(open_shard, cycle_length=1, block_length=options.block_length)
    return files.interleave(
        open_shard,
        cycle_length=order.cycle_length,
        block_length=options.block_length,
        num_parallel_calls=AUTOTUNE,
        deterministic=order.deterministic,
    )


def _shuffle_buffer(
    shards: SplitShards,
    shape: tuple[int, int, int],
    options: ReadOptions,
    *,
    serialized: bool = False,
) -> int:
    """Records that fit in SHUFFLE_BUFFER_BYTES: decoded pixels, or serialized records."""
    if options.shuffle_buffer is not None:
        return options.shuffle_buffer
    stored = shards.manifest.splits[shards.split].bytes // max(shards.records, 1)
    # Native sizes are unknown before decoding: decoded pairs take about 3x a stored record.
    record_bytes = shape[0] * shape[1] * (shape[2] + 1) if shape[0] else 3 * stored
    if serialized and COMPRESSIONS[shards.manifest.compression.type].zlib_wbits is None:
        # Records as stored (deflate, PNG, JPEG are smaller than pixels; raw the same).
        record_bytes = max(1, stored)
    return max(1, min(shards.records, 10_000, SHUFFLE_BUFFER_BYTES // record_bytes))
