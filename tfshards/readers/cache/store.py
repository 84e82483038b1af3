"""Decoded uint8 pairs by record index, for the ordered reader: in RAM or in a disk entry.

A fixed-size disk entry is two flat files, ``pairs.image`` ([records, H, W, C] uint8,
row-major) and ``pairs.mask`` ([records, H, W]), so pair ``i`` is one slice of each:
a batch is gathered with one ``os.preadv`` per pair and file, in offset order, straight
into the batch's array, never one tf.data element per pair. Not a memory map: under a
memory limit, a mapping's read-ahead read 1.1-1.2x the cache per epoch from disk and
its pages counted in the reader's RSS (``benchmarks/larger_than_ram.py``); each read
here reads its pair's bytes only (``POSIX_FADV_RANDOM``). An entry too large to stay in
the page cache is read past it (``O_DIRECT``, direct_reads.py), four pairs of a batch at
once, each straight into its page-aligned row when a row is whole 4 KiB blocks: cached
epochs at 512x512 under a 2 GiB limit 1.24-1.33x as fast as through the page cache
(benchmarks/README.md, "Reads past the page cache"). Where the file system refuses
that, every pair of a batch is asked for (``POSIX_FADV_WILLNEED``) before the first is
read, so the disk serves them as one queue.

Building: every decoded batch is written at its records' places in a private
``.building-*`` folder, whatever the order; once every record has been written (in
one epoch, or over several when a run starts mid-epoch), the shards are checked to be
the ones the build started from (a pass that overlapped ``convert --overwrite`` never
publishes) and the store reads its pairs from those files at once, from the page
cache, while a background thread (:class:`Publisher`) fsyncs them and renames the
folder to ``ready``. The epoch that built the entry so never waits for the disk to
take it in. The first rename wins; a crash, before or after, leaves either a building
folder nobody reads or a whole entry (see entry.py).

Checked: ``pairs.crc32`` holds each pair's CRC-32 ([records] little-endian uint32) of
its image's bytes and its mask's, started from its record index, taken
when the pair is written and checked each time it is read, so a changed byte or two
pairs swapped on disk stop the read (:class:`CacheDamagedError`) instead of reaching
training; the entry is then removed, and the next read builds it again. A file of
another size makes the entry not ready: it is rebuilt (as a truncated pairs file is).
The check costs CPU on every warm epoch: benchmarks/studies/cache_checksum_cost.py.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tfshards.direct_reads import ALIGNMENT as DIRECT_ALIGNMENT
from tfshards.direct_reads import (
    READS_IN_FLIGHT,
    in_flight,
    open_unbuffered,
    read_into,
    reads_direct,
    unbuffered,
)
from tfshards.errors import TfshardsError
from tfshards.readers.cache.entry import DiskCache, publishing, wait_for_publishing
from tfshards.readers.memory_limits import outgrows_page_cache, usable_memory
from tfshards.sources.pixel_batches import aligned_empty

log = logging.getLogger(__name__)  # under "tfshards"; `bench` quiets its INFO lines
FLAT_FILES = ("pairs.image", "pairs.mask")
CHECKSUM_FILE = "pairs.crc32"  # one CRC-32 per pair, little-endian uint32 (see above)
CHECKSUM_DTYPE = np.dtype("<u4")
_CHECKED = True  # False only in benchmarks/studies/cache_checksum_cost.py (its "off" pass)
# A building entry's files are flushed to disk in the background every this many bytes
# written (see Flusher), when the entry is too large to leave to the page cache until
# it is published: above this share of the memory the process may use (the kernel's
# default for starting writeback of its own, dirty_background_ratio), or this size.
WRITE_BEHIND_BYTES = 64 * 2**20
UNFLUSHED_SHARE_OF_MEMORY = 0.10
UNFLUSHED_MAX_BYTES = 2 * 2**30


def flat_sizes(records: int, shape: tuple[int, int, int]) -> tuple[int, int]:
    height, width, channels = shape
    return records * height * width * channels, records * height * width


class CacheDamagedError(TfshardsError):
    """A disk cache entry's pair no longer holds the bytes written when it was built."""


