"""The disk cache's entries as files, without TensorFlow: names, ``info.json``, where the
cache folders are, and listing and clearing entries (``tfshards cache list|clear``).

An entry is ``<cache folder>/<fingerprint>/`` (entry.py builds and reads it)::

    info.json                         what it holds (CacheInfo), written before anything else
    ready/                            the published files
    .building-<host>-<pid>-<token>/   a build in progress, or left by a crash

Only proven entries are listed or removed, never what happens to lie in the folder
given: a folder named by a fingerprint (24 hex digits) whose ``info.json`` has
CacheInfo's schema and which holds nothing but ``info.json``, ``ready/`` and building
folders, those holding plain files only. ``info.json`` is the marker: every tfshards
version has written it, with this schema, when it made the entry's folder, so entries
of earlier versions are proven the same way (and listed as stale: their format is
never read).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from tfshards import storage
from tfshards.errors import OptionsError, TfshardsError
from tfshards.schemas.format import CACHE_DIR_NAME, MANIFEST_NAME
from tfshards.schemas.manifest import Manifest
from tfshards.sources.folders import user_cache_dir

# 3: fixed-size entries are two flat files read by index (store.py); entries of older
# formats, including any built by a pass that overlapped `convert --overwrite`, are not read.
# 4: and a checksum per pair (store.py), so entries built without one are built again.
CACHE_FORMAT = 4
INFO_FILE = "info.json"
READY_DIR = "ready"
BUILDING_PREFIX = ".building-"
FINGERPRINT = re.compile(r"[0-9a-f]{24}")  # an entry folder's name
Shape = tuple[int | None, int | None, int]
log = logging.getLogger(__name__)  # under "tfshards"; `bench` quiets its INFO lines
# Entries whose finished build this process is putting on disk: entry folder -> thread.
_publishing: dict[Path, threading.Thread] = {}
_publishing_lock = threading.Lock()


class CacheFolderError(TfshardsError):
    """A cache folder cannot be created, written, listed or removed (names it and the cause)."""


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
    subset: str = ""  # a sampled read's selection digest: its records alone (sampling.py)

    @classmethod
    def load(cls, entry: Path) -> CacheInfo | None:
        """The entry's info; None when it has none yet or it is unreadable."""
        try:
            body = json.loads((entry / INFO_FILE).read_text())
            info = cls(
                dataset=str(body["dataset"]),
                split=str(body["split"]),
                shape=tuple(None if n is None else int(n) for n in body["shape"]),
                pipeline=tuple(int(n) for n in body["pipeline"]),
                records=int(body["records"]),
                cache_format=int(body.get("cache_format", CACHE_FORMAT)),
                files=str(body.get("files", "parts")),
                subset=str(body.get("subset", "")),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        index, count = info.pipeline if len(info.pipeline) == 2 else (0, 0)
        return info if len(info.shape) == 3 and 0 <= index < count else None

    def save(self, entry: Path) -> None:
        (entry / INFO_FILE).write_text(json.dumps(asdict(self), indent=2))


def fingerprint(
    schema_version: int,
    split: str,
    shape: Shape,
    pipeline: tuple[int, int],
    files: str,
    shard_sha256s: list[str],
    subset: str = "",
) -> str:
    """An entry's folder name: every fact that changes what it holds, so a stale entry is
    never read (changed shards, options or cache format make another name)."""
    body = {
        "cache_format": CACHE_FORMAT,
        "files": files,
        "schema_version": schema_version,
        "split": split,
        "pipeline": list(pipeline),
        "shape": list(shape),
        "dtype": "uint8",
        "shards": list(shard_sha256s),
    }
    if subset:  # a sampled read's records only (readers/sampling.py)
        body["subset"] = subset
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]


