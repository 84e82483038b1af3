"""Pure planning: split assignment, shuffling and cutting into shards. No I/O here.

- A pair's split comes from a hash of (seed, key) alone, so adding files never
  moves an existing pair to another split.
- Within a split the sorted keys are shuffled with ``random.Random(seed)``
  before being cut, so shards are pre-shuffled and conversion memory grows
  with the number of pairs, never their bytes.
- Shards of a split hold equal record counts, the first ones one more when
  the count does not divide evenly.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tfshards.converters.pairing import Pair
from tfshards.errors import OptionsError
from tfshards.schemas.format import SPLITS, shard_file_name

PARALLEL_SHARDS = 16
RECORDS_PER_PARALLEL_SHARD = 100


def split_of(key: str, seed: int, val_fraction: float, test_fraction: float) -> str:
    """'train', 'val' or 'test', from a uniform hash of (seed, key)."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode("utf-8", "surrogateescape")).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    if position < val_fraction:
        return "val"
    if position < val_fraction + test_fraction:
        return "test"
    return "train"


def shard_bounds(num_records: int, num_shards: int) -> list[tuple[int, int]]:
    """[start, end) of each shard; sizes differ by at most one, none empty."""
    if num_shards < 1 or num_shards > max(num_records, 1):
        raise OptionsError(f"cannot cut {num_records} records into {num_shards} non-empty shards")
    base, extra = divmod(num_records, num_shards)
    bounds, start = [], 0
    for index in range(num_shards):
        end = start + base + (1 if index < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def shard_counts(
    split_sizes: dict[str, int],
    split_bytes: dict[str, int],
    *,
    num_shards: int | None,
    shard_size: int,
) -> dict[str, int]:
    """Shards per split.

    With ``num_shards`` the largest split gets that many and the others a
    proportional count (rounded up). Otherwise each split gets
    ceil(estimated bytes / shard_size), but at least one shard per
    ``RECORDS_PER_PARALLEL_SHARD`` records up to ``PARALLEL_SHARDS``, so small
    datasets still convert and read in parallel. Never more shards than records.
    """
    largest = max(split_sizes.values())
    counts = {}
    for split, size in split_sizes.items():
        if num_shards is not None:
            wanted = math.ceil(num_shards * size / largest)
        else:
            wanted = max(
                math.ceil(split_bytes[split] / shard_size),
                min(PARALLEL_SHARDS, math.ceil(size / RECORDS_PER_PARALLEL_SHARD)),
            )
        counts[split] = max(1, min(wanted, size))
    return counts


@dataclass(frozen=True)
class ShardSpec:
    """One shard to write: its name and the pairs in it, in record order."""

    split: str
    index: int
    count: int
    compression: str
    pairs: tuple[Pair, ...]

    @property
    def file_name(self) -> str:
        return shard_file_name(self.split, self.index, self.count, self.compression)


def plan_shards(
    pairs: Sequence[Pair],
    *,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    compression: str,
    num_shards: int | None,
    shard_size: int,
    pair_bytes: dict[str, int],
) -> list[ShardSpec]:
    """Assign splits, shuffle, and cut into shards; ``pair_bytes`` estimates each pair's size."""
    by_split: dict[str, list[Pair]] = {}
    for pair in sorted(pairs, key=lambda p: p.key):
        by_split.setdefault(split_of(pair.key, seed, val_fraction, test_fraction), []).append(pair)
    for split, members in by_split.items():
        random.Random(f"{seed}:{split}").shuffle(members)
    counts = shard_counts(
        {split: len(members) for split, members in by_split.items()},
        {split: sum(pair_bytes[p.key] for p in members) for split, members in by_split.items()},
        num_shards=num_shards,
        shard_size=shard_size,
    )
    return [
        ShardSpec(
            split,
            index,
            counts[split],
            compression,
            tuple(by_split[split][start:end]),
        )
        for split in SPLITS
        if split in by_split
        for index, (start, end) in enumerate(shard_bounds(len(by_split[split]), counts[split]))
    ]