def pair_checksums(indices: np.ndarray, images: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Each pair's CRC-32 (:func:`checksum_of`) of a batch, as ``CHECKSUM_DTYPE``."""
    crc = checksum_of(np.ascontiguousarray(images), np.ascontiguousarray(masks))
    return np.array([crc(k, int(index)) for k, index in enumerate(indices)], CHECKSUM_DTYPE)


def checksum_of(images: np.ndarray, masks: np.ndarray) -> Callable[[int, int], int]:
    """``crc(k, index)``: the CRC-32 (zlib's) of pair ``k`` of a batch (C-contiguous
    arrays), of its image's bytes then its mask's, started from its record ``index``
    (the low 32 bits): ``zlib.crc32(mask, zlib.crc32(image, index))``, so a pair read
    from another index fails as a changed byte does. Computed where the pixels lie, by
    address: no copy, no array made per pair (``ndarray.ctypes`` costs a microsecond)."""
    extend = _crc32_at()
    if extend is None:  # zlib's: the same values, at a tenth of ISA-L's speed
        return lambda k, index: zlib.crc32(masks[k], zlib.crc32(images[k], index & 0xFFFFFFFF))
    image_at, mask_at = images.ctypes.data, masks.ctypes.data
    image_bytes, mask_bytes = (
        images.nbytes // max(len(images), 1),
        masks.nbytes // max(len(masks), 1),
    )

    def crc(k: int, index: int) -> int:
        image = extend(index & 0xFFFFFFFF, image_at + k * image_bytes, image_bytes)
        return extend(image, mask_at + k * mask_bytes, mask_bytes)

    return crc


@functools.cache
def _crc32_at() -> Callable[[int, int, int], int] | None:
    """ISA-L's ``crc32_gzip_refl(crc, address, size)``, zlib's CRC-32, through ctypes: it
    reads an array's memory by address, and ctypes releases the GIL for the call (held
    instead, through ``PyDLL``, the reader's warm epochs took more CPU: the fetches of
    other batches wait for it). Not CRC-32C: ISA-L's CRC-32 ran 2x google-crc32c's here,
    48 against 25 GB/s (benchmarks/studies/cache_checksum_cost.py). None where isal is
    not installed."""
    try:
        from isal import isal_zlib

        extend = ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl
    except (ImportError, OSError, AttributeError):
        return None
    extend.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64)
    extend.restype = ctypes.c_uint32
    return extend


class EntryFiles:
    """Reading a row, close() and __del__ of a store's files (PairStore, and native.py's
    NativeStore): both hold the same descriptors, build folder, flusher and publisher."""

    _lock: threading.Lock
    _publisher: Publisher | None
    _flusher: Flusher | None
    _published: list[int] | None
    _files: list[int] | None
    _folder: Path | None
    _closed: bool
    cache: DiskCache | None

    def _read_row(self, fd: int, row: np.ndarray, offset: int, name: str) -> None:
        """One pair's bytes of the ready file ``name`` into ``row``; the file was checked
        to be whole when opened, and one cut short since is named in the error."""
        got = read_into(fd, row, offset)
        if got < row.nbytes:
            raise CacheDamagedError(
                f"disk cache file {self.cache.ready / name} ended at byte {offset + got}, "
                "before the pair it holds there: it was truncated after it was published; "
                "run `tfshards cache clear` on the dataset and read again"
            )

    def close(self) -> None:
        """Close the store's files (it reads and writes nothing after this); a build left
        unfinished is removed, as nobody can finish it."""
        with self._lock:
            if self._publisher is not None:  # a finished build is kept: on disk first
                self._publisher.wait()
            if self._flusher is not None:
                self._flusher.stop()
            for fd in [*(self._published or ()), *(self._files or ())]:
                os.close(fd)
            self._published = self._files = None
            self._closed = True
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None

    def __del__(self) -> None:
        # Not contextlib.suppress: at interpreter shutdown module globals may be None.
        try:  # noqa: SIM105
            self.close()
        except Exception:  # noqa: S110 - nothing to report to at shutdown
            pass


