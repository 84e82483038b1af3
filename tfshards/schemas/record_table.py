"""The per-record table: what each record of a split holds, known without decoding it.

One row per record, in the split's manifest order (shard by shard, record by record):

    key               the pair's key
    height, width     the record's size in pixels
    ignored pixels    mask pixels at the manifest's ignore_label
    class entries     for each class present (ascending; the ignore_label is no class):
                      (class, pixel count, cells), where ``cells`` is a 16-bit mask of the
                      GRID x GRID cells of the record in which the class appears: pixel
                      (y, x) of an H x W record lies in cell ``row * GRID + column`` with
                      ``row = y * GRID // H`` and ``column = x * GRID // W``, and sets
                      that bit; enough to centre a crop on the class

Class entries are stored sparsely (compressed sparse rows): a record with 4 classes of 20
costs 4 entries, not 20 counts, so 10M records fit in well under 1 GB. Integer columns take
the smallest unsigned type that holds their values.

File layout (``<split>.records``, written beside the shards before the manifest, which
lists it with its size and sha256): the magic line ``tfshards-records 1\n``, a
little-endian uint32 header length, a UTF-8 JSON header (sorted keys) ``{"records",
"num_classes", "grid", "columns": [{"name", "dtype", "length"}]}``, then each column's
bytes, little-endian, in header order, without padding:

    key_ends        the end of each key in key_bytes (its start: the previous end, or 0)
    key_bytes       the keys, UTF-8 (``surrogatepass``: file names that are not UTF-8
                    round-trip), one after another
    heights, widths, ignored_pixels    one value per record
    class_ends      the end of each record's class entries (its start: the previous end)
    class_ids, class_counts            one value per class entry
    class_cells     uint16, one per class entry

``num_classes`` is the manifest's: ``--num-classes`` where given, else the largest class
present in the split + 1 (the length of the split's ``class_pixels``). No timestamps: the
same records give the same bytes on every runner (local, Beam, into a bucket), and a
table built later from the masks (``tfshards.records()`` on a dataset converted before
tables) gives the bytes the conversion would have written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfshards.errors import RecordTableError
from tfshards.schemas.format import COMPRESSIONS
from tfshards.schemas.manifest import SplitInfo
from tfshards.schemas.record import decode_mask
from tfshards.schemas.tfrecord import RecordError, iter_records, parse_example

GRID = 4  # cells per side of a record in which each class's presence is kept
CELLS = GRID * GRID  # bits of a class entry's ``cells`` (uint16)
_CELL_BITS = 1 << np.arange(CELLS, dtype=np.int64)
MAGIC = b"tfshards-records 1\n"
_CODEC = ("utf-8", "surrogatepass")
_COLUMNS = (
    "key_ends",
    "key_bytes",
    "heights",
    "widths",
    "ignored_pixels",
    "class_ends",
    "class_ids",
    "class_counts",
    "class_cells",
)


def smallest_unsigned(values: np.ndarray) -> np.ndarray:
    """``values`` in the smallest unsigned integer type that holds them all."""
    values = np.asarray(values)
    top = int(values.max()) if values.size else 0
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if top <= np.iinfo(dtype).max:
            return values.astype(dtype)
    raise ValueError(f"value {top} does not fit 64 bits")


@dataclass(frozen=True)
class RecordRow:
    """One record's entry: built by the converter from the mask it writes."""

    key: str
    height: int
    width: int
    ignored_pixels: int
    class_ids: np.ndarray  # classes present, ascending
    class_counts: np.ndarray  # pixels of each
    class_cells: np.ndarray  # GRID x GRID presence bits of each


