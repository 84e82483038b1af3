"""The pipelines users write by hand, for side-by-side comparison with tfshards.read."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

BATCH = 32


def keras_pipeline(
    data: Path,
    size: tuple[int, int],
    cache_file: Path,
    *,
    channels: int = 3,
    batch_size: int = BATCH,
):
    """Two image_dataset_from_directory zipped, shuffled, .cache(file), prefetch."""
    import keras
    import tensorflow as tf

    common = dict(labels=None, batch_size=None, image_size=size, shuffle=False)
    with contextlib.redirect_stdout(io.StringIO()):  # "Found N files." twice, amid the bar
        images = keras.utils.image_dataset_from_directory(
            data / "images", color_mode="grayscale" if channels == 1 else "rgb", **common
        )
        masks = keras.utils.image_dataset_from_directory(
            data / "masks", color_mode="grayscale", interpolation="nearest", **common
        )
    return (
        tf.data.Dataset.zip((images, masks))
        .shuffle(1000)
        .cache(str(cache_file))
        .batch(batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )


def list_files_pipeline(images: Path, masks: Path, *, channels: int = 3, batch_size: int = BATCH):
    """list_files + a parallel map reading and decoding each image and its mask."""
    import tensorflow as tf

    image_root, mask_root = str(images), str(masks)

    def load(image_path):
        mask_path = tf.strings.regex_replace(image_path, "^" + image_root, mask_root)
        mask_path = tf.strings.regex_replace(mask_path, r"\.[a-z]+$", ".png")
        image = tf.io.decode_image(
            tf.io.read_file(image_path), channels=channels, expand_animations=False
        )
        mask = tf.io.decode_png(tf.io.read_file(mask_path), channels=1)
        return tf.cast(image, tf.float32) / 255.0, tf.cast(mask, tf.int32)

    files = tf.data.Dataset.list_files(str(images / "*"), shuffle=True)
    return (
        files.map(load, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )


def ceiling_pipeline(
    shards: Path, split: str = "train", *, cycle_length: int | None = None, batch_size: int = BATCH
):
    """The bare TFRecordDataset: record bytes only, no parsing or decoding."""
    import tensorflow as tf

    from tfshards.readers.shards import split_shards

    listed = split_shards(shards, split)
    files = tf.data.Dataset.from_tensor_slices(list(listed.paths))
    cycle = cycle_length or min(len(listed.paths), 8)
    return (
        files.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=listed.compression_type),
            cycle_length=cycle,
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        .batch(batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )


def bound_pipeline(
    shards: Path,
    *,
    cast: bool,
    split: str = "train",
    cycle_length: int | None = None,
    batch_size: int = BATCH,
):
    """The least work that yields this dataset's uint8 (or float32) batches: read, parse,
    decode with the format registry's batch decoder, [cast]; no shuffle, no cache.

    Raw records give the read+cast bound, deflate records the inflate+cast bound.
    """
    import tensorflow as tf

    from tfshards.readers.decode import pair_decoder
    from tfshards.readers.shards import split_shards

    listed = split_shards(shards, split)
    decoder = pair_decoder(listed, listed.manifest.image_shape)
    if not decoder.whole_batches:
        raise ValueError(f"{shards}: bounds are measured on raw or deflate records of one size")
    files = tf.data.Dataset.from_tensor_slices(list(listed.paths))
    records = files.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=listed.compression_type),
        cycle_length=cycle_length or min(len(listed.paths), 8),
        num_parallel_calls=tf.data.AUTOTUNE,
    )

    def decode(serialized):
        image, mask = decoder.decode_batch(serialized)
        return (_to_float(image), tf.cast(mask, tf.int32)) if cast else (image, mask)

    return (
        records.batch(batch_size)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def cache_bound_pipeline(entry: Path, *, cast: bool, batch_size: int = BATCH):
    """Read a built tfshards disk cache entry in order, a batch of byte records at a time,
    decode each batch with one op per field and [cast]: the warm-epoch bound."""
    import tensorflow as tf

    from tfshards.readers.cache import DiskCache

    cache = DiskCache.at(entry)
    layout = cache.layout
    records = layout.byte_records(cache.parts(shuffle=False), deterministic=True)

    def decode(image, mask):
        image, mask = layout.decode(image, mask)
        return (_to_float(image), tf.cast(mask, tf.int32)) if cast else (image, mask)

    return (
        records.batch(batch_size, num_parallel_calls=tf.data.AUTOTUNE)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def _to_float(image):
    from tfshards.readers.decode import to_float_image

    return to_float_image(image)
