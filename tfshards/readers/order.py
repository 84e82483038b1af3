"""Which records each batch holds: a pure function of (seed, epoch, batch), no TensorFlow.

An epoch's order (``EpochOrder.records``):

    shards in an order drawn from (seed, epoch) -> groups of ``group_shards`` shards
      -> each group's records in an order drawn from the same generator -> concatenated

The converter already shuffled the pairs before sharding, so each group is a random
sample of the split; mixing whole groups keeps reads within a few shards at a time
(sequential enough for a cold disk and the shard cache) while every epoch gets a new
order. Nothing depends on an earlier epoch, a buffer or a thread, so any position is
computed directly, in any process.

Batches (``BatchSchedule``): the epoch's order is cut into rounds of ``pipelines x
batch_size`` records; pipeline ``p`` takes the ``p``-th slice of every round. The order
does not depend on the number of pipelines, so a job resumed on another number of hosts
continues the same global sequence. With one pipeline the last, short batch is kept
(unless ``drop_remainder``); with several, only whole rounds are read, so every pipeline
yields the same number of batches: the epoch's last ``records % (pipelines x
batch_size)`` records are left out (other records each epoch when shuffled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Records of a group of shards mixed together: a group's records are read in random
# order, so they should stay in the page cache while it is read.
GROUP_BYTES = 256 * 2**20
# A dataset at a URL: an epoch's first batch waits until its whole group is downloaded,
# so smaller groups start the first epoch sooner (benchmarks/object_storage.py).
REMOTE_GROUP_BYTES = 64 * 2**20


@dataclass(frozen=True)
class EpochOrder:
    """The records of every epoch, in order, from the shards' record counts and a seed."""

    shard_records: tuple[int, ...]
    shuffle: bool
    seed: int
    group_shards: int

    @property
    def size(self) -> int:
        return sum(self.shard_records)

    def records(self, epoch: int) -> np.ndarray:
        """Global record indices (manifest order) of epoch ``epoch``, in reading order."""
        return _epoch_records(self, int(epoch))

    def record_groups(self, epoch: int) -> np.ndarray:
        """The place, in epoch ``epoch``'s reading order, of each record's shard group
        (int32 [records]); all 0 when not shuffled. Sampled epochs (sampling.py) read
        their records group by group in this order."""
        counts = np.asarray(self.shard_records, np.int64)
        if not self.shuffle:
            return np.zeros(int(counts.sum()), np.int32)
        shards = _shard_order(self, int(epoch))
        group_of_shard = np.empty(len(counts), np.int32)
        group_of_shard[shards] = np.arange(len(counts)) // self.group_shards
        return np.repeat(group_of_shard, counts)


@lru_cache(maxsize=4)
def _epoch_records(order: EpochOrder, epoch: int) -> np.ndarray:
    counts = np.asarray(order.shard_records, np.int64)
    if not order.shuffle:
        return np.arange(counts.sum(), dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rng = _generator(order, epoch)
    shards = rng.permutation(len(counts))
    groups = []
    for start in range(0, len(shards), order.group_shards):
        members = shards[start : start + order.group_shards]
        records = np.concatenate([np.arange(first[s], first[s] + counts[s]) for s in members])
        groups.append(records[rng.permutation(len(records))])
    result = np.concatenate(groups).astype(np.int64)
    result.flags.writeable = False
    return result


def _generator(order: EpochOrder, epoch: int) -> np.random.Generator:
    """The epoch's generator: its first draw is the shards' order, then each group's."""
    return np.random.Generator(np.random.PCG64([order.seed, epoch]))


def _shard_order(order: EpochOrder, epoch: int) -> np.ndarray:
    return _generator(order, epoch).permutation(len(order.shard_records))


def group_shards(shard_bytes: list[int], cycle_length: int | None, *, remote: bool = False) -> int:
    """Shards mixed together: ``cycle_length`` when given, else as many as fit GROUP_BYTES
    (REMOTE_GROUP_BYTES for a dataset at a URL)."""
    if cycle_length is not None:
        return max(1, min(cycle_length, len(shard_bytes)))
    mean = max(1, sum(shard_bytes) // max(1, len(shard_bytes)))
    budget = REMOTE_GROUP_BYTES if remote else GROUP_BYTES
    return max(1, min(len(shard_bytes), budget // mean))


@dataclass(frozen=True)
class BatchSchedule:
    """How one input pipeline cuts every epoch's order into batches."""

    records: int
    batch_size: int  # per pipeline
    pipelines: int = 1
    pipeline: int = 0
    drop_remainder: bool = False

    @property
    def round_records(self) -> int:
        """Records read by all pipelines together for one batch each."""
        return self.batch_size * self.pipelines

    @property
    def batches_per_epoch(self) -> int:
        if self.pipelines > 1 or self.drop_remainder:
            return self.records // self.round_records
        return math.ceil(self.records / self.batch_size)

    def batch(self, epoch_records: np.ndarray, batch: int) -> np.ndarray:
        """The record indices of this pipeline's batch ``batch`` of an epoch."""
        start = batch * self.round_records + self.pipeline * self.batch_size
        return epoch_records[start : min(start + self.batch_size, self.records)]

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch) of the ``step``-th batch counted from epoch 0, batch 0."""
        return divmod(int(step), self.batches_per_epoch)
