"""A bounded local cache of a remote dataset's shards: downloaded whole, checked, shared.

Layout (one folder per dataset, keyed by the sha256s of its shards)::

    <shard cache root>/<key>/train-00003-of-00016.tfrecord     a checked, complete shard
    <shard cache root>/<key>/.download-<pid>-<name>             a download in progress
    <shard cache root>/<key>/.locks/<name>.lock                  its use lock (flock)
    <shard cache root>/<key>/.locks/<name>.download              its download lock (flock)

A shard is downloaded to a temporary name (hashed as its bytes arrive, never read
back), its size and digest compared with the manifest (its CRC-32C, or the sha256 in
a manifest older than that field: ``ShardInfo.download_digest``), and renamed into
place only when both match; a mismatch is downloaded once more, then the read fails
naming the object: a corrupt or truncated object never reaches training. A copy
already in the folder (from an earlier run or another process, or one a crash left
torn: it is not flushed to the disk before its rename) is checked the same way the
first time a process uses it (once per process and file: one read of the copy, hashed
at a fraction of sha256's CPU, ``storage.Crc32cDigest``); one that differs from the
manifest (damaged, or another shard's copy put in its place) is downloaded again.

Several processes on one host share the folder. A shard's use lock is held shared
while a process reads it or makes it present, so eviction, which needs it exclusively
and does not wait for it, never removes a shard in use. Its download lock is held
exclusively while it is downloaded (others wait, then find it present: one download
per host). The two are separate so that waiting for a download never waits for a
reader that keeps the shard open (with one lock, that wait could hang the reader). Locks
are ``flock`` locks: the kernel drops them when a process dies, so a crash leaves nothing
that blocks the next run.

With a size limit, the least recently used shards not in use are evicted before
each download so that the complete shards plus the incoming one stay within it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from tfshards import storage
from tfshards.download_process import DownloadProcess
from tfshards.errors import TfshardsError
from tfshards.schemas.manifest import Manifest, ShardInfo
from tfshards.sources.folders import (
    close_lock_file,
    held_exclusively,
    open_lock_file,
    process_alive,
    reset_in_forked_children,
)

LOCKS_DIR = ".locks"
DOWNLOAD_PREFIX = ".download-"
log = logging.getLogger("tfshards")
# Copies whose digest matched the manifest's, by path: (device, inode) of the file checked.
_checked: dict[str, tuple[int, int]] = {}


class ShardCheckError(TfshardsError):
    """A downloaded shard does not match the manifest's size and digest."""


def shard_cache_key(manifest: Manifest) -> str:
    """The dataset's identity: every shard's name and sha256 (same shards, same folder)."""
    body = sorted(
        (shard.file, shard.sha256) for split in manifest.splits.values() for shard in split.shards
    )
    return hashlib.sha256(json.dumps(body).encode()).hexdigest()[:24]