def record_row(key: str, mask: np.ndarray, ignore_label: int | None) -> RecordRow:
    """The table's row of one mask (class indices, ``ignore_label`` pixels counted apart).

    One ``bincount`` of ``class * CELLS + cell`` gives both each class's pixels (a row's
    sum) and the cells it appears in (the row's non-zero entries)."""
    mask = np.asarray(mask)
    if mask.ndim == 3:
        mask = mask[..., 0]
    height, width = mask.shape
    codes = mask.astype(np.intp)
    codes *= CELLS
    codes += _cell_of_pixel(height, width)
    classes = int(mask.max(initial=0)) + 1
    hits = np.bincount(codes.ravel(), minlength=classes * CELLS).reshape(classes, CELLS)
    counts = hits.sum(axis=1)
    ignored = 0
    if ignore_label is not None and ignore_label < classes:
        ignored = int(counts[ignore_label])
        counts[ignore_label] = 0
    ids = np.flatnonzero(counts)
    cells = ((hits[ids] > 0) * _CELL_BITS).sum(axis=1).astype(np.uint16)
    return RecordRow(key, height, width, ignored, ids, counts[ids], cells)


@functools.lru_cache(maxsize=8)
def _cell_of_pixel(height: int, width: int) -> np.ndarray:
    """intp [height, width]: the grid cell (``row * GRID + column``) of every pixel."""
    rows = np.minimum(np.arange(height) * GRID // max(height, 1), GRID - 1)
    columns = np.minimum(np.arange(width) * GRID // max(width, 1), GRID - 1)
    cells = (rows[:, None] * GRID + columns[None, :]).astype(np.intp)
    cells.flags.writeable = False
    return cells


class Keys(Sequence[str]):
    """The records' keys, stored as one UTF-8 buffer and where each key ends."""

    def __init__(self, ends: np.ndarray, data: np.ndarray) -> None:
        self._ends, self._data = ends, data

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index):  # noqa: ANN001 - int or slice, as a Sequence takes
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]
        start = int(self._ends[index - 1]) if index else 0
        return self._data[start : int(self._ends[index])].tobytes().decode(*_CODEC)

    def __iter__(self) -> Iterator[str]:
        data, start = self._data.tobytes(), 0
        for end in self._ends.tolist():
            yield data[start:end].decode(*_CODEC)
            start = end

    def positions(self, keys: Iterable[str]) -> np.ndarray:
        """Indices of ``keys`` in this table, in the order given; unknown keys are named.

        Vectorised by key length: the keys of each length are compared as fixed-size
        byte strings (10M keys in about a second), never decoded one by one."""
        wanted = list(keys)
        encoded = [key.encode(*_CODEC) for key in wanted]
        where = np.full(len(wanted), -1, np.int64)
        ends = self._ends.astype(np.int64)
        starts = np.concatenate([[0], ends[:-1]])
        lengths = ends - starts
        for length in sorted({len(key) for key in encoded}):
            asked = [k for k, key in enumerate(encoded) if len(key) == length]
            found = _find_fixed(self._data, starts, lengths, length, [encoded[k] for k in asked])
            where[asked] = found
        missing = [key for key, index in zip(wanted, where, strict=True) if index < 0]
        if missing:
            shown = ", ".join(repr(key) for key in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise RecordTableError(f"{len(missing)} keys are not in this split: {shown}{more}")
        return where


def _find_fixed(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, length: int, keys: list[bytes]
) -> np.ndarray:
    """Index of each of ``keys`` (all ``length`` bytes) among the table's keys, -1 if absent."""
    candidates = np.flatnonzero(lengths == length)
    if not candidates.size:
        return np.full(len(keys), -1, np.int64)
    if length == 0:  # keys are unique in a split: at most one is empty
        return np.full(len(keys), candidates[0], np.int64)
    rows = data[starts[candidates, None] + np.arange(length)]
    table = np.ascontiguousarray(rows).view(f"S{length}").ravel()
    order = np.argsort(table, kind="stable")
    asked = np.array(keys, dtype=f"S{length}")
    at = np.minimum(np.searchsorted(table[order], asked), len(order) - 1)
    hit = table[order][at] == asked
    return np.where(hit, candidates[order[at]], -1)


class ClassPixels:
    """Pixels of each class in each record, indexed like a ``[records, classes]`` array."""

    def __init__(self, table: RecordTable) -> None:
        self._table = table

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self._table), self._table.num_classes)

    def __len__(self) -> int:
        return len(self._table)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:  # noqa: ANN001 - NumPy's protocol
        dense = np.zeros(self.shape, np.int64)
        table = self._table
        dense[table.entry_records(), table.class_ids.astype(np.int64)] = table.class_counts
        return dense if dtype is None else dense.astype(dtype)

    def __getitem__(self, index) -> np.ndarray:  # noqa: ANN001 - any NumPy index
        if isinstance(index, tuple) and len(index) == 2 and isinstance(index[1], int | np.integer):
            return self.column(int(index[1]))[index[0]]
        return np.asarray(self)[index]

    def column(self, klass: int) -> np.ndarray:
        """Pixels of class ``klass`` in every record (int64 [records])."""
        table = self._table
        out = np.zeros(len(table), np.int64)
        hit = table.class_ids == klass
        out[table.entry_records()[hit]] = table.class_counts[hit]
        return out


