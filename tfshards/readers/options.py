"""The knobs of `tfshards.read`, and the decisions made from them once per call.

ReadOptions: rarely changed pipeline knobs. CachePlan: what ``cache=`` asked for.
Ordering: file shuffle, cycle length and determinism, decided in one place.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfshards.arguments import checked_bool, checked_int, checked_path
from tfshards.converters.options import parse_size
from tfshards.errors import OptionsError
from tfshards.readers.shards import SplitShards

# Shuffle buffer budget. Measured at 256x256: 256 MiB of pairs cost 0.1 ms of CPU per pair
# more than 64 MiB (copies out of a buffer far larger than the CPU caches); the file order
# and, for the cache, the random rotation of its parts mix records beyond the buffer.
SHUFFLE_BUFFER_BYTES = 64 * 2**20
# cache= words that are not folders (a near miss such as "Memory" or "disk" would otherwise
# quietly become a cache folder of that name in the current directory), each with what it
# most likely meant.
_CACHE_WORDS = {
    **dict.fromkeys(("memory", "ram", "mem"), "'memory'"),
    **dict.fromkeys(("disk", "true", "yes", "on"), "True"),
    **dict.fromkeys(("false", "none", "no", "off", ""), "None"),
}


@dataclass(frozen=True)
class ReadOptions:
    """Pipeline knobs; the defaults follow from the shard count and record size.

    cycle_length: shards whose records are mixed together. Reads by index (every read
        but the tf.data service's): an epoch takes the shards in groups of this many
        (default: as many as fit in 256 MiB, 64 MiB for a dataset at a URL, whose first
        batch waits for its group to download). The tf.data service: shards interleaved
        at once (default: min(shards, 8); 1 when not shuffling).
    The next five apply to the tf.data service's per-pair pipeline only.
    block_length: consecutive records taken from one shard before moving on.
    parse_batch_size: records parsed per vectorized ``parse_example`` call.
    shuffle_buffer: records mixed by the shuffle buffer (default: as many as fit in
        about 64 MiB, at most 10,000).
    read_buffer_bytes: TFRecordDataset read-ahead buffer per shard (default: TensorFlow's,
        256 KiB on local disks; any value set here makes TensorFlow log one INFO line).
    deterministic: element order independent of thread timing (default: True when
        not shuffling or when a seed is given).
    crop_scale: with ``read(crop_size=...)``, scale each pair by a random factor in
        (low, high) before cropping (default: no scaling); the factor, as the crop's
        place, is drawn by (seed, epoch, batch, position in the batch).
    direct_reads: read shards and a ready disk cache past the page cache (``O_DIRECT``).
        None (default): when they are larger than half the memory the process may use
        and their records average 256 KiB or more; False: never (a file system where
        direct reads are slow, such as some network mounts); True: whenever the file
        system allows, whatever their size. The epoch that builds a disk cache reads its
        shards through the page cache in every case.

    A dataset at a URL (``s3://``, ``gs://``, any fsspec protocol) is read through a local
    shard cache:
    storage_options: passed to fsspec (credentials, endpoint, ...); never logged.
    shard_cache: the folder of downloaded shards (default: ``shards/`` under the user
        cache folder, ``$XDG_CACHE_HOME/tfshards`` or ``~/.cache/tfshards``).
    shard_cache_limit: most bytes of shards kept there, e.g. ``"50GiB"`` (default: no
        limit); least recently used shards are evicted first.
    download_ahead: shards downloaded at once, ahead of the reader (default 4).
    """

    cycle_length: int | None = None
    block_length: int = 1
    parse_batch_size: int = 64
    shuffle_buffer: int | None = None
    read_buffer_bytes: int | None = None
    deterministic: bool | None = None
    crop_scale: tuple[float, float] | None = None
    storage_options: Mapping[str, Any] | None = None
    shard_cache: str | os.PathLike | None = None
    shard_cache_limit: int | str | None = None
    download_ahead: int = 4
    direct_reads: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.shard_cache_limit, str):
            object.__setattr__(self, "shard_cache_limit", parse_size(self.shard_cache_limit))
        for name in _OPTIONAL_COUNTS:
            checked_int(name, getattr(self, name), low=1, none=True)
        for name in ("block_length", "parse_batch_size", "download_ahead"):
            checked_int(name, getattr(self, name), low=1)
        checked_bool("deterministic", self.deterministic, none=True)
        checked_bool("direct_reads", self.direct_reads, none=True)
        if self.crop_scale is not None:
            _check_crop_scale(self.crop_scale)
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            kind = type(self.storage_options).__name__  # the value may hold credentials
            raise OptionsError(f"storage_options must be a dict or None, got a {kind}")
        if self.shard_cache is not None:
            checked_path("shard_cache", self.shard_cache)


def read_options(options: ReadOptions | None) -> ReadOptions:
    """read()'s and Pairs' ``options=``: a ReadOptions, or None for the defaults."""
    if options is None:
        return ReadOptions()
    if not isinstance(options, ReadOptions):
        raise OptionsError(f"options must be a tfshards.ReadOptions or None; got {options!r}")
    return options


# ReadOptions fields that are a positive integer, or None for the default.
_OPTIONAL_COUNTS = ("cycle_length", "shuffle_buffer", "read_buffer_bytes", "shard_cache_limit")


def _check_crop_scale(value: object) -> None:
    """Two finite positive numbers; their order is checked with crop_size (sizing.py)."""
    try:
        low, high = value  # type: ignore[misc]
        numbers_ok = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
    except (TypeError, ValueError):
        numbers_ok = False
    if not numbers_ok or not all(math.isfinite(v) and v > 0 for v in (low, high)):
        raise OptionsError(f"crop_scale must be (low, high), two positive numbers; got {value!r}")


@dataclass(frozen=True)
class CachePlan:
    """What ``cache=`` asked for: kind "none", "memory" or "disk" (root None: the default)."""

    kind: str
    root: Path | None = None

    @classmethod
    def of(cls, cache: bool | str | os.PathLike | None) -> CachePlan:
        """None/False: stream; True: a disk cache in the default place; "memory"; any other
        string or path is the disk cache's folder, except near misses of the keywords
        ("Memory", "ram", "disk", "none"...) and strings with spaces around them."""
        if isinstance(cache, np.bool_):
            cache = bool(cache)
        if cache is None or cache is False:
            return cls("none")
        if cache is True:
            return cls("disk")
        if cache == "memory":
            return cls("memory")
        if isinstance(cache, str):
            _check_cache_folder(cache)
        if isinstance(cache, str | os.PathLike):
            return cls("disk", Path(cache))
        raise OptionsError(f"cache must be None, True, 'memory' or a folder path; got {cache!r}")


def _check_cache_folder(cache: str) -> None:
    """A string meant as a folder: refused when it looks like a mistyped keyword, which
    would otherwise quietly become a cache folder of that name in the current directory."""
    word = cache.strip().lower()
    if word in _CACHE_WORDS or cache != cache.strip():
        meant = _CACHE_WORDS.get(word, "a folder path without spaces around it")
        raise OptionsError(
            f"cache={cache!r} is neither 'memory' nor a folder: did you mean cache={meant}? "
            "Pass None (stream), 'memory', True (a disk cache beside the shards) or a "
            "folder path (Path('name') for a folder named like a keyword)"
        )


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
