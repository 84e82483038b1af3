"""Compact tables of names and pairs: the conversion plan for millions of pairs.

A Python ``Pair`` with two ``Path`` objects takes about 0.7 KB; ten million of
them would need 7 GB before a shard is written. Here the keys and the file names
(relative to the image and mask folders) sit in UTF-8 buffers with one int64
offset per string, so a pair costs its characters plus 24 bytes. ``Pair`` objects
are made one at a time, when a worker reads the pair.

Strings are stored as UTF-8 with ``surrogatepass``: file names that are not valid
UTF-8 (kept by Python as lone surrogates) round-trip exactly, and byte order equals
Python's ``str`` order, so sorting the bytes sorts the names as ``sorted()`` would.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfshards import storage
from tfshards.storage import Location

_CODEC = ("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Pair:
    key: str
    image: Location  # a Path, or a URL string for inputs in a bucket
    mask: Location


def encode_name(text: str) -> bytes:
    return text.encode(*_CODEC)


def decode_name(data: bytes) -> str:
    return data.decode(*_CODEC)


def _joined(root: Location | None, name: str) -> Location:
    """``root/name``; with no root, ``name`` is a whole path or URL."""
    if root is not None:
        return storage.join(root, name)
    return name if storage.is_url(name) else Path(name)


class Strings:
    """Strings in one byte buffer; ``offsets[i]:offsets[i + 1]`` is string ``i``."""

    __slots__ = ("data", "offsets")

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self.data = data  # uint8
        self.offsets = offsets  # int64, len + 1

    @classmethod
    def from_fixed(cls, fixed: np.ndarray) -> Strings:
        """From a NumPy bytes array (dtype ``S``) of encoded names (no NUL bytes)."""
        lengths = np.char.str_len(fixed).astype(np.int64) if fixed.size else np.zeros(0, np.int64)
        offsets = np.zeros(len(fixed) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        width = fixed.dtype.itemsize
        if not fixed.size or not width:
            return cls(np.zeros(0, np.uint8), offsets)
        grid = np.ascontiguousarray(fixed).view(np.uint8).reshape(len(fixed), width)
        return cls(grid[np.arange(width) < lengths[:, None]], offsets)

    @classmethod
    def from_list(cls, items: Iterable[str]) -> Strings:
        encoded = [encode_name(item) for item in items]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(item) for item in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> str:
        start, end = self.offsets[index], self.offsets[index + 1]
        return decode_name(self.data[start:end].tobytes())

    def take(self, rows: np.ndarray) -> Strings:
        """A new compact table of the strings at ``rows``, in that order."""
        starts = self.offsets[rows]
        lengths = self.offsets[rows + 1] - starts
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Strings(self.data[gather], offsets)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.offsets.nbytes


class PairTable(Sequence[Pair]):
    """Pairs in key order: keys, image and mask names relative to two folders (or URLs).

    Roots are None when the names are whole paths or URLs (:meth:`from_pairs`).
    ``rows`` (optional) selects and orders pairs of the tables it shares, without a
    copy; pickling (as when a shard is sent to a worker) sends only those pairs.

    >>> table = PairTable.from_pairs([Pair("a", Path("i/a.png"), Path("m/a.png"))])
    >>> table[0].mask
    PosixPath('m/a.png')
    """

    def __init__(
        self,
        images_root: Location | None,
        masks_root: Location | None,
        keys: Strings,
        images: Strings,
        masks: Strings,
        rows: np.ndarray | None = None,
    ) -> None:
        self.images_root, self.masks_root = images_root, masks_root
        self.keys, self.images, self.masks = keys, images, masks
        self.rows = rows

    @classmethod
    def from_pairs(cls, pairs: Iterable[Pair]) -> PairTable:
        """From Pair objects (any order; the table is sorted by key, stably)."""
        ordered = sorted(pairs, key=lambda p: p.key)
        return cls(
            None,
            None,
            Strings.from_list(p.key for p in ordered),
            Strings.from_list(str(p.image) for p in ordered),
            Strings.from_list(str(p.mask) for p in ordered),
        )

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.keys)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.subset(np.arange(len(self))[index])
        if not -len(self) <= index < len(self):
            raise IndexError(f"pair {index} of {len(self)}")
        row = int(self.rows[index]) if self.rows is not None else index % len(self)
        return Pair(
            self.keys[row],
            _joined(self.images_root, self.images[row]),
            _joined(self.masks_root, self.masks[row]),
        )

    def __iter__(self) -> Iterator[Pair]:
        return (self[i] for i in range(len(self)))

    def key(self, index: int) -> str:
        return self.keys[int(self.rows[index]) if self.rows is not None else index]

    def subset(self, rows: np.ndarray) -> PairTable:
        """The pairs at ``rows`` (positions in this table), sharing this table's buffers."""
        rows = np.asarray(rows, np.int64)
        base = self.rows[rows] if self.rows is not None else rows
        return PairTable(
            self.images_root, self.masks_root, self.keys, self.images, self.masks, base
        )

    def compact(self) -> PairTable:
        """A table holding only this one's pairs."""
        if self.rows is None:
            return self
        return PairTable(
            self.images_root,
            self.masks_root,
            self.keys.take(self.rows),
            self.images.take(self.rows),
            self.masks.take(self.rows),
        )

    def __reduce__(self):
        table = self.compact()
        return (
            PairTable,
            (table.images_root, table.masks_root, table.keys, table.images, table.masks),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PairTable):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # mutable-looking arrays inside: not hashable

    def __repr__(self) -> str:
        return f"PairTable({len(self)} pairs from {self.images_root}, {self.masks_root})"

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays behind this table (shared ones included)."""
        own = self.rows.nbytes if self.rows is not None else 0
        return own + self.keys.nbytes + self.images.nbytes + self.masks.nbytes


def release_freed_memory() -> None:
    """Hand the pages freed by listing and pairing back to the OS (glibc only).

    Sorting millions of names frees arrays of tens of MB; glibc keeps such memory in the
    heap after its mmap threshold has grown, so without this the launching process would
    hold about 270 bytes per pair through the conversion instead of the plan's ~75.
    """
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)