@dataclass(frozen=True, eq=False)
class RecordTable:
    """A split's per-record table (see the module docstring); ``tfshards.records()`` loads it.

    ``len(table)`` records in the split's manifest order; ``table.keys[i]`` the keys;
    ``table.heights``, ``table.widths``, ``table.ignored_pixels`` one value per record;
    ``table.class_pixels`` indexed like an int64 ``[records, num_classes]`` array
    (``np.asarray`` makes it one); ``presence(c)``, ``records_with(c)`` and
    ``cells(i, c)`` where class ``c`` is; ``row(i)`` one record's entry.
    """

    key_ends: np.ndarray
    key_bytes: np.ndarray
    heights: np.ndarray
    widths: np.ndarray
    ignored_pixels: np.ndarray
    class_ends: np.ndarray  # class entries of record i: [class_ends[i-1], class_ends[i])
    class_ids: np.ndarray
    class_counts: np.ndarray
    class_cells: np.ndarray
    num_classes: int
    grid: int = GRID

    def __post_init__(self) -> None:
        records = len(self.key_ends)
        for name in ("heights", "widths", "ignored_pixels", "class_ends"):
            if len(getattr(self, name)) != records:
                raise RecordTableError(
                    f"column {name} has {len(getattr(self, name))} rows, not {records}"
                )
        entries = int(self.class_ends[-1]) if records else 0
        for name in ("class_ids", "class_counts", "class_cells"):
            if len(getattr(self, name)) != entries:
                raise RecordTableError(
                    f"column {name} has {len(getattr(self, name))} entries, not {entries}"
                )
        if entries and int(self.class_ids.max()) >= self.num_classes:
            raise RecordTableError(f"a class id is >= num_classes={self.num_classes}")
        if self.grid != GRID:
            raise RecordTableError(f"a grid of {self.grid} cells a side, not {GRID}")
        for name, total in (("key_ends", len(self.key_bytes)), ("class_ends", entries)):
            ends = getattr(self, name).astype(np.int64)
            if records and (np.any(np.diff(ends) < 0) or ends[0] < 0 or ends[-1] != total):
                raise RecordTableError(f"column {name} does not run from 0 to {total}")

    def __len__(self) -> int:
        return len(self.key_ends)

    @property
    def keys(self) -> Keys:
        return Keys(self.key_ends, self.key_bytes)

    @property
    def class_pixels(self) -> ClassPixels:
        return ClassPixels(self)

    @property
    def nbytes(self) -> int:
        """Bytes the table's columns take in memory."""
        return sum(getattr(self, name).nbytes for name in _COLUMNS)

    def entry_records(self) -> np.ndarray:
        """The record of every class entry (int64 [entries])."""
        per_record = np.diff(self.class_ends.astype(np.int64), prepend=0)
        return np.repeat(np.arange(len(self), dtype=np.int64), per_record)

    def presence(self, klass: int) -> np.ndarray:
        """bool [records]: which records hold pixels of class ``klass``."""
        self._check_class(klass)
        out = np.zeros(len(self), bool)
        out[self.entry_records()[self.class_ids == klass]] = True
        return out

    def records_with(self, klass: int) -> np.ndarray:
        """Indices of the records that hold class ``klass``, ascending."""
        self._check_class(klass)
        return np.unique(self.entry_records()[self.class_ids == klass])

    def _check_class(self, klass: int) -> None:
        if isinstance(klass, bool) or not isinstance(klass, int | np.integer):
            raise RecordTableError(f"a class is an integer index, got {klass!r}")
        if not 0 <= klass < self.num_classes:
            raise RecordTableError(
                f"class {klass} is not one of this table's {self.num_classes} classes "
                f"(0..{self.num_classes - 1})"
            )

    def cells(self, record: int, klass: int) -> int:
        """GRID x GRID presence bits of class ``klass`` in record ``record`` (0: absent)."""
        start = int(self.class_ends[record - 1]) if record else 0
        ids = self.class_ids[start : int(self.class_ends[record])]
        hit = np.flatnonzero(ids == klass)
        return int(self.class_cells[start + hit[0]]) if hit.size else 0

    def row(self, record: int) -> RecordRow:
        """Record ``record``'s row, as :func:`record_row` computes it from the mask."""
        start = int(self.class_ends[record - 1]) if record else 0
        end = int(self.class_ends[record])
        return RecordRow(
            self.keys[record],
            int(self.heights[record]),
            int(self.widths[record]),
            int(self.ignored_pixels[record]),
            self.class_ids[start:end].astype(np.int64),
            self.class_counts[start:end].astype(np.int64),
            self.class_cells[start:end],
        )

    def class_totals(self) -> np.ndarray:
        """int64 [num_classes]: the pixels of each class over all records."""
        weights = self.class_counts.astype(np.float64)  # exact below 2**53 pixels
        totals = np.bincount(self.class_ids, weights=weights, minlength=self.num_classes)
        return totals.astype(np.int64)

    @classmethod
    def concatenated(cls, tables: Sequence[RecordTable], num_classes: int) -> RecordTable:
        """The rows of ``tables`` one after another, as one table of ``num_classes``
        classes; the same bytes as :meth:`from_rows` of all their rows."""

        def joined(name: str, ends: bool = False) -> np.ndarray:
            parts = [getattr(table, name).astype(np.int64) for table in tables]
            if ends:  # each table's ends continue from the previous table's last
                shifts = np.cumsum([0] + [int(p[-1]) if len(p) else 0 for p in parts[:-1]])
                parts = [part + shift for part, shift in zip(parts, shifts, strict=True)]
            return smallest_unsigned(np.concatenate(parts) if parts else np.zeros(0, np.int64))

        return cls(
            key_ends=joined("key_ends", ends=True),
            key_bytes=np.concatenate([t.key_bytes for t in tables] or [np.zeros(0, np.uint8)]),
            heights=joined("heights"),
            widths=joined("widths"),
            ignored_pixels=joined("ignored_pixels"),
            class_ends=joined("class_ends", ends=True),
            class_ids=joined("class_ids"),
            class_counts=joined("class_counts"),
            class_cells=np.concatenate(
                [t.class_cells for t in tables] or [np.zeros(0, np.uint16)]
            ).astype(np.uint16),
            num_classes=num_classes,
        )

    @classmethod
    def from_rows(cls, rows: Iterable[RecordRow], num_classes: int) -> RecordTable:
        rows = list(rows)
        keys = [row.key.encode(*_CODEC) for row in rows]
        lengths = np.array([len(key) for key in keys], np.int64)
        per_record = np.array([len(row.class_ids) for row in rows], np.int64)

        def joined(name: str) -> np.ndarray:
            parts = [getattr(row, name) for row in rows]
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)

        return cls(
            key_ends=smallest_unsigned(np.cumsum(lengths)),
            key_bytes=np.frombuffer(b"".join(keys), np.uint8),
            heights=smallest_unsigned(np.array([row.height for row in rows], np.int64)),
            widths=smallest_unsigned(np.array([row.width for row in rows], np.int64)),
            ignored_pixels=smallest_unsigned(
                np.array([row.ignored_pixels for row in rows], np.int64)
            ),
            class_ends=smallest_unsigned(np.cumsum(per_record)),
            class_ids=smallest_unsigned(joined("class_ids")),
            class_counts=smallest_unsigned(joined("class_counts")),
            class_cells=joined("class_cells").astype(np.uint16),
            num_classes=num_classes,
        )

    def to_bytes(self) -> bytes:
        columns = [(name, np.ascontiguousarray(getattr(self, name))) for name in _COLUMNS]
        header = {
            "records": len(self),
            "num_classes": self.num_classes,
            "grid": self.grid,
            "columns": [
                {"name": n, "dtype": a.dtype.newbyteorder("<").str, "length": len(a)}
                for n, a in columns
            ],
        }
        text = json.dumps(header, sort_keys=True).encode()
        body = b"".join(a.astype(a.dtype.newbyteorder("<")).tobytes() for _, a in columns)
        return MAGIC + struct.pack("<I", len(text)) + text + body

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> RecordTable:
        try:
            return _parsed(data)
        except (ValueError, KeyError, TypeError, struct.error, RecordTableError) as exc:
            raise RecordTableError(f"{where}: not a readable per-record table ({exc})") from exc


