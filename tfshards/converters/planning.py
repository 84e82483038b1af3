"""Pure planning: split assignment, shuffling and cutting into shards. No I/O here.

- A pair's split comes from a hash of (seed, key) alone, so adding files never
  moves an existing pair to another split.
- Within a split the sorted keys are shuffled with ``random.Random(seed)``
  before being cut, so shards are pre-shuffled and conversion memory grows
  with the number of pairs, never their bytes. The plan is arrays (split codes,
  one int64 position per pair) over a compact :class:`PairTable`; each shard
  holds a view of its pairs, and a worker receives only those.
- Shards of a split hold equal record counts, the first ones one more when
  the count does not divide evenly.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tfshards.converters.pair_table import Pair, PairTable
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
    pairs: PairTable
    # Tiled conversions: each pair's band of tile rows [first, end) (converters/tiling.py:
    # a large image's tiles spread over several shards); None: every pair whole.
    bands: np.ndarray | None = None

    @property
    def file_name(self) -> str:
        return shard_file_name(self.split, self.index, self.count, self.compression)


def _check_no_split_empty(
    members: dict[str, np.ndarray], total: int, val_fraction: float, test_fraction: float
) -> None:
    """Every split asked for gets pairs: train always, val and test when their fraction is
    above 0. Refused before anything is written: an empty split is a dataset that cannot
    train (no train) or a split that read() and class weights cannot find."""
    fractions = {"train": 1.0, "val": val_fraction, "test": test_fraction}
    empty = [
        split for split, fraction in fractions.items() if fraction > 0 and split not in members
    ]
    if not empty:
        return
    counts = ", ".join(f"{split} {len(members.get(split, ()))}" for split in SPLITS)
    options = {"train": "--val-fraction/--test-fraction", "val": "--val-fraction",
               "test": "--test-fraction"}  # fmt: skip
    advice = " and ".join(f"raise {options[s]}" if s != "train" else "lower " + options[s]
                          for s in empty)  # fmt: skip
    raise OptionsError(
        f"the {' and '.join(empty)} split would be empty: {total} pairs split as {counts} "
        f"(val_fraction {val_fraction}, test_fraction {test_fraction}); {advice}, "
        "or convert more pairs"
    )


def plan_shards(
    pairs: PairTable | Sequence[Pair],
    *,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    compression: str,
    num_shards: int | None,
    shard_size: int,
    pair_bytes: Sequence[int] | np.ndarray,
    bands: np.ndarray | None = None,
) -> list[ShardSpec]:
    """Assign splits, shuffle, and cut into shards.

    ``pair_bytes`` estimates each pair's size, in the order of ``pairs`` (a PairTable is in
    key order; other sequences are sorted by key here, and their sizes with them).
    ``bands``: int64 [pairs, 2], the tile rows of each entry of a PairTable (a pair may
    appear once per band), which its shard writes; the split follows the key alone.
    """
    if not isinstance(pairs, PairTable):
        order = sorted(range(len(pairs)), key=lambda i: pairs[i].key)
        pairs = PairTable.from_pairs([pairs[i] for i in order])
        pair_bytes = np.asarray(pair_bytes, np.int64)[order]
    pair_bytes = np.asarray(pair_bytes, np.int64)
    codes = np.fromiter(
        (
            SPLITS.index(split_of(pairs.key(i), seed, val_fraction, test_fraction))
            for i in range(len(pairs))
        ),
        np.uint8,
        len(pairs),
    )
    members: dict[str, np.ndarray] = {}
    for code, split in enumerate(SPLITS):
        rows = np.flatnonzero(codes == code)
        if len(rows):
            # random.shuffle swaps items in place: on an int64 array it draws the same
            # permutation as it did on the list of Pair objects it used to shuffle.
            random.Random(f"{seed}:{split}").shuffle(rows)
            members[split] = rows
    del codes
    _check_no_split_empty(members, len(pairs), val_fraction, test_fraction)
    counts = shard_counts(
        {split: len(rows) for split, rows in members.items()},
        {split: int(pair_bytes[rows].sum()) for split, rows in members.items()},
        num_shards=num_shards,
        shard_size=shard_size,
    )
    return [
        ShardSpec(
            split,
            index,
            counts[split],
            compression,
            pairs.subset(rows[start:end]),
            None if bands is None else bands[rows[start:end]],
        )  # fmt: skip
        for split, rows in members.items()
        for index, (start, end) in enumerate(shard_bounds(len(rows), counts[split]))
    ]
