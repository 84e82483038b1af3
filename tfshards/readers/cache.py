"""The persistent disk cache of decoded, resized uint8 pairs.

Layout::

    <cache root>/<fingerprint>/info.json             what the entry holds (split, shape, ...)
    <cache root>/<fingerprint>/ready/part-K.image    images of records K, K+P, K+2P, ...
    <cache root>/<fingerprint>/ready/part-K.mask     their masks, in the same order
    <cache root>/<fingerprint>/.building-<host>-<pid>-<token>/   a build in progress

Each part file is a plain array of fixed-size uint8 records (height x width x
channels, row-major; masks with one channel), read back with
``tf.data.FixedLengthRecordDataset``: no framing, no parsing, no decoding, so
a cached epoch reads at the speed of the disk or page cache.

The fingerprint hashes the shard files' sha256s (so changed data gets a new
entry) and every option that changes what is cached (split, input pipeline,
image size, channels, cache format), so a stale entry is never read.

The entry is built while the first epoch streams: each decoded pair is
appended to a part file of a private ``.building-*`` folder, which is
fsynced and renamed to ``ready`` when the pass has written every record. A
pass stopped early, a crash or ``kill -9`` leave a building folder that
nobody reads (removed when its process is gone), with no lockfile to trip
over. Processes started together may each build one; the first rename wins
and the others discard theirs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from tfshards.errors import TfshardsError
from tfshards.readers.shards import SplitShards
from tfshards.schemas.format import CACHE_DIR_NAME

CACHE_FORMAT = 2
INFO_FILE = "info.json"
READY_DIR = "ready"
BUILDING_PREFIX = ".building-"
SHAPE_BYTES = 8  # (height, width) as little-endian int32, per record of a variable-size cache
# Part files, read at once in a new order each epoch: with the shuffle buffer they mix
# the records of a cached epoch.
CACHE_PARTS = 16
# Read-ahead per part file: 1 MiB read 1.5x faster than TF's 256 KiB default here.
READ_BUFFER_BYTES = 2**20
log = logging.getLogger("tfshards")


class CacheSpaceError(TfshardsError):
    """The disk lacks room for the cache that would be built."""


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    state: str  # "ready" or "incomplete"
    bytes: int
    info: dict


@dataclass(frozen=True)
class CacheLayout:
    """Where one entry's files are, and the byte size of its records."""

    entry: Path
    shape: tuple[int | None, int | None, int]  # (None, None, C): records of many sizes
    records: int

    @property
    def ready(self) -> Path:
        return self.entry / READY_DIR

    @property
    def variable(self) -> bool:
        """Records of many sizes: parts hold TFRecord-framed pixels and a .shape file of
        (height, width) int32 pairs, instead of fixed-size records."""
        return self.shape[0] is None

    def kinds(self) -> tuple[str, ...]:
        return ("image", "mask", "shape") if self.variable else ("image", "mask")

    @property
    def image_bytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2]

    @property
    def mask_bytes(self) -> int:
        return self.shape[0] * self.shape[1]

    def part(self, folder: Path, index: int, what: str) -> Path:
        return folder / f"part-{index:05d}.{what}"

    def count(self, index: int) -> int:
        return len(range(index, self.records, CACHE_PARTS))

    def expected_size(self, index: int, what: str) -> int | None:
        """Bytes of one part file; None where sizes vary (checked through the .shape file)."""
        if what == "shape":
            return self.count(index) * SHAPE_BYTES
        if self.variable:
            return None
        per_record = self.image_bytes if what == "image" else self.mask_bytes
        return self.count(index) * per_record

    def is_ready(self) -> bool:
        """True when the ready folder holds every part at its full size."""
        for index in range(CACHE_PARTS):
            for what in self.kinds():
                path = self.part(self.ready, index, what)
                size = self.expected_size(index, what)
                if not path.is_file() or (size is not None and path.stat().st_size != size):
                    return False
        return True


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


def prepare_entry(layout: CacheLayout, info: dict, needed_bytes: int) -> None:
    """Make the entry's folder; refuse if building it would not fit on disk."""
    entry = layout.entry
    if layout.is_ready():
        log.info("reading the disk cache %s (no decoding)", entry)
        return
    if layout.ready.exists():
        log.warning("%s: incomplete or damaged cache files; rebuilding them", layout.ready)
        shutil.rmtree(layout.ready, ignore_errors=True)
    entry.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(entry)
    free = shutil.disk_usage(entry).free
    if free < needed_bytes:
        raise CacheSpaceError(
            f"the disk cache for split {info['split']!r} needs about "
            f"{needed_bytes / 2**20:.0f} MiB but {entry} has {free / 2**20:.0f} MiB free; "
            "free space, pass cache='other/folder/', or cache=None to stream"
        )
    (entry / INFO_FILE).write_text(json.dumps(info, indent=2))
    log.info("building the disk cache in %s while the first epoch streams", entry)


def _remove_abandoned_builds(entry: Path) -> None:
    """Building folders of processes on this host that no longer run."""
    host = socket.gethostname()
    for folder in entry.glob(f"{BUILDING_PREFIX}*"):
        parts = folder.name[len(BUILDING_PREFIX) :].rsplit("-", 2)
        if len(parts) == 3 and parts[0] == host and not _process_alive(int(parts[1])):
            shutil.rmtree(folder, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def entry_state(entry: Path) -> str:
    """'ready' when a published ready folder exists, else 'incomplete'."""
    return "ready" if (entry / READY_DIR).is_dir() else "incomplete"


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