def _parsed(data: bytes) -> RecordTable:
    if not data.startswith(MAGIC):
        raise ValueError("it does not start with the table's magic line")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(data[start : start + length])
    offset, columns = start + length, {}
    for column in header["columns"]:
        dtype = np.dtype(column["dtype"])
        size = dtype.itemsize * int(column["length"])
        if offset + size > len(data):
            raise ValueError(f"column {column['name']} is cut short")
        columns[column["name"]] = np.frombuffer(data, dtype, int(column["length"]), offset)
        offset += size
    if offset != len(data):
        raise ValueError(f"{len(data) - offset} bytes follow the last column")
    missing = set(_COLUMNS) - set(columns)
    if missing:
        raise ValueError(f"columns missing: {sorted(missing)}")
    return RecordTable(**columns, num_classes=int(header["num_classes"]), grid=header["grid"])


def shard_rows(
    path: Path, compression_name: str, ignore_label: int | None, where: str | None = None
) -> Iterator[RecordRow]:
    """The rows of one local shard's records, in order: a pass over its masks (images
    are not decoded). RecordTableError names the shard (``where``, default ``path``) and
    the record that fails."""
    found = 0
    try:
        with COMPRESSIONS[compression_name].open(path) as stream:
            for data in iter_records(stream):
                key, mask = decode_mask(parse_example(data))
                yield record_row(key, mask, ignore_label)
                found += 1
    except (ValueError, OSError, EOFError, RecordError) as exc:
        raise RecordTableError(
            f"{where or path}: record {found} cannot be read for the per-record table ({exc})"
        ) from exc


