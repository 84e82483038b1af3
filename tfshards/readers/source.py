"""Where the shard bytes come from: the first stage, and the only one that knows paths."""

from __future__ import annotations

import tensorflow as tf

from tfshards.readers.plan import ReadPlan


def shard_files(plan: ReadPlan) -> tf.data.Dataset:
    """The split's shard files for this input pipeline, reshuffled every epoch when the
    ordering asks for it."""
    paths = list(plan.shards.paths)
    files = tf.data.Dataset.from_tensor_slices(paths)
    if plan.order.shuffle_files:
        files = files.shuffle(len(paths), seed=plan.seed, reshuffle_each_iteration=True)
    return files
