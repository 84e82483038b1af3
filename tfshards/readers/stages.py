"""The stages of ``tfshards.read`` through the tf.data service: each a
``(Dataset, ReadPlan) -> Dataset`` function.

    shard records (source.py) -> decoded -> served -> shuffled pairs -> sized -> batched
      -> finished -> counted -> budgeted

Every other read is the ordered reader's (ordered.py), which ends with ``budgeted``
too. A stage that does not apply to a plan returns its input; pairs become batches
after the pairs stages. The service cannot be combined with a cache (arguments.py).
"""

from __future__ import annotations

import tensorflow as tf

from tfshards.readers.decode import decoded_pairs, fill_label
from tfshards.readers.plan import ReadPlan
from tfshards.readers.sizing import sized_pairs

AUTOTUNE = tf.data.AUTOTUNE


def decoded(records: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    """Serialized records -> uint8 pairs."""
    return decoded_pairs(
        records,
        plan.decoder,
        plan.options.parse_batch_size,
        deterministic=plan.order.deterministic,
    )


def served(pairs: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    """Decoded pairs through the tf.data service, when one is given."""
    if plan.service is None:
        return pairs
    return pairs.apply(tf.data.experimental.service.distribute("distributed_epoch", plan.service))


def shuffled_pairs(pairs: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    """Decoded pairs mixed by the shuffle buffer, anew every epoch."""
    if not plan.order.shuffle:
        return pairs
    buffer = plan.shuffle_buffer()
    return pairs.shuffle(buffer, seed=plan.seed, reshuffle_each_iteration=True)


def sized(pairs: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    """Pairs of many sizes cropped/padded to one (the plan's sizing), when asked."""
    if not plan.sizing.active:
        return pairs
    return sized_pairs(pairs, plan.sizing, fill_label(plan.shards), seed=plan.seed)


def batched(pairs: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    """Pairs -> batches; with a per-pair augment each pair is finished first, so random
    transforms differ within a batch."""
    if plan.finishing.per_pair_augment:
        pairs = pairs.map(
            plan.finishing.finish,
            num_parallel_calls=AUTOTUNE,
            deterministic=plan.order.deterministic,
        )
    return _batch(pairs, plan)


def finished(batches: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    """Output dtypes (one vectorized op per batch), then a Keras layer on whole batches;
    batches stay in order, so the short one stays last."""
    finishing, deterministic = plan.finishing, True
    if not finishing.per_pair_augment:  # else batched() finished each pair
        batches = batches.map(
            finishing.finish, num_parallel_calls=AUTOTUNE, deterministic=deterministic
        )
    if finishing.layer is not None:
        batches = batches.map(
            finishing.layer, num_parallel_calls=AUTOTUNE, deterministic=deterministic
        )
    return batches


def counted(batches: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    """Known cardinality (Keras sizes epochs by it), repeat, prefetch."""
    batches = batches.apply(tf.data.experimental.assert_cardinality(plan.batching.count))
    if plan.repeat:
        batches = batches.repeat()
    return batches.prefetch(AUTOTUNE)


def budgeted(batches: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    """tf.data's autotuned buffers held to the plan's RAM budget, where it has one (a
    memory cgroup below the machine's memory: see memory_limits.py)."""
    if plan.ram_budget is None:
        return batches
    options = tf.data.Options()
    options.autotune.ram_budget = plan.ram_budget
    limited = batches.with_options(options)
    reader = getattr(batches, "_tfshards_reader", None)
    if reader is not None:  # ResumeCallback finds it on the dataset read() returns
        limited._tfshards_reader = reader
    return limited


def _batch(dataset: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    # Parallel: gathering a batch of large records out of a shuffle buffer is a copy
    # from memory far larger than the CPU caches.
    # Batches in order, always: out of order, the short last batch could come mid-epoch.
    return dataset.batch(
        plan.batching.size,
        drop_remainder=plan.batching.drop_remainder,
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
