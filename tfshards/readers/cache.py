"""The persistent disk cache of decoded, resized uint8 pairs.

Layout::

    <cache root>/<fingerprint>/info.json      what the entry holds (split, size, dataset)
    <cache root>/<fingerprint>/snapshot/...   a tf.data snapshot of (image, mask) uint8

The fingerprint hashes the shard files' sha256s (so changed data gets a new
entry) and every option that changes what is cached (split, input pipeline,
image size, channels, dtype, cache format), so a stale entry is never read.

The entry is written by ``tf.data.Dataset.snapshot`` while the first epoch
streams. A snapshot counts only once its metadata says it was finalized,
which happens when a pass reached the end: a pass stopped early, a crash or
``kill -9`` leave an unfinalized run that the next reader ignores and
rewrites, with no lockfile to trip over. Processes started together may each
write a run; the one finalized last is the one read; neither fails.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from tfshards.errors import TfshardsError
from tfshards.readers.shards import SplitShards

CACHE_FORMAT = 1
CACHE_DIR_NAME = ".tfshards-cache"
SNAPSHOT_DIR = "snapshot"
INFO_FILE = "info.json"
log = logging.getLogger("tfshards")


class CacheSpaceError(TfshardsError):
    """The disk lacks room for the cache that would be built."""


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    state: str  # "ready" or "incomplete"
    bytes: int
    info: dict


def cache_fingerprint(
    shards: SplitShards, shape: tuple[int, int, int], pipeline: tuple[int, int]
) -> str:
    body = {
        "cache_format": CACHE_FORMAT,
        "schema_version": shards.manifest.schema_version,
        "split": shards.split,
        "pipeline": list(pipeline),
        "shape": list(shape),
        "dtype": "uint8",
        "shards": [shard.sha256 for shard in shards.shards],
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]


def default_cache_root(dataset: Path) -> Path:
    """Beside the shards when that folder is writable, else in the user's cache folder."""
    beside = dataset / CACHE_DIR_NAME
    if os.access(dataset, os.W_OK):
        return beside
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tfshards"
    return base / hashlib.sha256(str(dataset.resolve()).encode()).hexdigest()[:16]


def prepare_entry(root: Path, fingerprint: str, info: dict, needed_bytes: int) -> Path:
    """The entry's folder; refuse if building it would not fit on disk."""
    entry = root / fingerprint
    if finalized_snapshot(entry) is not None:
        log.info("reading the disk cache %s (no decoding)", entry)
        return entry
    entry.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(entry).free
    if free < needed_bytes:
        raise CacheSpaceError(
            f"the disk cache for split {info['split']!r} needs about "
            f"{needed_bytes / 2**20:.0f} MiB but {entry} has {free / 2**20:.0f} MiB free; "
            "free space, pass cache='other/folder/', or cache=None to stream"
        )
    (entry / INFO_FILE).write_text(json.dumps(info, indent=2))
    log.info("building the disk cache in %s while the first epoch streams", entry)
    return entry


def finalized_snapshot(entry: Path) -> Path | None:
    """The newest snapshot under the entry whose writer reached the end of a pass.

    tf.data names each snapshot folder by a hash of the writing pipeline's
    graph, which is not stable across processes, so readers look for any
    finalized one instead of recomputing that hash.
    """
    from tensorflow.core.protobuf import snapshot_pb2  # noqa: PLC0415 - TF-internal proto

    newest, newest_time = None, -1
    for metadata in (entry / SNAPSHOT_DIR).glob("*/snapshot.metadata"):
        try:
            record = snapshot_pb2.SnapshotMetadataRecord.FromString(metadata.read_bytes())
        except Exception:  # noqa: BLE001 - a half-written metadata file is not finalized
            continue
        if record.finalized and record.creation_timestamp > newest_time:
            newest, newest_time = metadata.parent, record.creation_timestamp
    return newest


def entry_state(entry: Path) -> str:
    """'ready' when a finalized snapshot exists, else 'incomplete'."""
    return "ready" if finalized_snapshot(entry) is not None else "incomplete"


def list_caches(root: str | os.PathLike) -> list[CacheEntry]:
    """Cache entries under a cache root or a dataset folder (its .tfshards-cache)."""
    root = _cache_root_of(Path(root))
    if not root.is_dir():
        return []
    entries = []
    for entry in sorted(p for p in root.iterdir() if p.is_dir()):
        info_path = entry / INFO_FILE
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        entries.append(CacheEntry(entry, entry_state(entry), size, info))
    return entries


def clear_caches(root: str | os.PathLike) -> int:
    """Remove every cache entry under root; return the bytes freed."""
    freed = 0
    for entry in list_caches(root):
        shutil.rmtree(entry.path, ignore_errors=True)
        freed += entry.bytes
    return freed


def _cache_root_of(path: Path) -> Path:
    return path / CACHE_DIR_NAME if (path / CACHE_DIR_NAME).is_dir() else path


def cached_pairs(
    pairs: tf.data.Dataset,
    cache,
    shards: SplitShards,
    shape: tuple[int, int, int],
    pipeline: tuple[int, int],
) -> tf.data.Dataset:
    """Pairs through the cache asked for: none, memory, or a disk entry (built or read)."""
    if cache in (None, False):
        return pairs
    if cache == "memory":
        return pairs.cache()
    dataset = Path(shards.paths[0]).parent
    root = default_cache_root(dataset) if cache is True else Path(cache)
    fingerprint = cache_fingerprint(shards, shape, pipeline)
    height, width, channels = shape
    info = {
        "dataset": str(dataset),
        "split": shards.split,
        "shape": list(shape),
        "pipeline": list(pipeline),
        "records": shards.records,
    }
    needed = int(shards.records * height * width * (channels + 1) * 1.05) + 2**20
    entry = prepare_entry(root, fingerprint, info, needed)
    ready = finalized_snapshot(entry)
    if ready is not None:
        indexed = tf.data.Dataset.load(
            str(ready),
            element_spec=(tf.TensorSpec([], tf.int64), pairs.element_spec),
            reader_func=_read_in_order,
        )
    else:
        indexed = pairs.enumerate().snapshot(
            str(entry / SNAPSHOT_DIR),
            compression=None,
            shard_func=_cache_file_of,
            reader_func=_read_in_order,
        )
    return indexed.map(_drop_index)


# The cache is written round-robin into CACHE_FILES files and read back round-robin,
# in parallel, which yields the elements in the order they were written.
CACHE_FILES = 4


def _cache_file_of(index: tf.Tensor, pair) -> tf.Tensor:
    return index % CACHE_FILES


def _read_in_order(files: tf.data.Dataset) -> tf.data.Dataset:
    return files.interleave(
        lambda file: file,
        cycle_length=CACHE_FILES,
        block_length=1,
        num_parallel_calls=CACHE_FILES,
        deterministic=True,
    )


def _drop_index(index: tf.Tensor, pair):
    return pair