def default_cache_root(dataset: Path | str) -> Path:
    """Beside the shards when that folder is writable, else in the user's cache folder
    (always there for a dataset at a URL)."""
    if isinstance(dataset, str):
        return user_cache_dir() / "decoded" / hashlib.sha256(dataset.encode()).hexdigest()[:16]
    beside = dataset / CACHE_DIR_NAME
    if os.access(dataset, os.W_OK):
        return beside
    return fallback_root(dataset)


def fallback_root(dataset: Path) -> Path:
    """Where the caches of a dataset in a read-only folder live."""
    return user_cache_dir() / hashlib.sha256(str(dataset.resolve()).encode()).hexdigest()[:16]


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


@dataclass(frozen=True)
class CacheEntry:
    """An entry as listed by ``tfshards cache``: its state and size on disk.

    ``state``: "ready"; "incomplete" (being built, or a build left by a crash); or
    "stale": not the entry a read of its dataset would use now (the shards were
    replaced, by ``convert --overwrite`` for one, the dataset is gone, or the entry is of
    an older cache format), so it is never read again.
    """

    path: Path
    state: str
    bytes: int
    info: CacheInfo

    def describe(self) -> str:
        """One line: path, state, size, split and shape."""
        shape = "x".join(str(n) for n in self.info.shape)
        return (
            f"{self.path}  {self.state:10s} {self.bytes / 2**20:9.1f} MiB  "
            f"split={self.info.split} shape={shape}"
        )


def list_caches(location: str | os.PathLike) -> list[CacheEntry]:
    """The cache entries of a dataset folder (its cache folder beside the shards and, for
    a read-only folder, the one under the user cache folder), a dataset's URL (its
    decoded cache under the user cache folder), or a cache folder given to
    ``read(cache=...)``. Only folders proven to be entries are listed: named by a
    fingerprint, holding an ``info.json`` of the entry schema and nothing but it, ``ready/``
    and building folders of plain files. Builds this process finished are listed once
    published. Raises OptionsError for an empty location, CacheFolderError for a path
    that is not a folder."""
    wait_for_publishing()
    folders, _ = _cache_folders(location)
    manifests: dict[str, Manifest | None] = {}
    entries = []
    for folder in folders:
        for path, info in _proven_entries(folder):
            entries.append(CacheEntry(path, _state(path, info, manifests), _bytes_in(path), info))
    return entries


def clear_caches(location: str | os.PathLike, *, stale: bool = False) -> int:
    """Remove the cache entries :func:`list_caches` finds (only the stale ones with
    ``stale=True``); return the bytes freed. Nothing else is removed: a folder that is
    neither a dataset's nor holds cache entries is refused (CacheFolderError, nothing
    removed), and other files or folders beside the entries are left where they are.
    Raises CacheFolderError naming an entry that cannot be removed."""
    entries = list_caches(location)
    folders, dataset = _cache_folders(location)
    if not entries and dataset is None and any(_holds_anything(f) for f in folders):
        raise CacheFolderError(
            f"{location} is not a dataset folder (no {MANIFEST_NAME}) and holds no tfshards "
            "cache entries, so nothing was removed: name a dataset folder, or the folder "
            "given to read(cache=...)"
        )
    freed = 0
    for entry in entries:
        if stale and entry.state != "stale":
            continue
        try:
            _remove(entry.path)
        except OSError as exc:
            cause = exc.strerror or str(exc)
            raise CacheFolderError(
                f"cannot remove the cache entry {entry.path}: {cause} ({exc.filename}); "
                f"{freed / 2**20:.1f} MiB freed before it"
            ) from exc
        freed += entry.bytes
    return freed


def _remove(entry: Path) -> None:
    """rmtree, again where a file vanished meanwhile (another clear, a build published)."""
    try:
        shutil.rmtree(entry)
    except FileNotFoundError:
        if entry.exists():
            shutil.rmtree(entry)


