"""The knobs of `tfshards.read`, and the decisions made from them once per call.

ReadOptions: rarely changed pipeline knobs. CachePlan: what ``cache=`` asked for.
Ordering: file shuffle, cycle length and determinism, decided in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tfshards.errors import OptionsError
from tfshards.readers.shards import SplitShards

# TFRecordDataset read-ahead per shard: 1 MiB read about 10% faster than TF's 256 KiB here.
DEFAULT_READ_BUFFER = 2**20
# Shuffle buffer budget. Measured at 256x256: 256 MiB of pairs cost 0.1 ms of CPU per pair
# more than 64 MiB (copies out of a buffer far larger than the CPU caches); the file order
# and, for the cache, the random rotation of its parts mix records beyond the buffer.
SHUFFLE_BUFFER_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ReadOptions:
    """Pipeline knobs; the defaults follow from the shard count and record size.

    cycle_length: shards read at once (default: min(shards, 8); 1 when not shuffling
        or when building a cache, so records come in the manifest's order).
    block_length: consecutive records taken from one shard before moving on.
    parse_batch_size: records parsed per vectorized ``parse_example`` call.
    shuffle_buffer: records mixed by the shuffle buffer (default: as many as fit in
        about 64 MiB, at most 10,000).
    read_buffer_bytes: TFRecordDataset read-ahead buffer per shard (default 1 MiB).
    deterministic: element order independent of thread timing (default: True when
        not shuffling or when a seed is given).
    crop_scale: with ``read(crop_size=...)``, scale each pair by a random factor in
        (low, high) before cropping (default: no scaling).
    """

    cycle_length: int | None = None
    block_length: int = 1
    parse_batch_size: int = 64
    shuffle_buffer: int | None = None
    read_buffer_bytes: int | None = None
    deterministic: bool | None = None
    crop_scale: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for name in ("cycle_length", "shuffle_buffer", "read_buffer_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionsError(f"{name} must be at least 1, got {value}")
        if self.block_length < 1 or self.parse_batch_size < 1:
            raise OptionsError("block_length and parse_batch_size must be at least 1")


@dataclass(frozen=True)
class CachePlan:
    """What ``cache=`` asked for: kind "none", "memory" or "disk" (root None: the default)."""

    kind: str
    root: Path | None = None

    @classmethod
    def of(cls, cache: bool | str | os.PathLike | None) -> CachePlan:
        if cache is None or cache is False:
            return cls("none")
        if cache is True:
            return cls("disk")
        if cache == "memory":
            return cls("memory")
        if isinstance(cache, str | os.PathLike):
            return cls("disk", Path(cache))
        raise OptionsError(f"cache must be None, True, 'memory' or a folder path; got {cache!r}")


@dataclass(frozen=True)
class Ordering:
    """How records are ordered: decided once per read() call."""

    shuffle: bool  # records mixed every epoch
    shuffle_files: bool  # shard order reshuffled every epoch
    cycle_length: int  # shards read at once
    deterministic: bool  # element order independent of thread timing


def ordering(
    shards: SplitShards, options: ReadOptions, *, shuffle: bool, seed: int | None, cached: bool
) -> Ordering:
    """A cache is built from records in the manifest's order, whoever builds it, so it
    reads one shard at a time, in order; the shuffle comes after the cache."""
    in_order = cached or not shuffle
    deterministic = options.deterministic
    if deterministic is None:
        deterministic = not shuffle or seed is not None
    cycle = options.cycle_length or (1 if in_order else min(len(shards.paths), 8))
    return Ordering(
        shuffle=shuffle,
        shuffle_files=not in_order,
        cycle_length=cycle,
        deterministic=deterministic or cached,
    )
