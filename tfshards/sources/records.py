"""The serialized records of one split by global index, without TensorFlow.

Global index ``i`` is the ``i``-th record of the split in the manifest's order (shard by
shard). A read looks up each record's offset (``schemas/offsets.py``), reads it with
``os.pread`` and checks both CRCs. File descriptors belong to the process that opened
them: an unpickled copy opens its own, and so does a forked child, whose copies of the
parent's locks and descriptors are replaced as it starts (``folders.py`` says why), so a
fork while another thread reads leaves nothing held.

Where the bytes come from, by the dataset:

- local, uncompressed: the shard files themselves;
- gzip/zlib shards: an uncompressed copy made once in the user cache folder
  (``inflated.py``, which states its cost), read by offset like any shard;
- at a URL (s3://, gs://...): the local shard cache (``shard_cache.py``), the same
  folder and checks as ``tfshards.read``. A shard is downloaded on its first read,
  or earlier by :meth:`SplitRecords.prefetch`; it stays marked in use while its
  descriptor is open, so the cache's limit never evicts a shard being read.

Each local shard's identity (device, inode, size, modification time) is taken when the
split is opened; a descriptor opened later on a file with another identity means the
dataset was replaced under the reader (``convert --overwrite``), and the read stops
with :class:`DatasetChangedError` instead of mixing two datasets. A downloaded copy
is checked against the manifest's size and sha256 instead (``ShardCheckError`` for an
object replaced in the bucket): a copy evicted and downloaded again is another file
with the same bytes.

The uncompressed copies, downloaded copies and kept offsets live in the user cache
folder, not in the dataset: one found damaged (a record whose CRC fails, offsets that
disagree with the manifest's record count) is reported in a warning naming it, removed
and made again from the dataset, and the read goes on. Only if the copy made again
disagrees too is the dataset at fault, and the error says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tfshards import storage
from tfshards.direct_reads import (
    READS_IN_FLIGHT,
    in_flight,
    open_unbuffered,
    reads_direct,
    unbuffered,
)
from tfshards.errors import DatasetChangedError, ManifestError, OptionsError
from tfshards.readers.memory_limits import outgrows_page_cache
from tfshards.readers.shards import SplitShards
from tfshards.schemas.format import compression
from tfshards.schemas.offsets import RecordOffsets, forget_kept, read_record, shard_offsets
from tfshards.schemas.tfrecord import RecordError
from tfshards.sources.folders import reset_in_forked_children, user_cache_dir
from tfshards.sources.inflated import default_inflated_folder, inflated_copy
from tfshards.sources.shard_cache import ShardCache, shard_cache_key

if TYPE_CHECKING:
    from tfshards.readers.options import ReadOptions

OPEN_FILES = 64  # descriptors kept open per process, least recently used closed first
MIN_CACHED_SHARDS = 3  # a shard cache limit must hold this many of the largest shards
Identity = tuple[int, int, int, int]
ReadOne = Callable[[int, int, int, int, str], None]  # see SplitRecords.read_each
log = logging.getLogger("tfshards")


def _ask_for_records(fd: int, offsets: RecordOffsets, locals_: np.ndarray) -> None:
    """Start reading a batch's records of one shard from the disk at once, so the reads
    that follow wait for a queue of them, not for one at a time (a split larger than the
    page cache, read through it: small records, a file system without ``O_DIRECT``, a
    disk cache being built; else it is read direct, see ``reads_direct``): 512x512 raw
    uint8 streamed under a 2 GiB limit 1.19-1.28x as fast, float32 1.09-1.17x
    (benchmarks/README.md, "A batch's pairs asked for at once")."""
    for local in locals_:
        start, length = int(offsets.starts[local]), int(offsets.lengths[local])
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)


def default_offsets_folder() -> Path:
    """Scanned offsets are kept here: ``$XDG_CACHE_HOME/tfshards/offsets``."""
    return user_cache_dir() / "offsets"


@dataclass(frozen=True)
class Downloads:
    """Where a remote split's shards are cached (as ``ReadOptions.shard_cache``)."""

    folder: Path
    limit: int | None
    storage_options: storage.StorageOptions