def check_against(table: RecordTable, split: SplitInfo, where: str) -> RecordTable:
    """``table`` if it agrees with its split in the manifest (record count, classes, each
    class's pixels and the ignored pixels), else RecordTableError naming ``where``."""
    problem = None
    if len(table) != split.records:
        problem = f"{len(table)} rows, but the manifest's split has {split.records} records"
    elif table.num_classes != len(split.class_pixels):
        problem = (
            f"{table.num_classes} classes, but the manifest's split counts "
            f"{len(split.class_pixels)}"
        )
    elif table.class_totals().tolist() != list(split.class_pixels):
        problem = "its pixels per class differ from the manifest's class_pixels"
    elif int(table.ignored_pixels.sum(dtype=np.int64)) != split.ignored_pixels:
        problem = "its ignored pixels differ from the manifest's ignored_pixels"
    if problem is not None:
        raise RecordTableError(f"{where}: {problem} (a table of another dataset?)")
    return table


def table_from_bytes(data: bytes, info: SplitInfo, where: str) -> RecordTable:
    """The table in ``data``, read from the file the manifest lists as ``info.record_table``,
    if its size, sha256 and contents agree with the manifest; else RecordTableError."""
    listed = info.record_table
    if len(data) != listed.bytes:
        raise RecordTableError(
            f"{where}: {len(data)} bytes, the manifest says {listed.bytes} (truncated or replaced)"
        )
    if hashlib.sha256(data).hexdigest() != listed.sha256:
        raise RecordTableError(f"{where}: sha256 differs from the manifest (damaged or replaced)")
    return check_against(RecordTable.from_bytes(data, where=where), info, where)
