"""Where the shard bytes come from: the first stage, and the only one that knows paths.

    shard files (this epoch's order) -> records, ``cycle_length`` shards at a time

Local shards are read where they are. Shards at a URL are downloaded whole into the
local shard cache (``shard_cache.py``), ``download_ahead`` at a time ahead of the
reader in this epoch's shard order, and tf.data reads the local copies as it reads
any file. A copy is marked in use from when its shard is opened until its last
record has been read, so the cache's limit never evicts a shard being read.
"""

from __future__ import annotations

import tensorflow as tf

from tfshards.readers.plan import ReadPlan
from tfshards.schemas.format import compression
from tfshards.sources.records import dataset_changed, file_identity
from tfshards.sources.shard_cache import ShardCache

AUTOTUNE = tf.data.AUTOTUNE


def shard_records(plan: ReadPlan) -> tf.data.Dataset:
    """Serialized records of the split's shards for this input pipeline."""
    shards = plan.shards
    kind = compression(shards.manifest.compression.type).tf_name
    # None: TensorFlow's default; an explicit size makes TensorFlow log an INFO line.
    buffer = plan.options.read_buffer_bytes

    def read_file(path: tf.Tensor) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(path, compression_type=kind, buffer_size=buffer)

    if plan.downloads is None:
        files = _epoch_order(tf.data.Dataset.from_tensor_slices(list(shards.paths)), plan)
        return _interleaved(files, _checked(read_file, shards.paths), plan)
    return _downloaded_records(plan, read_file)


def _checked(read_file, paths: tuple[str, ...]):
    """Each shard is checked to be the file the read began with, when it is opened and
    after its last record: a shard replaced meanwhile (``convert --overwrite``) stops
    the read with DatasetChangedError instead of mixing two datasets."""
    identities = {path: file_identity(path) for path in paths}

    def check(path: tf.Tensor) -> tf.Tensor:
        def same(name: bytes) -> bytes:
            name = name.decode()
            if file_identity(name) != identities[name]:
                raise dataset_changed(name, "another file now has its name")
            return b""

        checked = tf.py_function(lambda p: same(p.numpy()), [path], tf.string)
        return tf.ensure_shape(checked, [])

    def read_checked(path: tf.Tensor) -> tf.data.Dataset:
        opened = check(path)
        with tf.control_dependencies([opened]):
            records = read_file(tf.identity(path))
        after = tf.data.Dataset.from_tensors(path).map(check).filter(lambda _: False)
        return records.concatenate(after)

    return read_checked


def _epoch_order(files: tf.data.Dataset, plan: ReadPlan) -> tf.data.Dataset:
    if not plan.order.shuffle_files:
        return files
    count = len(plan.shards.shards)
    return files.shuffle(count, seed=plan.seed, reshuffle_each_iteration=True)


def _interleaved(files: tf.data.Dataset, read_file, plan: ReadPlan) -> tf.data.Dataset:
    order, block = plan.order, plan.options.block_length
    if order.cycle_length == 1:
        return files.interleave(read_file, cycle_length=1, block_length=block)
    return files.interleave(
        read_file,
        cycle_length=order.cycle_length,
        block_length=block,
        num_parallel_calls=AUTOTUNE,
        deterministic=order.deterministic,
    )


def _downloaded_records(plan: ReadPlan, read_file) -> tf.data.Dataset:
    """Shard indices in this epoch's order: each downloaded before the interleave opens
    it, fetched (marked in use) when opened, released after its last record."""
    downloads, shards = plan.downloads, plan.shards.shards
    cache = ShardCache(
        downloads.folder,
        plan.shards.root,
        limit=downloads.limit,
        keep=downloads.keep,
        storage_options=plan.options.storage_options,
    )

    def download(index: tf.Tensor) -> tf.Tensor:
        def present(i) -> int:
            cache.ensure(shards[int(i)])
            return int(i)

        return tf.ensure_shape(tf.py_function(present, [index], Tout=tf.int64), [])

    def read_shard(index: tf.Tensor) -> tf.data.Dataset:
        path = tf.py_function(lambda i: cache.fetch(shards[int(i)]), [index], Tout=tf.string)
        released = tf.data.Dataset.from_tensors(index).map(
            lambda i: tf.py_function(lambda j: _release(cache, shards[int(j)]), [i], tf.string)
        )
        done = released.filter(lambda _: False)  # runs once the shard's records are read
        return read_file(tf.ensure_shape(path, [])).concatenate(done)

    indices = _epoch_order(tf.data.Dataset.range(len(shards)), plan)
    # A parallel map runs ``ahead`` downloads at once, in order, ahead of what the
    # interleave has opened; tf.data's threads do it, so a stopped reader stops them.
    downloaded = indices.map(download, num_parallel_calls=downloads.ahead, deterministic=True)
    return _interleaved(downloaded, read_shard, plan)


def _release(cache: ShardCache, shard) -> bytes:
    cache.release(shard)
    return b""