class PairStore(EntryFiles):
    """``records`` decoded pairs of ``shape``; RAM when ``cache`` is None, else its entry."""

    def __init__(
        self,
        records: int,
        shape: tuple[int, int, int],
        cache: DiskCache | None = None,
        unchanged: Callable[[], None] | None = None,
        direct_reads: bool | None = None,
    ) -> None:
        self.records, self.shape, self.cache = records, shape, cache
        self.unchanged = unchanged  # raises when the shards changed since the read began
        self._lock = threading.Lock()
        self._flusher: Flusher | None = None  # the building files' write-behind (disk)
        self._publisher: Publisher | None = None  # puts the finished build on disk
        self._closed = False
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._written: np.ndarray | None = None
        self._folder: Path | None = None
        self._files: list[int] | None = None  # the building files' descriptors (disk)
        self._published: list[int] | None = None  # the ready files' descriptors (disk)
        self._checksums: np.ndarray | None = None  # each pair's CRC (disk): checked on read
        self._discarded = False  # the damaged entry was removed (see _discard)
        self.ready = False
        entry_bytes = sum(flat_sizes(records, shape))
        self._ask_ahead = cache is not None and outgrows_page_cache(entry_bytes)
        self._reads_direct = cache is not None and reads_direct(
            direct_reads, self._ask_ahead, entry_bytes, records
        )
        if cache is not None and flat_ready(cache.ready, records, shape):
            self._checksums = _checksums_of(cache.ready, records)
            self._published = _opened_for_reading(cache.ready, unbuffered=self._reads_direct)
            self.ready = True

    def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pairs at ``indices`` (the store must be ready)."""
        height, width, channels = self.shape
        order = np.argsort(indices, kind="stable")  # ascending offsets: sequential reads
        out = (  # rows of a direct read's alignment are read into in place (direct_reads.py)
            aligned_empty((len(indices), height, width, channels), DIRECT_ALIGNMENT),
            aligned_empty((len(indices), height, width, 1), DIRECT_ALIGNMENT),
        )
        if self._published is None:  # RAM: one copy per row (fancy indexing copies twice)
            for source, rows in zip(self._arrays, out, strict=True):
                for position in order:
                    rows[position] = source[indices[position]]
            return out
        if self._ask_ahead and not unbuffered(self._published[0]):
            for fd, rows in zip(self._published, out, strict=True):
                _ask_for_rows(fd, indices[order], rows[0].nbytes)
        (images_fd, masks_fd), (images, masks) = self._published, out
        image_bytes, mask_bytes = images[0].nbytes, masks[0].nbytes
        wrong, crc = [], checksum_of(images, masks)

        def read_rows(positions: np.ndarray) -> None:
            # Each pair is checked as soon as it is read, from the CPU's cache; a batch is
            # larger than that cache: checked after the batch, it is read from memory again.
            for position in positions.tolist():
                index = int(indices[position])
                image, mask = images[position], masks[position]
                self._read_row(images_fd, image, index * image_bytes, FLAT_FILES[0])
                self._read_row(masks_fd, mask, index * mask_bytes, FLAT_FILES[1])
                if _CHECKED and crc(position, index) != self._checksums[index]:
                    wrong.append(index)

        if unbuffered(images_fd) and len(order) > 1:  # no read-ahead: several reads at once
            in_flight(read_rows, np.array_split(order, min(READS_IN_FLIGHT, len(order))))
        else:
            read_rows(order)
        if wrong:
            self._damaged(sorted(wrong))
        return out

    def _damaged(self, wrong: list[int]) -> None:
        """Remove the entry and raise CacheDamagedError naming the pairs ``wrong`` (record
        indices, ascending) that do not hold the bytes they were written with."""
        raise CacheDamagedError(damaged_message(self.cache, wrong, self._discard()))

    def _discard(self) -> bool:
        """Remove the ready entry this store reads (see ``discard_ready``), once."""
        with self._lock:
            if not self._discarded:
                self._discarded = discard_ready(self.cache, self._published[0])
            return self._discarded

    def write(self, indices: np.ndarray, images: np.ndarray, masks: np.ndarray) -> None:
        """Keep decoded pairs; publish (disk) or mark ready (RAM) once all are kept."""
        masks = masks.reshape(len(indices), *self.shape[:2], 1)
        checksums = None
        if self.cache is not None and not self.ready:  # taken outside the lock
            checksums = pair_checksums(indices, images, masks)
        with self._lock:
            if self.ready or self._closed:
                return
            if self._written is None:
                self._start()
            if self._files is None:
                self._arrays[0][indices] = images
                self._arrays[1][indices] = masks
            else:  # pwrite: no page faults on a fresh mapping (measured 0.4 ms per pair)
                for fd, pixels in zip(self._files, (images, masks), strict=True):
                    size = pixels[0].nbytes if len(pixels) else 0
                    for index, one in zip(indices, pixels, strict=True):
                        os.pwrite(fd, one.data, int(index) * size)
                self._flusher.wrote(images.nbytes + masks.nbytes)
                self._checksums[indices] = checksums
            self._written[indices] = True
            if self._written.all():
                self._finish()

    def _start(self) -> None:
        self._written = np.zeros(self.records, bool)
        if self.cache is None:
            self._arrays = (
                np.empty((self.records, *self.shape), np.uint8),
                np.empty((self.records, *self.shape[:2], 1), np.uint8),
            )
            return
        self._folder = self.cache.new_building_folder()
        self._folder.mkdir(parents=True)
        self._checksums = np.zeros(self.records, CHECKSUM_DTYPE)  # written at _finish
        sizes = flat_sizes(self.records, self.shape)
        self._files = []
        for name, size in zip(FLAT_FILES, sizes, strict=True):
            fd = os.open(self._folder / name, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, size)
            self._files.append(fd)
        self._flusher = Flusher(self._files, write_behind=flushed_while_built(sum(sizes)))

    def _finish(self) -> None:
        if self.cache is None:
            self.ready = True
            return
        if self.unchanged is not None:
            self.unchanged()  # raises: the build never publishes a mix of two datasets
        folder, flusher = self._folder, self._flusher
        files = [*self._files, _written_whole(folder / CHECKSUM_FILE, self._checksums)]
        self._folder = self._files = self._flusher = None  # the publisher's from here
        # Read on from the page cache; an entry larger than it, written behind as it
        # was built, from the disk (the kernel writes any dirty rest before a direct read).
        self._published = _opened_for_reading(folder, unbuffered=self._reads_direct)
        self._written = None
        self.ready = True
        self._publisher = Publisher(folder, files, flusher, self.cache)


def damaged_message(cache: DiskCache, wrong: list[int], removed: bool) -> str:
    """What CacheDamagedError says of the pairs ``wrong`` (record indices, ascending)."""
    others = f" and {len(wrong) - 1} more of its batch" if len(wrong) > 1 else ""
    then = (
        "the entry was removed, and the next read builds it again"
        if removed
        else "it could not be removed: run `tfshards cache clear` on the dataset"
    )
    return (
        f"disk cache {cache.folder}: pair {wrong[0]}{others} does "
        f"not match its checksum in {CHECKSUM_FILE}: bytes of {FLAT_FILES[0]} or "
        f"{FLAT_FILES[1]} changed on disk after the entry was built; {then}"
    )


def discard_ready(cache: DiskCache, image_fd: int) -> bool:
    """Remove the ready entry whose image file ``image_fd`` reads, so no read names it
    again (its files stay readable while open); False when it cannot be. An entry
    another process built since then in its place is left alone."""
    wait_for_publishing(cache.folder)  # the entry this process built is ready
    ready = cache.ready
    try:
        ours = os.path.samestat(os.stat(ready / FLAT_FILES[0]), os.fstat(image_fd))
    except OSError:  # gone already
        ours = False
    if ours:
        doomed = cache.new_building_folder()  # a crash leaves it abandoned
        try:
            os.rename(ready, doomed)
        except OSError as exc:
            log.warning("cannot remove the damaged disk cache %s: %s", ready, exc)
            return False
        shutil.rmtree(doomed, ignore_errors=True)
        log.warning("removed the damaged disk cache %s", ready)
    return True


class Publisher:
    """Puts a finished build on disk and publishes it, in a thread of its own: the fsync
    waits for the disk to write what the flusher has not yet (a build fills the page
    cache faster than this VM's disk takes it in, 2 against 0.5 GB/s), and nothing read
    waits for it, as the store reads the same files meanwhile. Not a daemon thread: a
    program that ends sooner waits for it, so a finished build is not lost. When the
    fsync fails the entry is not published (logged); this process reads on from the
    files it has open, and the next read builds the entry again."""

    def __init__(self, folder: Path, files: list[int], flusher: Flusher, cache: DiskCache) -> None:
        self._folder, self._files, self._flusher, self._cache = folder, files, flusher, cache
        self._thread = threading.Thread(  # else a daemon, as tf.data's threads start it
            target=self._run, name="tfshards-cache-publish", daemon=False
        )
        self._thread.start()
        publishing(cache.folder, self._thread)

    def wait(self) -> None:
        """Return once the entry is published, or given up on."""
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        self._flusher.stop()
        try:
            for fd in self._files:
                os.fsync(fd)
        except OSError as exc:
            log.warning(
                "disk cache %s not published: writing it to disk failed (%s); it is read "
                "from memory until this program ends, and built again by the next read",
                self._cache.folder,
                exc.strerror or exc,
            )
            shutil.rmtree(self._folder, ignore_errors=True)
            return
        finally:
            for fd in self._files:
                os.close(fd)
        try:
            os.rename(self._folder, self._cache.ready)
        except OSError:  # another process published first: its entry holds the same pairs
            shutil.rmtree(self._folder, ignore_errors=True)
        else:
            log.info("disk cache ready: %s", self._cache.ready)


def flushed_while_built(entry_bytes: int) -> bool:
    """Whether a building entry of ``entry_bytes`` is flushed as it is written. A smaller
    one stays in the page cache until the publisher's fsync, which runs in the background,
    so the building epoch does not share the disk and the CPU with its writeback
    (measured: builds about 4% faster, benchmarks/README.md, "A small cache build left to
    the page cache"). A larger one (larger than RAM, say) would otherwise fill memory with
    dirty pages, which the kernel throttles and reclaims slowly; where the memory is
    unknown, it is flushed."""
    memory = usable_memory()
    if memory is None:
        return True
    return entry_bytes > min(UNFLUSHED_SHARE_OF_MEMORY * memory, UNFLUSHED_MAX_BYTES)


class Flusher:
    """Writes a building entry's files to disk in the background (write-behind) each time
    another WRITE_BEHIND_BYTES have been written to them, so the fsync before publishing
    waits for the last ones only and the reading threads never wait for the disk. Without
    ``write_behind`` it does nothing (no thread): the publisher's fsync writes it all."""

    def __init__(self, fds: list[int], *, write_behind: bool = True) -> None:
        self._fds, self._unflushed, self._stopping = fds, 0, False
        self._due = threading.Event()
        self._thread: threading.Thread | None = None
        if write_behind:
            self._thread = threading.Thread(
                target=self._run, name="tfshards-cache-flush", daemon=True
            )
            self._thread.start()

    def wrote(self, nbytes: int) -> None:
        if self._thread is None:
            return
        self._unflushed += nbytes
        if self._unflushed >= WRITE_BEHIND_BYTES:
            self._unflushed = 0
            self._due.set()

    def stop(self) -> None:
        """Return once no flush runs (before the files are fsynced or closed)."""
        self._stopping = True
        self._due.set()
        thread = self._thread
        if thread is not None and threading.current_thread() is not thread:  # __del__ may
            thread.join()  # run on it

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._stopping:
                return
            for fd in self._fds:
                try:
                    os.fdatasync(fd)
                except OSError:  # the fsync before publishing reports it
                    return


def _written_whole(path: Path, checksums: np.ndarray) -> int:
    """A new file holding ``checksums``' bytes; its descriptor, for the publisher's fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(checksums).cast("B")
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])
    return fd


def _checksums_of(folder: Path, records: int) -> np.ndarray:
    """A ready entry's checksums (its size was checked by flat_ready)."""
    checksums = np.fromfile(folder / CHECKSUM_FILE, CHECKSUM_DTYPE)
    if len(checksums) != records:  # changed since flat_ready looked
        raise CacheDamagedError(
            f"disk cache file {folder / CHECKSUM_FILE} holds {len(checksums)} checksums, not "
            f"one per pair ({records}); run `tfshards cache clear` on the dataset and read again"
        )
    return checksums


def _opened_for_reading(folder: Path, *, unbuffered: bool) -> list[int]:
    """The ready files, opened for reads of single pairs (no read-ahead past them); past
    the page cache when ``unbuffered`` (an entry read from the disk each epoch) and the
    file system allows (direct_reads.py)."""
    descriptors = []
    for name in FLAT_FILES:
        fd = open_unbuffered(folder / name) if unbuffered else None
        fd = os.open(folder / name, os.O_RDONLY) if fd is None else fd
        # Also when direct: it holds if the file system refuses that at the first read.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        descriptors.append(fd)
    return descriptors


def _ask_for_rows(fd: int, indices: np.ndarray, size: int) -> None:
    """Start reading every pair of a batch from the disk at once, so the reads in order
    that follow wait for a queue of them, not for one at a time: on one VM's disk,
    shuffled 1 MiB reads ran 0.34x an in-order read with one in flight and 0.94x with
    four (benchmarks/studies/hardware_bounds.py)."""
    for index in indices:
        os.posix_fadvise(fd, int(index) * size, size, os.POSIX_FADV_WILLNEED)


def flat_ready(folder: Path, records: int, shape: tuple[int, int, int]) -> bool:
    """Whether ``folder`` holds every file of an entry at its size (checksums included)."""
    names = (*FLAT_FILES, CHECKSUM_FILE)
    sizes = (*flat_sizes(records, shape), records * CHECKSUM_DTYPE.itemsize)
    return all(
        (folder / name).is_file() and (folder / name).stat().st_size == size
        for name, size in zip(names, sizes, strict=True)
    )