class ShardCache:
    """Local copies of a remote dataset's shards, at most ``limit`` bytes of them.

    ``ensure(shard)`` downloads a shard unless it is here (the reader calls it for the
    next shards, a few at a time, from tf.data's own threads); ``fetch(shard)`` returns
    the local path of a checked copy (waiting for or doing its download) and marks it in
    use until ``release(shard)``. At most ``keep`` shards stay
    marked, the oldest unmarked first, so a reader stopped mid-shard leaks nothing.
    """

    def __init__(
        self,
        folder: Path,
        remote_root: str,
        *,
        limit: int | None = None,
        keep: int = 16,
        storage_options: storage.StorageOptions = None,
    ) -> None:
        self.folder = folder
        self.remote_root = remote_root
        self.limit = limit
        self.keep = keep
        self.storage_options = storage_options
        self.downloads = 0  # by this process: what tests and logs count
        self.after_fork()
        reset_in_forked_children(self)
        # Callers are tf.data's threads: transfers run in a helper process, never on
        # fsspec's loop thread here (see download_process.py for the hang this avoids).
        self._transfers = DownloadProcess()
        if storage.is_url(remote_root):
            self._transfers.prepare()
        (folder / LOCKS_DIR).mkdir(parents=True, exist_ok=True)
        _remove_abandoned_downloads(folder)

    def after_fork(self) -> None:
        """Fresh locks, nothing in use: in a forked child, the parent's locks may be held
        by threads that do not exist here (the descriptors holding the use locks are lock
        files, closed in the child by ``folders.py``)."""
        self._in_use: OrderedDict[str, tuple[int, int]] = OrderedDict()  # file -> (fd, uses)
        self._mutex = threading.Lock()
        self._room = threading.Lock()
        self._reserved = 0  # bytes of this process's downloads in flight

    def ensure(self, shard: ShardInfo) -> None:
        """Download ``shard`` unless it is here (without marking it in use)."""
        close_lock_file(self._locked_present(shard))

    def fetch(self, shard: ShardInfo) -> str:
        """The local path of a checked copy of ``shard``, marked in use by this process."""
        fd = self._locked_present(shard)
        self._mark_in_use(shard.file, fd)
        return str(self.folder / shard.file)

    def release(self, shard: ShardInfo) -> None:
        """One reader of ``shard`` is done with it."""
        with self._mutex:
            fd, uses = self._in_use.get(shard.file, (None, 0))
            if fd is None:
                return
            if uses > 1:
                self._in_use[shard.file] = (fd, uses - 1)
            else:
                del self._in_use[shard.file]
                close_lock_file(fd)

    def recheck(self, shard: ShardInfo) -> None:
        """The copy of ``shard`` was found damaged while read: the next ``fetch`` or
        ``ensure`` hashes it again, and downloads it again if it differs."""
        _checked.pop(str(self.folder / shard.file), None)

    def _locked_present(self, shard: ShardInfo) -> int:
        """Make ``shard`` present and checked; return a descriptor holding its lock shared."""
        path = self.folder / shard.file
        fd = open_lock_file(self.folder / LOCKS_DIR / f"{shard.file}.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an eviction removes it
            if not _complete(path, shard):
                with held_exclusively(self.folder / LOCKS_DIR / f"{shard.file}.download"):
                    if not _complete(path, shard):  # another thread or process got it
                        self._download(shard, path)
            os.utime(path)  # the least recently used shards are evicted first
        except BaseException:
            close_lock_file(fd)
            raise
        return fd

    def usage(self) -> int:
        """Bytes of the complete shards and of the downloads in progress: this process's
        at their full size, other processes' at the size they have reached."""
        mine = f"{DOWNLOAD_PREFIX}{os.getpid()}-"
        return self._reserved + sum(
            _size(p) for p in self.folder.iterdir() if p.is_file() and not p.name.startswith(mine)
        )

    def _mark_in_use(self, name: str, fd: int) -> None:
        with self._mutex:
            old, uses = self._in_use.pop(name, (None, 0))
            if old is not None:
                close_lock_file(fd)  # one descriptor per shard holds the lock
                fd = old
            self._in_use[name] = (fd, uses + 1)
            while len(self._in_use) > self.keep:
                close_lock_file(self._in_use.popitem(last=False)[1][0])

    def _download(self, shard: ShardInfo, path: Path) -> None:
        with self._room:
            self._make_room(shard.bytes)
            self._reserved += shard.bytes
        try:
            self._download_checked(shard, path)
        finally:
            with self._room:
                self._reserved -= shard.bytes

    def _download_checked(self, shard: ShardInfo, path: Path) -> None:
        url = storage.join(self.remote_root, shard.file)
        if path.exists():
            log.warning(
                "%s: this copy in the shard cache differs from the manifest's %s (damaged, or "
                "another shard's copy); downloading it again",
                path,
                shard.download_digest[0],
            )
        for attempt in (1, 2):
            partial = self.folder / f"{DOWNLOAD_PREFIX}{os.getpid()}-{shard.file}"
            try:
                size, digest = self._transfer(url, partial, shard.download_digest[0])
                self.downloads += 1
                problem = _mismatch(size, digest, shard)
                if problem is None:
                    os.replace(partial, path)
                    _checked[str(path)] = _file_id(os.stat(path))
                    log.debug("downloaded %s", storage.display(url))
                    return
            finally:
                partial.unlink(missing_ok=True)
            log.warning("%s: %s (attempt %d of 2)", storage.display(url), problem, attempt)
        raise ShardCheckError(
            f"{storage.display(url)}: {problem}; the object is corrupt, truncated or was "
            "replaced after the manifest was written; refused (nothing of it was read). "
            "Run `tfshards verify` on the dataset, or convert it again"
        )

    def _transfer(self, url: str, partial: Path, digest: str) -> tuple[int, str]:
        """Copy ``url`` into ``partial``; its size and hex ``digest`` as the bytes arrived."""
        if storage.is_url(url):
            return self._transfers.get(url, partial, self.storage_options, digest)
        return storage.download_hashed(url, partial, self.storage_options, digest)

    def _make_room(self, incoming: int) -> None:
        """Evict least recently used shards not in use until ``incoming`` more bytes fit."""
        if self.limit is None:
            return
        used = self.usage()
        shards = sorted(
            (p for p in self.folder.iterdir() if p.is_file() and not p.name.startswith(".")),
            key=_mtime,
        )
        for candidate in shards:
            if used + incoming <= self.limit:
                return
            if candidate.name in self._in_use:
                continue
            freed = _evict(candidate, self.folder / LOCKS_DIR / f"{candidate.name}.lock")
            used -= freed
        if used + incoming > self.limit:
            log.warning(
                "shard cache %s: %d MiB in use by readers; over the limit of %d MiB for now",
                self.folder,
                used // 2**20,
                self.limit // 2**20,
            )


def _remove_abandoned_downloads(folder: Path) -> None:
    """Partial downloads of processes that no longer run (killed mid-download)."""
    for partial in folder.glob(f"{DOWNLOAD_PREFIX}*"):
        pid = partial.name[len(DOWNLOAD_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            partial.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # evicted or renamed meanwhile
        return 0


def _complete(path: Path, shard: ShardInfo) -> bool:
    """Present, of the manifest's size and digest: hashed the first time this process
    sees the file (a file reaches this name only after its digest matched, but a copy
    from an earlier run may have been damaged or swapped since)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return False
    if stat.st_size != shard.bytes:
        return False
    if _checked.get(str(path)) == _file_id(stat):
        return True
    name, expected = shard.download_digest
    try:
        digest = storage.file_digests(path, (name,))[name]
    except FileNotFoundError:  # evicted meanwhile
        return False
    if digest != expected:
        return False
    _checked[str(path)] = _file_id(stat)
    return True


def _file_id(stat: os.stat_result) -> tuple[int, int]:
    return (stat.st_dev, stat.st_ino)


def _mismatch(size: int, digest: str, shard: ShardInfo) -> str | None:
    """What differs between a download (its size and digest) and the manifest's shard."""
    if size != shard.bytes:
        return f"downloaded {size} bytes but the manifest says {shard.bytes}"
    name, expected = shard.download_digest
    if digest != expected:
        return f"{name} {digest[:16]} of the download differs from the manifest's {expected[:16]}"
    return None


def _evict(path: Path, lock: Path) -> int:
    """Remove ``path`` unless a process holds its lock; the bytes freed."""
    fd = open_lock_file(lock)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        close_lock_file(fd)
        return 0
    try:
        size = path.stat().st_size
        path.unlink()
        _checked.pop(str(path), None)  # its inode number may come back on another file
        log.debug("evicted %s from the shard cache", path.name)
        return size
    except FileNotFoundError:
        return 0
    finally:
        close_lock_file(fd)
