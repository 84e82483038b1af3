"""A disk cache entry: its folder layout, names, ``info.json``, size check and locking.

Layout::

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

import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import tensorflow as tf

from tfshards import storage
from tfshards.errors import TfshardsError
from tfshards.readers.cache.layouts import CACHE_PARTS, PartLayout, Shape, layout_for, part_count
from tfshards.readers.shards import SplitShards
from tfshards.schemas.format import CACHE_DIR_NAME, MANIFEST_NAME
from tfshards.sources.folders import process_alive, user_cache_dir

# 3: fixed-size entries are two flat files read by index (store.py); entries of older
# formats, including any built by a pass that overlapped `convert --overwrite`, are not read.
# 4: and a checksum per pair (store.py), so entries built without one are built again.
CACHE_FORMAT = 4
INFO_FILE = "info.json"
READY_DIR = "ready"
BUILDING_PREFIX = ".building-"
log = logging.getLogger("tfshards")
# Entries whose finished build this process is putting on disk: entry folder -> thread.
_publishing: dict[Path, threading.Thread] = {}
_publishing_lock = threading.Lock()


class CacheSpaceError(TfshardsError):
    """The disk lacks room for the cache that would be built."""


class CacheFolderError(TfshardsError):
    """A cache folder cannot be created, written or removed (names it and the cause)."""


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
class CacheInfo:
    """What an entry holds, as written to its ``info.json``."""

    dataset: str
    split: str
    shape: Shape
    pipeline: tuple[int, int]
    records: int
    cache_format: int = CACHE_FORMAT
    files: str = "parts"  # "flat": two flat files read by index (store.py); "parts": layouts.py

    @classmethod
    def load(cls, entry: Path) -> CacheInfo | None:
        """The entry's info; None when it has none yet or it is unreadable."""
        try:
            body = json.loads((entry / INFO_FILE).read_text())
            return cls(
                dataset=body["dataset"],
                split=body["split"],
                shape=tuple(body["shape"]),
                pipeline=tuple(body["pipeline"]),
                records=int(body["records"]),
                cache_format=int(body.get("cache_format", CACHE_FORMAT)),
                files=str(body.get("files", "parts")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, entry: Path) -> None:
        (entry / INFO_FILE).write_text(json.dumps(asdict(self), indent=2))


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
    ) -> DiskCache:
        """The entry of a split; ``files`` is "flat" for the ordered reader's store, else
        "parts" (the per-pair pipeline's layouts); the two never share an entry."""
        info = CacheInfo(
            str(shards.root),
            shards.split,
            tuple(shape),
            tuple(pipeline),
            shards.records,
            files=files,
        )
        return cls(root / _fingerprint(shards, shape, pipeline, files), info)

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
        part more on average (see layouts._rotated; ``memory.parts_at_once`` decides).
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


def publishing(entry: Path, thread: threading.Thread) -> None:
    """Note that ``thread`` (started) is publishing ``entry``'s finished build."""
    with _publishing_lock:
        _publishing[entry] = thread


def wait_for_publishing(entry: Path | None = None) -> None:
    """Return once this process has published (or given up on) the finished build of
    ``entry``, or of every entry when None: bounded by the disk writing what is left."""
    with _publishing_lock:
        threads = [t for folder, t in _publishing.items() if entry in (None, folder)]
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join()
    with _publishing_lock:
        for folder, thread in list(_publishing.items()):
            if not thread.is_alive():
                del _publishing[folder]


def _fingerprint(shards: SplitShards, shape: Shape, pipeline: tuple[int, int], files: str) -> str:
    body = {
        "cache_format": CACHE_FORMAT,
        "files": files,
        "schema_version": shards.manifest.schema_version,
        "split": shards.split,
        "pipeline": list(pipeline),
        "shape": list(shape),
        "dtype": "uint8",
        "shards": [shard.sha256 for shard in shards.shards],
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]


def default_cache_root(dataset: Path | str) -> Path:
    """Beside the shards when that folder is writable, else in the user's cache folder
    (always there for a dataset at a URL)."""
    if isinstance(dataset, str):
        return user_cache_dir() / "decoded" / hashlib.sha256(dataset.encode()).hexdigest()[:16]
    beside = dataset / CACHE_DIR_NAME
    if os.access(dataset, os.W_OK):
        return beside
    return _fallback_root(dataset)


def _fallback_root(dataset: Path) -> Path:
    """Where the caches of a dataset in a read-only folder live."""
    return user_cache_dir() / hashlib.sha256(str(dataset.resolve()).encode()).hexdigest()[:16]


def _remove_abandoned_builds(entry: Path) -> None:
    """Building folders of processes on this host that no longer run."""
    host = socket.gethostname()
    for folder in entry.glob(f"{BUILDING_PREFIX}*"):
        parts = folder.name[len(BUILDING_PREFIX) :].rsplit("-", 2)
        if len(parts) == 3 and parts[0] == host and not process_alive(int(parts[1])):
            shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class CacheEntry:
    """An entry as listed by ``tfshards cache``: its state and size on disk."""

    path: Path
    state: str  # "ready" or "incomplete"
    bytes: int
    info: CacheInfo | None

    def describe(self) -> str:
        """One line: path, state, size, split and shape."""
        split = self.info.split if self.info else "?"
        shape = "x".join(str(n) for n in self.info.shape) if self.info else "?"
        return (
            f"{self.path}  {self.state:10s} {self.bytes / 2**20:9.1f} MiB  "
            f"split={split} shape={shape}"
        )


def list_caches(root: str | os.PathLike) -> list[CacheEntry]:
    """Cache entries under a cache root, a dataset folder (its cache folder beside the
    shards and, for a read-only folder, the one under the user cache folder), or a
    dataset's URL (its decoded cache under the user cache folder); builds this process
    finished are listed once published."""
    wait_for_publishing()
    entries = []
    for folder in _cache_roots_of(root):
        if not folder.is_dir():
            continue
        for entry in sorted(p for p in folder.iterdir() if p.is_dir()):
            state = "ready" if (entry / READY_DIR).is_dir() else "incomplete"
            size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
            entries.append(CacheEntry(entry, state, size, CacheInfo.load(entry)))
    return entries


def clear_caches(root: str | os.PathLike) -> int:
    """Remove every cache entry under root (as :func:`list_caches` finds them); return the
    bytes freed. Raises CacheFolderError naming an entry that cannot be removed."""
    freed = 0
    for entry in list_caches(root):
        try:
            shutil.rmtree(entry.path)
        except OSError as exc:
            cause = exc.strerror or str(exc)
            raise CacheFolderError(
                f"cannot remove the cache entry {entry.path}: {cause} ({exc.filename}); "
                f"{freed / 2**20:.1f} MiB freed before it"
            ) from exc
        freed += entry.bytes
    return freed


def _cache_roots_of(location: str | os.PathLike) -> list[Path]:
    if storage.is_url(location):
        return [default_cache_root(str(location).rstrip("/"))]
    path = Path(location)
    if (path / MANIFEST_NAME).is_file() or (path / CACHE_DIR_NAME).is_dir():
        # Beside the shards while the folder was writable; else under the user cache.
        return [path / CACHE_DIR_NAME, _fallback_root(path)]
    return [path]