def _cache_folders(location: str | os.PathLike) -> tuple[list[Path], Path | None]:
    """The cache folders ``location`` names, and the local dataset they belong to (None for
    a cache folder or a URL)."""
    text = os.fspath(location)
    if not str(text).strip():
        raise OptionsError(
            "the location of the caches is empty: name a dataset folder or URL, or the "
            "folder given to read(cache=...) ('.' for the current folder)"
        )
    if storage.is_url(text):
        return [default_cache_root(str(text).rstrip("/"))], None
    path = Path(text)
    if not path.is_dir():
        cause = "it is not a folder" if path.exists() else "no such folder"
        raise CacheFolderError(
            f"{path}: {cause}; name a dataset folder or URL, or the folder given to read(cache=...)"
        )
    if (path / MANIFEST_NAME).is_file() or (path / CACHE_DIR_NAME).is_dir():
        # Beside the shards while the folder was writable; else under the user cache.
        return [path / CACHE_DIR_NAME, fallback_root(path)], path
    return [path], None


def _proven_entries(folder: Path) -> list[tuple[Path, CacheInfo]]:
    """The entries in a cache folder, by name; whatever else lies there is passed over."""
    try:
        children = sorted(folder.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError as exc:
        raise CacheFolderError(f"{folder}: not a folder, so it holds no cache entries") from exc
    proven = [(path, _proven_entry(path)) for path in children]
    return [(path, info) for path, info in proven if info is not None]


def _proven_entry(folder: Path) -> CacheInfo | None:
    """The info of a folder proven to be a cache entry (see this module's docstring);
    None for anything else."""
    if not FINGERPRINT.fullmatch(folder.name) or folder.is_symlink() or not folder.is_dir():
        return None
    info = CacheInfo.load(folder)
    if info is None:
        return None
    try:
        with os.scandir(folder) as children:
            for child in children:
                if child.name == INFO_FILE and child.is_file(follow_symlinks=False):
                    continue
                ours = child.name == READY_DIR or child.name.startswith(BUILDING_PREFIX)
                if not (ours and _holds_files_only(child)):
                    return None
    except OSError:
        return None
    return info


def _holds_files_only(child: os.DirEntry) -> bool:
    """A folder (no link) of plain files (no links, no folders)."""
    if not child.is_dir(follow_symlinks=False):
        return False
    try:
        with os.scandir(child.path) as files:
            return all(f.is_file(follow_symlinks=False) for f in files)
    except FileNotFoundError:  # a build published (renamed) or removed meanwhile
        return True


def _state(entry: Path, info: CacheInfo, manifests: dict[str, Manifest | None]) -> str:
    if not _current(entry, info, manifests):
        return "stale"
    return "ready" if (entry / READY_DIR).is_dir() else "incomplete"


def _current(entry: Path, info: CacheInfo, manifests: dict[str, Manifest | None]) -> bool:
    """Whether ``entry`` is the one a read of its dataset would use now: its name is the
    fingerprint of the dataset's manifest as it is. A dataset at a URL is not asked."""
    dataset = entry.parent.parent if entry.parent.name == CACHE_DIR_NAME else info.dataset
    if storage.is_url(dataset):
        return True
    key = str(dataset)
    if key not in manifests:
        try:
            manifests[key] = Manifest.load(Path(dataset))
        except (TfshardsError, OSError, ValueError):  # gone, replaced by something else
            manifests[key] = None
    manifest = manifests[key]
    if manifest is None or info.split not in manifest.splits:
        return False
    index, count = info.pipeline
    shards = manifest.splits[info.split].shards[index::count]
    name = fingerprint(
        manifest.schema_version,
        info.split,
        info.shape,
        info.pipeline,
        info.files,
        [shard.sha256 for shard in shards],
        info.subset,
    )
    return name == entry.name


def _bytes_in(folder: Path) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except FileNotFoundError:  # published (renamed) or removed meanwhile
                continue
    return total


def _holds_anything(folder: Path) -> bool:
    try:
        return any(folder.iterdir())
    except OSError:
        return False
