"""Masks read through label maps (labels.py), in TensorFlow: one gather per batch."""

from __future__ import annotations

from collections.abc import Callable

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