class SplitRecords:
    """``len()`` records of one split; ``read(indices)`` returns their data in that order.

    ``offsets_folder`` keeps scanned offsets, ``inflated_folder`` the uncompressed copies
    of gzip/zlib shards (both default to the user cache folder); for a split at a URL,
    ``shard_cache`` is the shard cache's root folder (default: ``shards/`` in the user
    cache folder, as ``tfshards.read``), ``shard_cache_limit`` its most bytes and
    ``storage_options`` what fsspec gets.
    """

    def __init__(
        self,
        shards: SplitShards,
        *,
        offsets_folder: Path | None = None,
        inflated_folder: Path | None = None,
        shard_cache: str | os.PathLike | None = None,
        shard_cache_limit: int | None = None,
        storage_options: storage.StorageOptions = None,
        direct_reads: bool | None = None,
    ) -> None:
        self.shards = shards
        self.offsets_folder = offsets_folder or default_offsets_folder()
        self.kind = compression(shards.manifest.compression.type)
        self.inflated_folder = inflated_folder or default_inflated_folder()
        counts = [shard.records for shard in shards.shards]
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        split_bytes = sum(shard.bytes for shard in shards.shards)
        self.ask_ahead = outgrows_page_cache(split_bytes)
        # Each record read once an epoch from the disk: past the page cache, when its
        # records are large enough for whole aligned blocks to cost little (direct_reads.py).
        self.reads_direct = reads_direct(direct_reads, self.ask_ahead, split_bytes, sum(counts))
        self.downloads: Downloads | None = None
        self.open_files = OPEN_FILES
        if shards.remote:
            root = Path(shard_cache) if shard_cache else user_cache_dir() / "shards"
            folder = root / shard_cache_key(shards.manifest)
            self.downloads = Downloads(folder, shard_cache_limit, storage_options)
            self.open_files = _open_files_within(shards, shard_cache_limit)
            self.identities: list[Identity] = []
        else:
            self.identities = [_opened_identity(path) for path in shards.paths]
        self._reset()

    @classmethod
    def for_options(cls, shards: SplitShards, options: ReadOptions) -> SplitRecords:
        """The records of ``shards`` read as ``options`` says (the shard cache, fsspec's
        options, direct reads): how the readers and ``tfshards.Pairs`` open a split."""
        return cls(
            shards,
            shard_cache=options.shard_cache,
            shard_cache_limit=options.shard_cache_limit,
            storage_options=options.storage_options,
            direct_reads=options.direct_reads,
        )

    def _reset(self) -> None:
        self._offsets: dict[int, RecordOffsets] = {}
        self._no_handles()
        reset_in_forked_children(self)

    def after_fork(self) -> None:
        """In a forked child: the parent's locks may be held by threads that do not exist
        here, and its descriptors, shard cache and download helper are the parent's (its
        offsets, mere numbers, are kept)."""
        for fd in [*self._files.values(), *_flat(self._retired)]:
            with contextlib.suppress(OSError):
                os.close(fd)  # the child's copies
        self._no_handles()

    def _no_handles(self) -> None:
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._files: OrderedDict[int, int] = OrderedDict()  # shard number -> descriptor
        self._busy: dict[int, int] = {}  # shard number -> reads using its descriptor now
        self._retired: dict[int, list[int]] = {}  # descriptors of damaged copies, closed when idle
        self._marked: set[int] = set()  # shards marked in use in the shard cache
        self._cache: ShardCache | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in (
            "_lock",
            "_cache_lock",
            "_files",
            "_busy",
            "_retired",
            "_offsets",
            "_marked",
            "_cache",
        ):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def __len__(self) -> int:
        return int(self.first[-1])

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, record within the shard) of each global index."""
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"record index out of range for {len(self)} records")
        shard = np.searchsorted(self.first, indices, side="right") - 1
        return shard, indices - self.first[shard]

    def located(self, index: int) -> str:
        """Record ``index`` named for messages: its shard file and number in the shard."""
        shard, local = (int(n[0]) for n in self.locate(np.array([index])))
        return f"{storage.display(self.shards.paths[shard])}: record {local}"

    def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The data of the records at ``indices``, in that order, CRCs checked."""
        out: list[bytes] = [b""] * len(indices)

        def keep(position: int, fd: int, start: int, length: int, where: str) -> None:
            out[position] = read_record(fd, start, length, where)

        self.read_each(indices, keep)
        return out

    def read_each(self, indices: Sequence[int] | np.ndarray, read_one: ReadOne) -> None:
        """Call ``read_one(position, fd, start, length, where)`` for each record at
        ``indices``: its position in ``indices``, an open descriptor of its shard (in use
        until the call returns), where its framing starts, its framed length, and its
        name for errors. Shard by shard, in offset order: sequential reads where the
        order allows."""
        shard_numbers, locals_ = self.locate(np.asarray(indices, np.int64))
        order = np.lexsort((locals_, shard_numbers))

        def read_runs(part: np.ndarray) -> None:
            starts = np.flatnonzero(np.diff(shard_numbers[part], prepend=-1))
            for run in np.split(part, starts[1:]):
                self._read_run(int(shard_numbers[run[0]]), run, locals_[run], read_one)

        if self.reads_direct and len(order) > 1:  # no read-ahead: several reads at once
            in_flight(read_runs, np.array_split(order, min(READS_IN_FLIGHT, len(order))))
        else:
            read_runs(order)

    def _read_run(
        self, number: int, run: np.ndarray, locals_: np.ndarray, read_one: ReadOne
    ) -> None:
        """``read_one`` for the records ``locals_`` of shard ``number`` (at positions
        ``run``); a copy in the user cache whose record fails its CRC is made again, once."""
        for attempt in (1, 2):
            fd, offsets = self._open(number)  # in use until done: never closed under us
            try:
                if self.ask_ahead and not unbuffered(fd):
                    _ask_for_records(fd, offsets, locals_)
                for position, local in zip(run.tolist(), locals_.tolist(), strict=True):
                    where = f"{self.shards.paths[number]}: record {local}"
                    start, length = int(offsets.starts[local]), int(offsets.lengths[local])
                    read_one(position, fd, start, length, where)
                return
            except RecordError as exc:
                if attempt == 2 or not self.derived:
                    raise
                self._discard(number, fd, str(exc))
            finally:
                self._done(number)

    @property
    def derived(self) -> bool:
        """Whether the files read are copies in the user cache (inflated, downloaded)
        rather than the dataset's own shards."""
        return self.downloads is not None or self.kind.compressed

    def _done(self, number: int) -> None:
        """A read of shard ``number`` is over; close descriptors beyond the limit now."""
        with self._lock:
            self._busy[number] -= 1
            if not self._busy[number]:
                del self._busy[number]
                self._done_retired(number)
            self._close_beyond_limit()

    def _close_beyond_limit(self) -> None:
        """Close the least recently used descriptors no read is using, down to the limit."""
        idle = [n for n in self._files if n not in self._busy]
        for number in idle[: max(0, len(self._files) - self.open_files)]:
            self._close_locked(number)

    def read_through_page_cache(self) -> None:
        """Read the shards through the page cache from now on, large or not: while a
        disk cache is built from them (its writes go through the page cache, and the
        build ran 0.69-0.87x as fast with the shards read direct; benchmarks/README.md,
        "Reads past the page cache")."""
        self.reads_direct = False

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Make the shards of the records at ``indices`` local now: download them into the
        shard cache (a dataset at a URL) and inflate them (gzip/zlib shards), so a later
        ``read`` of them waits for neither. Call it from another thread, ahead of use;
        it does nothing for local uncompressed shards. Safe beside ``read``."""
        if self.downloads is None and not self.kind.compressed:
            return
        for number in np.unique(self.locate(np.asarray(indices, np.int64))[0]):
            self._local_copy(int(number), mark=False)

    def _open(self, number: int) -> tuple[int, RecordOffsets]:
        with self._lock:
            if number not in self._offsets:
                self._open_with_offsets(number)
            elif number not in self._files:
                self._open_checked(number)
            self._files.move_to_end(number)
            self._busy[number] = self._busy.get(number, 0) + 1
            self._close_beyond_limit()
            return self._files[number], self._offsets[number]

    def _open_with_offsets(self, number: int) -> None:
        """Open shard ``number`` and find its offsets; a copy in the user cache whose
        offsets disagree with the manifest is made again, once (the lock is held)."""
        shard = self.shards.shards[number]
        for attempt in (1, 2):
            fd = self._files.get(number)
            if fd is None:
                fd = self._open_checked(number)
            last = attempt == 2 or not self.derived
            try:
                offsets = shard_offsets(
                    Path(self._local_path(number)),
                    shard.sha256,
                    os.fstat(fd).st_size,
                    self.offsets_folder,
                    records=shard.records,
                )
            except RecordError as exc:
                if last:
                    raise
                self._discard_locked(number, fd, str(exc))
                continue
            if len(offsets) == shard.records:
                self._offsets[number] = offsets
                return
            if last:
                raise ManifestError(
                    f"{self.shards.paths[number]}: {len(offsets)} records, but the manifest "
                    f"says {shard.records}; the manifest was edited or belongs to other "
                    "shards: convert again (`tfshards verify` shows the differences)"
                )
            problem = f"{len(offsets)} records, but the manifest says {shard.records}"
            self._discard_locked(number, fd, problem)

    def _discard(self, number: int, fd: int, problem: str) -> None:
        with self._lock:
            self._discard_locked(number, fd, problem)

    def _discard_locked(self, number: int, fd: int, problem: str) -> None:
        """The copy of shard ``number`` read through ``fd`` is damaged: forget it, its
        offsets and its check, so that the next open makes it again (unless another
        thread already did). Its descriptor closes once no read uses it."""
        if self._files.get(number) != fd:
            return
        shard = self.shards.shards[number]
        path = Path(self._local_path(number))
        log.warning(
            "%s: this copy in the user cache folder is damaged (%s): it is made again "
            "from the dataset",
            path,
            problem,
        )
        forget_kept(shard.sha256, self.offsets_folder)
        if self.kind.compressed:
            _remove_if_same(path, fd)
        else:  # a downloaded copy: hashed again when next fetched, downloaded if it differs
            self._shard_cache().recheck(shard)
        del self._files[number]
        self._offsets.pop(number, None)
        self._retired.setdefault(number, []).append(fd)
        if number not in self._busy:
            self._done_retired(number)
        if number in self._marked:
            self._marked.discard(number)
            self._cache.release(shard)

    def _done_retired(self, number: int) -> None:
        for fd in self._retired.pop(number, ()):
            os.close(fd)

    def _open_checked(self, number: int) -> int:
        path = self._local_copy(number, mark=True)
        try:
            fd = open_unbuffered(path) if self.reads_direct else None
            fd = os.open(path, os.O_RDONLY) if fd is None else fd
        except FileNotFoundError:
            raise dataset_changed(path, "it is gone") from None
        if path is self.shards.paths[number] and _identity(os.fstat(fd)) != self.identities[number]:
            os.close(fd)
            raise dataset_changed(path, "another file now has its name")
        self._files[number] = fd
        return fd

    def check_unchanged(self) -> None:
        """Raise DatasetChangedError if a local shard is not the file opened at the start
        (a dataset at a URL is checked by sha256 as its shards arrive)."""
        if self.downloads is not None:
            return
        for number, path in enumerate(self.shards.paths):
            self._check_identity(number, path)

    def _local_copy(self, number: int, *, mark: bool) -> str:
        """The local uncompressed file of shard ``number``: the shard itself, its
        inflated copy, or its copy in the shard cache (marked in use when ``mark``)."""
        shard = self.shards.shards[number]
        if self.downloads is None:
            path = self.shards.paths[number]
            if not self.kind.compressed:
                return path  # its identity is checked on the descriptor
            self._check_identity(number, path)
            return str(inflated_copy(Path(path), shard, self.kind, self.inflated_folder))
        if self.kind.compressed:
            target = self.inflated_folder / f"{shard.sha256}.tfrecord"
            if target.is_file():
                return str(target)
            cache = self._shard_cache()
            local = Path(cache.fetch(shard))
            try:
                return str(inflated_copy(local, shard, self.kind, self.inflated_folder))
            finally:
                cache.release(shard)
        if not mark:
            self._shard_cache().ensure(shard)
            return str(self.downloads.folder / shard.file)
        path = self._shard_cache().fetch(shard)
        self._marked.add(number)
        return path

    def _local_path(self, number: int) -> str:
        shard = self.shards.shards[number]
        if self.kind.compressed:
            return str(self.inflated_folder / f"{shard.sha256}.tfrecord")
        if self.downloads is not None:
            return str(self.downloads.folder / shard.file)
        return self.shards.paths[number]

    def _check_identity(self, number: int, path: str) -> None:
        try:
            identity = _identity(os.stat(path))
        except FileNotFoundError:
            raise dataset_changed(path, "it is gone") from None
        if identity != self.identities[number]:
            raise dataset_changed(path, "another file now has its name")

    def _shard_cache(self) -> ShardCache:
        with self._cache_lock:
            if self._cache is None:
                downloads = self.downloads
                self._cache = ShardCache(
                    downloads.folder,
                    self.shards.root,
                    limit=downloads.limit,
                    keep=self.open_files + 1,
                    storage_options=downloads.storage_options,
                )
            return self._cache

    def _close_locked(self, number: int) -> None:
        os.close(self._files.pop(number))
        if number in self._marked:
            self._marked.discard(number)
            self._cache.release(self.shards.shards[number])

    def close(self) -> None:
        with self._lock:
            for number in list(self._files):
                self._close_locked(number)
            for number in list(self._retired):
                self._done_retired(number)
            self._marked = set()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown
            self.close()


def _flat(lists: dict[int, list[int]]) -> list[int]:
    return [item for items in lists.values() for item in items]


def _remove_if_same(path: Path, fd: int) -> None:
    """Remove ``path`` if it still names the file open as ``fd`` (not a copy another
    process has made again meanwhile)."""
    opened = os.fstat(fd)
    with contextlib.suppress(FileNotFoundError):
        if os.path.samestat(opened, os.stat(path)):
            path.unlink()


def _identity(stat: os.stat_result) -> Identity:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _opened_identity(path: str) -> Identity:
    identity = file_identity(path)
    if identity is None:
        raise dataset_changed(path, "it is gone")
    return identity


def file_identity(path: str) -> Identity | None:
    """(device, inode, size, mtime) of a file; None when it is gone."""
    try:
        return _identity(os.stat(path))
    except FileNotFoundError:
        return None


def dataset_changed(path: str, how: str) -> DatasetChangedError:
    return DatasetChangedError(
        f"{path}: the dataset was replaced while it was being read ({how}; e.g. by "
        "`tfshards convert --overwrite`); no pairs of the new version were mixed in: "
        "start the read again"
    )


def _open_files_within(shards: SplitShards, limit: int | None) -> int:
    """How many shards may be open (marked in use) at once within a shard cache limit,
    leaving room for one download ahead and the one arriving."""
    if limit is None:
        return OPEN_FILES
    largest = max((shard.bytes for shard in shards.shards), default=1)
    fit = limit // max(largest, 1)
    if fit < MIN_CACHED_SHARDS:
        raise OptionsError(
            f"shard_cache_limit={limit} bytes holds {fit} of this dataset's shards (the "
            f"largest is {largest / 2**20:.1f} MiB); reading needs room for at least "
            f"{MIN_CACHED_SHARDS}: raise the limit, or convert with smaller shards (--shard-size)"
        )
    return min(OPEN_FILES, fit - 2)
