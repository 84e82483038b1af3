"""Pairs of different sizes to batches of one size, without a global resize.

Training: an optional random scale, then a random crop of ``crop_size``; images
smaller than the crop are padded (images with 0, masks with the ignore label).
Validation: padding to ``pad_to`` (nothing is cropped), or batches of one.

The ordered reader places each crop before decoding (``crops.py``: a function of
(seed, epoch, batch, position)) and cuts it here with :func:`placed`. The tf.data
service path (``sized_pairs``) draws from ``tf.data.Dataset.random`` instead (new
numbers every epoch, reproducible with a seed), as its workers decide the order.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from tfshards.arguments import checked_size
from tfshards.errors import OptionsError

AUTOTUNE = tf.data.AUTOTUNE
# Mask value of padded pixels when the dataset declares no ignore label; the loss should
# skip it: keras.losses.SparseCategoricalCrossentropy(ignore_class=255).
DEFAULT_PAD_LABEL = 255


@dataclass(frozen=True)
class Sizing:
    """How pairs of different sizes reach one batch shape."""

    crop_size: tuple[int, int] | None = None
    crop_scale: tuple[float, float] | None = None
    pad_to: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.crop_size is not None and self.pad_to is not None:
            raise OptionsError("pass crop_size (training) or pad_to (validation), not both")
        for name in ("crop_size", "pad_to"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, checked_size(name, getattr(self, name)))
        if self.crop_scale is not None:
            low, high = self.crop_scale
            if not 0 < low <= high:
                raise OptionsError(f"crop_scale must be (low, high) with 0 < low <= high, got "
                                   f"{self.crop_scale}")  # fmt: skip
            if self.crop_size is None:
                raise OptionsError("crop_scale needs crop_size")

    @property
    def active(self) -> bool:
        return self.crop_size is not None or self.pad_to is not None

    @property
    def size(self) -> tuple[int, int] | None:
        return self.crop_size or self.pad_to


def sized_pairs(
    pairs: tf.data.Dataset, sizing: Sizing, fill_label: int, *, seed: int | None
) -> tf.data.Dataset:
    """uint8 pairs of any size -> pairs of ``sizing.size``."""
    if sizing.pad_to is not None:
        height, width = sizing.pad_to
        return pairs.map(
            lambda image, mask: _padded(image, mask, height, width, fill_label),
            num_parallel_calls=AUTOTUNE,
        )
    draws = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    return tf.data.Dataset.zip(pairs, draws).map(
        lambda pair, draw: _random_crop(*pair, draw, sizing, fill_label),
        num_parallel_calls=AUTOTUNE,
    )


def placed(image, mask, box, sizing: Sizing, fill_label: int):
    """One pair -> ``sizing.size``, as its box says: (own height, own width, then
    crops.py's box: height, width, top, left). The pair's own pixels are the top left of
    ``image`` (a batch padded to its largest pair); scaled to (height, width) with
    ``crop_scale``, padded to at least the crop, cut at (top, left); or padded to
    ``pad_to``; without sizing, the pair at its own size."""
    image, mask = image[: box[0], : box[1]], mask[: box[0], : box[1]]
    if sizing.pad_to is not None:
        return _padded(image, mask, *sizing.pad_to, fill_label)
    if sizing.crop_size is None:
        return image, mask
    height, width = sizing.crop_size
    if sizing.crop_scale is not None:
        image, mask = _resized(image, mask, box[2:4])
    image, mask = _padded(image, mask, height, width, fill_label, at_least=True)
    image = tf.slice(image, [box[4], box[5], 0], [height, width, -1])
    mask = tf.slice(mask, [box[4], box[5], 0], [height, width, -1])
    return (
        tf.ensure_shape(image, (height, width, image.shape[-1])),
        tf.ensure_shape(mask, (height, width, 1)),
    )


def placed_batch(images, masks, boxes, sizing: Sizing, fill_label: int):
    """A batch [B, H, W, .] (each pair at its top left) -> ``sizing.size``, each pair as
    its box says; without sizing, a batch of one at its own size."""
    if not sizing.active:
        return images[:, : boxes[0, 0], : boxes[0, 1]], masks[:, : boxes[0, 0], : boxes[0, 1]]
    height, width = sizing.size
    signature = (
        tf.TensorSpec((height, width, images.shape[-1]), images.dtype),
        tf.TensorSpec((height, width, 1), masks.dtype),
    )
    return tf.map_fn(
        lambda pair: placed(*pair, sizing, fill_label),
        (images, masks, boxes),
        fn_output_signature=signature,
    )


def _resized(image, mask, size):
    image = tf.image.resize(image, size, method="bilinear", antialias=True)
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    return image, tf.image.resize(mask, size, method="nearest")


def _random_crop(image, mask, draw, sizing: Sizing, fill_label: int):
    height, width = sizing.crop_size
    seed = tf.stack([draw, tf.constant(0, tf.int64)])
    if sizing.crop_scale is not None:
        low, high = sizing.crop_scale
        scale = tf.random.stateless_uniform([], seed, low, high)
        size = tf.cast(tf.round(tf.cast(tf.shape(image)[:2], tf.float32) * scale), tf.int32)
        size = tf.maximum(size, 1)
        image = tf.image.resize(image, size, method="bilinear", antialias=True)
        image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        mask = tf.image.resize(mask, size, method="nearest")
    image, mask = _padded(image, mask, height, width, fill_label, at_least=True)
    spare = tf.shape(image)[:2] - tf.constant([height, width])
    corner = tf.random.stateless_uniform([2], seed + 1, maxval=tf.int32.max, dtype=tf.int32) % (
        spare + 1
    )
    image = tf.slice(image, [corner[0], corner[1], 0], [height, width, -1])
    mask = tf.slice(mask, [corner[0], corner[1], 0], [height, width, -1])
    return (
        tf.ensure_shape(image, (height, width, image.shape[-1])),
        tf.ensure_shape(mask, (height, width, 1)),
    )


def _padded(image, mask, height: int, width: int, fill_label: int, *, at_least: bool = False):
    """Pad bottom and right to (height, width); larger pairs are an error unless at_least."""
    shape = tf.shape(image)[:2]
    if not at_least:
        # The check must run before the shapes are fixed below, or a too-large record
        # fails there first, with tf.ensure_shape's message instead of this one.
        checked = tf.debugging.assert_less_equal(
            shape,
            tf.constant([height, width]),
            message=f"a record is larger than pad_to=({height}, {width}); pass a larger "
            "pad_to, or batch_size=1 to read records at their own size",
        )
        with tf.control_dependencies([checked]):
            shape = tf.identity(shape)
    extra = tf.maximum(tf.constant([height, width]) - shape, 0)
    paddings = [[0, extra[0]], [0, extra[1]], [0, 0]]
    image = tf.pad(image, paddings)
    mask = tf.pad(mask, paddings, constant_values=tf.cast(fill_label, mask.dtype))
    if at_least:
        return image, mask
    return (
        tf.ensure_shape(image, (height, width, image.shape[-1])),
        tf.ensure_shape(mask, (height, width, 1)),
    )
