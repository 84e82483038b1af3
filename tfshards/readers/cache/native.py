"""Decoded uint8 pairs of many sizes by record index, for the ordered reader: RAM or disk.

The store of records that differ in size (crops, pads and batches of one read them,
and cut them after, as a fixed-size store's records are cut). A disk entry is the flat
store's files (store.py) without a fixed row size:

    pairs.image   each pair's image pixels (H x W x C, row-major), one after another
    pairs.mask    each pair's mask pixels (H x W)
    pairs.index   [records, 4] little-endian int64: image offset, mask offset, H, W
    pairs.crc32   [records] little-endian uint32: each pair's CRC, as store.py's

Pairs are appended in the order their batches are decoded, so the index says where
each lies; the pixel files hold nothing else (their sizes are the index's sums, checked
when the entry is opened). Built, checked, published and removed when damaged as the
fixed-size entry is (store.py); a pair's CRC is checked each time it is read.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tfshards.readers.cache.entry import DiskCache
from tfshards.readers.cache.store import (
    CHECKSUM_DTYPE,
    CHECKSUM_FILE,
    FLAT_FILES,
    CacheDamagedError,
    EntryFiles,
    Flusher,
    Publisher,
    _crc32_at,
    _written_whole,
    damaged_message,
    discard_ready,
    flushed_while_built,
)

INDEX_FILE = "pairs.index"
INDEX_DTYPE = np.dtype("<i8")
Pair = tuple[np.ndarray, np.ndarray]


def pair_crc(index: int, image: np.ndarray, mask: np.ndarray) -> int:
    """store.py's CRC of one pair (C-contiguous arrays): of its image's bytes then its
    mask's, from its index; ISA-L's where installed (zlib's: a millisecond per 700x700
    RGB pair, more than the rest of its read)."""
    extend = _crc32_at()
    if extend is None:
        return zlib.crc32(mask.data, zlib.crc32(image.data, index & 0xFFFFFFFF))
    crc = extend(index & 0xFFFFFFFF, image.ctypes.data, image.nbytes)
    return extend(crc, mask.ctypes.data, mask.nbytes)


def native_ready(folder: Path, records: int, channels: int) -> bool:
    """Whether ``folder`` holds a whole entry: an index and checksums of ``records``
    pairs, and pixel files of the sizes the index sums to."""
    try:
        index = _index_of(folder, records)
        checksums = (folder / CHECKSUM_FILE).stat().st_size
        files = [(folder / name).stat().st_size for name in FLAT_FILES]
    except (OSError, CacheDamagedError):
        return False
    pixels = int(np.sum(index[:, 2] * index[:, 3]))
    return files == [pixels * channels, pixels] and checksums == records * CHECKSUM_DTYPE.itemsize


def _index_of(folder: Path, records: int) -> np.ndarray:
    index = np.fromfile(folder / INDEX_FILE, INDEX_DTYPE)
    if index.size != records * 4:
        raise CacheDamagedError(f"{folder / INDEX_FILE} does not index {records} pairs")
    return index.reshape(records, 4)


class NativeStore(EntryFiles):
    """``records`` decoded pairs of many sizes with ``channels`` image channels; RAM when
    ``cache`` is None, else its entry. ``read`` gives lists of arrays of their own size."""

    def __init__(
        self,
        records: int,
        channels: int,
        cache: DiskCache | None = None,
        unchanged: Callable[[], None] | None = None,
    ) -> None:
        self.records, self.channels, self.cache, self.unchanged = (
            records,
            channels,
            cache,
            unchanged,
        )
        self._lock = threading.Lock()
        self._pairs: list[Pair | None] | None = None  # RAM
        self._written: np.ndarray | None = None
        self._index: np.ndarray | None = None  # disk: [records, 4] as INDEX_FILE
        self._checksums: np.ndarray | None = None
        self._folder: Path | None = None
        self._files: list[int] | None = None
        self._ends = [0, 0]  # where the next image and mask go in the building files
        self._flusher: Flusher | None = None
        self._publisher: Publisher | None = None
        self._published: list[int] | None = None
        self._closed = False
        self.ready = False
        if cache is not None and native_ready(cache.ready, records, channels):
            self._open(cache.ready)

    def _open(self, folder: Path) -> None:
        self._index = _index_of(folder, self.records)
        self._checksums = np.fromfile(folder / CHECKSUM_FILE, CHECKSUM_DTYPE)
        self._published = [os.open(folder / name, os.O_RDONLY) for name in FLAT_FILES]
        self.ready = True

    def read(self, indices: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The pairs at ``indices`` (the store must be ready), each at its own size."""
        if self._published is None:
            pairs = [self._pairs[int(i)] for i in indices]
            return [p[0] for p in pairs], [p[1] for p in pairs]
        images, masks, wrong = [], [], []
        for index in np.asarray(indices).tolist():
            image_at, mask_at, height, width = (int(n) for n in self._index[index])
            image = np.empty((height, width, self.channels), np.uint8)
            mask = np.empty((height, width, 1), np.uint8)
            self._read_row(self._published[0], image, image_at, FLAT_FILES[0])
            self._read_row(self._published[1], mask, mask_at, FLAT_FILES[1])
            if pair_crc(index, image, mask) != self._checksums[index]:
                wrong.append(index)
            images.append(image)
            masks.append(mask)
        if wrong:
            with self._lock:
                removed = discard_ready(self.cache, self._published[0])
            raise CacheDamagedError(damaged_message(self.cache, sorted(wrong), removed))
        return images, masks

    def write(self, indices: np.ndarray, images: list, masks: list) -> None:
        """Keep decoded pairs; publish (disk) or mark ready (RAM) once all are kept."""
        with self._lock:
            if self.ready or self._closed:
                return
            if self._written is None:
                self._start()
            for index, image, mask in zip(np.asarray(indices).tolist(), images, masks, strict=True):
                image, mask = np.ascontiguousarray(image), np.ascontiguousarray(mask)
                if self._files is None:
                    self._pairs[index] = (image, mask.reshape(*mask.shape[:2], 1))
                elif not self._written[index]:
                    self._append(index, image, mask)
                self._written[index] = True
            if self._written.all():
                self._finish()

    def _append(self, index: int, image: np.ndarray, mask: np.ndarray) -> None:
        at = list(self._ends)
        for k, (fd, pixels) in enumerate(zip(self._files, (image, mask), strict=True)):
            os.pwrite(fd, pixels.data, at[k])
            self._ends[k] += pixels.nbytes
        self._index[index] = (at[0], at[1], image.shape[0], image.shape[1])
        self._checksums[index] = pair_crc(index, image, mask)
        self._flusher.wrote(image.nbytes + mask.nbytes)

    def _start(self) -> None:
        self._written = np.zeros(self.records, bool)
        if self.cache is None:
            self._pairs = [None] * self.records
            return
        self._folder = self.cache.new_building_folder()
        self._folder.mkdir(parents=True)
        self._index = np.zeros((self.records, 4), INDEX_DTYPE)
        self._checksums = np.zeros(self.records, CHECKSUM_DTYPE)
        self._files = [
            os.open(self._folder / name, os.O_RDWR | os.O_CREAT, 0o644) for name in FLAT_FILES
        ]
        # Sizes are unknown before decoding: flushed as written, as a large entry is.
        self._flusher = Flusher(self._files, write_behind=flushed_while_built(2**62))

    def _finish(self) -> None:
        if self.cache is None:
            self.ready = True
            return
        if self.unchanged is not None:
            self.unchanged()  # raises: the build never publishes a mix of two datasets
        folder = self._folder
        files = [
            *self._files,
            _written_whole(folder / INDEX_FILE, self._index),
            _written_whole(folder / CHECKSUM_FILE, self._checksums),
        ]
        flusher, self._folder, self._files, self._flusher = self._flusher, None, None, None
        self._published = [os.open(folder / name, os.O_RDONLY) for name in FLAT_FILES]
        self._written = None
        self.ready = True
        self._publisher = Publisher(folder, files, flusher, self.cache)
