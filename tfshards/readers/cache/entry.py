"""A disk cache entry being built or read: its part files, size check and locking.

Layout (the names, ``info.json``, listing and clearing: entries.py, without TensorFlow)::

    <cache root>/<fingerprint>/info.json        what the entry holds (CacheInfo)
    <cache root>/<fingerprint>/ready/part-K.*   the published part files (layouts.py)
    <cache root>/<fingerprint>/.building-<host>-<pid>-<token>/   a build in progress

The cache root is ``.tfshards-cache`` beside the shards when that folder is
writable, else a folder under the user's cache directory, or what ``cache=``
names. The fingerprint hashes the shard files' sha256s (so changed data gets a
new entry) and every option that changes what is cached (split, input
pipeline, image size, channels, cache format), so a stale entry is never read.

Locking without lockfiles: a build writes into its own ``.building-*`` folder,
fsyncs it and renames it to ``ready``; the first rename wins and the others
discard theirs. A crash or ``kill -9`` leaves a building folder that nobody
reads, removed by the next process on the host once its owner is gone. The fsync and
rename of a finished build may run in the background (store.py's ``Publisher``): this
process's own listings and reads wait for them (``wait_for_publishing``), so it never
sees a build it finished as missing.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from tfshards.errors import TfshardsError
from tfshards.readers.cache.entries import (
    BUILDING_PREFIX,
    INFO_FILE,
    READY_DIR,
    CacheFolderError,
    CacheInfo,
    fingerprint,
    publishing,
    wait_for_publishing,
)
from tfshards.readers.cache.layouts import CACHE_PARTS, PartLayout, Shape, layout_for, part_count
from tfshards.readers.shards import SplitShards
from tfshards.sources.folders import process_alive, user_cache_dir

# Also imported from here (store.py): the names live in entries.py, one place.
__all__ = ["CacheSpaceError", "DiskCache", "publishing", "wait_for_publishing"]

log = logging.getLogger(__name__)  # under "tfshards"; `bench` quiets its INFO lines


class CacheSpaceError(TfshardsError):
    """The disk lacks room for the cache that would be built."""


def _unwritable(folder: Path, exc: OSError) -> str:
    cause = exc.strerror or str(exc)
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(folder) else ""
    return (
        f"cannot write the disk cache in {folder}: {cause}{where}; a read-only dataset "
        f"caches under the user cache folder ({user_cache_dir()}, from $XDG_CACHE_HOME): "
        "make that writable, set XDG_CACHE_HOME, pass cache='a/writable/folder', or "
        "cache=None to stream"
    )


@dataclass(frozen=True)
class DiskCache:
    """One cache entry: a folder, what it holds, and the layout of its part files."""

    folder: Path
    info: CacheInfo

    @classmethod
    def for_split(
        cls,
        root: Path,
        shards: SplitShards,
        shape: Shape,
        pipeline: tuple[int, int],
        files: str = "parts",
        subset: str = "",
        records: int | None = None,
    ) -> DiskCache:
        """The entry of a split; ``files`` is "flat" for the ordered reader's store, else
        "parts" (the per-pair pipeline's layouts); the two never share an entry. ``subset``:
        the digest of a sampled read's records (sampling.py), of which its entry holds
        ``records``."""
        info = CacheInfo(
            str(shards.root),
            shards.split,
            tuple(shape),
            tuple(pipeline),
            shards.records if records is None else records,
            files=files,
            subset=subset,
        )
        name = fingerprint(
            shards.manifest.schema_version,
            shards.split,
            tuple(shape),
            tuple(pipeline),
            files,
            [shard.sha256 for shard in shards.shards],
            subset,
        )
        return cls(root / name, info)

    @classmethod
    def at(cls, folder: Path) -> DiskCache:
        """An existing entry, from its info.json."""
        info = CacheInfo.load(folder)
        if info is None:
            raise TfshardsError(f"{folder}: not a tfshards disk cache entry (no {INFO_FILE})")
        return cls(folder, info)

    @property
    def layout(self) -> PartLayout:
        return layout_for(self.info.shape)

    @property
    def ready(self) -> Path:
        return self.folder / READY_DIR

    def part(self, folder: Path, index: int, kind: str) -> Path:
        return folder / f"part-{index:05d}.{kind}"

    def new_building_folder(self) -> Path:
        name = f"{BUILDING_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        return self.folder / name

    def is_ready(self) -> bool:
        """True when the ready folder holds every file at its full size."""
        layout = self.layout
        if self.info.files == "flat" and self.info.shape[0] is None:
            from tfshards.readers.cache.native import native_ready

            return native_ready(self.ready, self.info.records, self.info.shape[2])
        if self.info.files == "flat":
            from tfshards.readers.cache.store import flat_ready

            return flat_ready(self.ready, self.info.records, self.info.shape)
        for index in range(CACHE_PARTS):
            count = part_count(self.info.records, index)
            for kind in layout.kinds:
                path = self.part(self.ready, index, kind)
                size = layout.expected_size(count, kind)
                if not path.is_file() or (size is not None and path.stat().st_size != size):
                    return False
        return True

    def parts(
        self, *, shuffle: bool, epoch_key: tf.Tensor | int = 0, rotate: bool = True
    ) -> tf.data.Dataset:
        """The published parts as (one path per kind..., record count, first record).

        Shuffled, they come in an order drawn from ``epoch_key`` (a new key each epoch),
        and with ``rotate`` each starts at a random record, which costs reading half a
        part more on average (see layouts._rotated).
        """
        columns = [
            tf.constant([str(self.part(self.ready, k, kind)) for k in range(CACHE_PARTS)])
            for kind in self.layout.kinds
        ]
        counts = [part_count(self.info.records, k) for k in range(CACHE_PARTS)]
        columns.append(tf.constant(counts, tf.int64))
        starts = tf.zeros([CACHE_PARTS], tf.int64)
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(
                tf.range(CACHE_PARTS), seed=tf.stack([epoch_key, 0])
            )
            columns = [tf.gather(column, order) for column in columns]
            if rotate:
                starts = tf.random.stateless_uniform(
                    [CACHE_PARTS], tf.stack([epoch_key, 1]), maxval=2**31, dtype=tf.int64
                )
        return tf.data.Dataset.from_tensor_slices((*columns, starts))

    def entry_bytes(self) -> int | None:
        """The published entry's size; None where record sizes vary."""
        sizes = [self.layout.expected_size(self.info.records, kind) for kind in self.layout.kinds]
        return None if None in sizes else sum(sizes)

    def prepare(self, stored_bytes: int) -> None:
        """Make the entry's folder; refuse if building it would not fit on disk."""
        wait_for_publishing(self.folder)  # a build this process finished is read, not redone
        if self.is_ready():
            log.info("reading the disk cache %s (no decoding)", self.folder)
            return
        if self.ready.exists():
            log.warning("%s: incomplete or damaged cache files; rebuilding them", self.ready)
            shutil.rmtree(self.ready, ignore_errors=True)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.info.save(self.folder)  # also proves the folder writable before a pass
        except OSError as exc:
            raise CacheFolderError(_unwritable(self.folder, exc)) from exc
        _remove_abandoned_builds(self.folder)
        needed = self.layout.bytes_needed(self.info.records, stored_bytes)
        free = shutil.disk_usage(self.folder).free
        if free < needed:
            raise CacheSpaceError(
                f"the disk cache for split {self.info.split!r} needs about "
                f"{needed / 2**20:.0f} MiB but {self.folder} has {free / 2**20:.0f} MiB free; "
                "free space, pass cache='other/folder/', or cache=None to stream"
            )
        log.info("building the disk cache in %s while the first epoch streams", self.folder)


def _remove_abandoned_builds(entry: Path) -> None:
    """Building folders of processes on this host that no longer run."""
    host = socket.gethostname()
    for folder in entry.glob(f"{BUILDING_PREFIX}*"):
        parts = folder.name[len(BUILDING_PREFIX) :].rsplit("-", 2)
        if len(parts) == 3 and parts[0] == host and not process_alive(int(parts[1])):
            shutil.rmtree(folder, ignore_errors=True)
