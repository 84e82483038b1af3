"""Masks read through label maps (labels.py), in TensorFlow: one gather per batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import tensorflow as tf

from tfshards.readers.labels import MASK_VALUES, MaskLabels


def relabeller(labels: MaskLabels | None) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``relabel(indices, masks)``: int32 masks [B, H, W, 1] of the records at ``indices``
    (global record indices, int64 [B]) in the shared classes; unchanged without maps."""
    if labels is None:
        return lambda indices, masks: masks
    table = tf.constant(labels.values.reshape(-1), tf.int32)
    if len(labels.offsets) == 1:
        return lambda indices, masks: tf.gather(table, masks)
    offsets = tf.constant(labels.offsets, tf.int64)

    def relabel(indices: tf.Tensor, masks: tf.Tensor) -> tf.Tensor:
        source = tf.searchsorted(offsets, indices, side="right") - 1
        shift = tf.cast(source, tf.int32) * MASK_VALUES
        return tf.gather(table, masks + tf.reshape(shift, [-1, 1, 1, 1]))

    return relabel


def one_hot_finishing(finishing: Any, labels: MaskLabels) -> Any:
    """A plan's Finishing (made without one-hot) that one-hot encodes the masks in the
    shared classes after everything else; the ignore label (never a shared class) gives
    all-zero vectors."""
    classes = labels.num_classes

    def encode(mask: tf.Tensor) -> tf.Tensor:
        return tf.one_hot(mask[..., 0], classes, dtype=tf.float32)  # zero above the depth

    if finishing.layer is not None:
        layer = finishing.layer

        def layered(image: tf.Tensor, mask: tf.Tensor, step: tf.Tensor | None = None):
            image, mask = layer(image, mask, step)
            return image, encode(mask)

        return replace(finishing, layer=layered)
    finish = finishing.finish

    def finished(image: tf.Tensor, mask: tf.Tensor):
        image, mask = finish(image, mask)
        return image, encode(mask)

    return replace(finishing, finish=finished)
