"""Parsing and decoding records into uint8 (image, mask) pairs, and finishing them.

The decoders follow the manifest: raw pixels of one size are decoded a whole
batch at a time; PNG/JPEG (or mixed sizes) one record at a time, in parallel.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfshards.readers.shards import SplitShards
from tfshards.schemas.record import tf_decode_pixels, tf_feature_spec

AUTOTUNE = tf.data.AUTOTUNE
Augment = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


def decoded_pairs(
    records: tf.data.Dataset,
    shards: SplitShards,
    shape: tuple[int, int, int],
    parse_batch_size: int,
    *,
    deterministic: bool,
) -> tf.data.Dataset:
    spec = tf_feature_spec()
    raw_image = shards.manifest.image["encoding"] == "raw"
    raw_mask = shards.manifest.mask["encoding"] == "raw"
    height, width, channels = shape
    stored = shards.manifest.image_shape

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        return tf.io.parse_example(serialized, spec)

    def decode(features: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        h, w = features["image/height"], features["image/width"]
        image = tf_decode_pixels(features["image/encoded"], h, w, channels, raw=raw_image)
        mask = tf_decode_pixels(features["mask/encoded"], h, w, 1, raw=raw_mask)
        if stored is None or stored[:2] != (height, width):
            image = tf.image.resize(image, (height, width), method="bilinear", antialias=True)
            image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
            mask = tf.image.resize(mask, (height, width), method="nearest")
        return tf.ensure_shape(image, shape), tf.ensure_shape(mask, (height, width, 1))

    parsed = records.batch(parse_batch_size).map(
        parse, num_parallel_calls=AUTOTUNE, deterministic=deterministic
    )
    if raw_same_size(shards, shape):
        return parsed.map(
            raw_decoder(shape), num_parallel_calls=AUTOTUNE, deterministic=deterministic
        ).unbatch()
    return parsed.unbatch().map(decode, num_parallel_calls=AUTOTUNE, deterministic=deterministic)


def raw_same_size(shards: SplitShards, shape: tuple[int, int, int]) -> bool:
    manifest = shards.manifest
    return (
        manifest.image["encoding"] == "raw"
        and manifest.mask["encoding"] == "raw"
        and manifest.image_shape == shape
    )


def raw_decoder(shape: tuple[int, int, int]):
    """Parsed features of a batch of same-size raw records -> uint8 image and mask batches."""
    height, width, _ = shape

    def decode(features: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        image = tf.io.decode_raw(features["image/encoded"], tf.uint8)
        mask = tf.io.decode_raw(features["mask/encoded"], tf.uint8)
        return tf.reshape(image, (-1, *shape)), tf.reshape(mask, (-1, height, width, 1))

    return decode


def raw_batch_decoder(shape: tuple[int, int, int]):
    """Serialized same-size raw records -> uint8 image and mask batches."""
    spec = tf_feature_spec()
    decode = raw_decoder(shape)

    def parse_and_decode(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return decode(tf.io.parse_example(serialized, spec))

    return parse_and_decode


def finisher(
    shards: SplitShards, image_dtype: str, augment: Augment | None, one_hot: bool
) -> Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """uint8 pairs (one or a batch) -> output dtypes, with augment and one-hot."""
    classes = _num_classes(shards) if one_hot else 0

    def finish(image: tf.Tensor, mask: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        if image_dtype == "float32":
            image = tf.cast(image, tf.float32) / 255.0
        mask = tf.cast(mask, tf.int32)
        if augment is not None:
            image, mask = augment(image, mask)
        if one_hot:
            mask = tf.one_hot(mask[..., 0], classes, dtype=tf.float32)
        return image, mask

    return finish


def _num_classes(shards: SplitShards) -> int:
    manifest = shards.manifest
    if manifest.mask.get("num_classes"):
        return manifest.mask["num_classes"]
    return max(len(split.class_pixels) for split in manifest.splits.values())
