"""Random access into uncompressed TFRecord shards: where each record starts, and one
record read by its offset with both CRCs checked.

TFRecord has no index of its own. A shard's offsets come from its ``.idx`` file
(``convert --index``: ``<offset> <length>`` per record, the format of DALI's
``tfrecord2idx``) or from a scan of its record headers: 12 bytes read per record and
the data skipped by seeking, so a scan reads a few hundred bytes per MB of shard.
Scanned offsets are kept in the user cache folder, keyed by the shard's sha256, never
written into the dataset (which may be read-only, or shared): ``<sha256>.npz`` (NumPy's
zip of ``starts`` and ``file_bytes``, whose CRC-32 catches a damaged file). Kept offsets
that do not load, or disagree with the shard's size or record count, are the cache's
fault, not the dataset's: a warning names the file, it is removed and the shard is
scanned again.

Compressed (gzip/zlib) shards have no offsets into their bytes; readers by index inflate
them first (``sources/inflated.py``).
"""

from __future__ import annotations

import contextlib
import encodings.cp437  # noqa: F401 - see below
import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfshards.direct_reads import read_span, unbuffered
from tfshards.schemas.format import index_path
from tfshards.schemas.tfrecord import RecordError, crc32c_at, mask_crc, masked_crc32c

HEADER_BYTES = 12  # uint64 length, uint32 masked CRC of the length
FOOTER_BYTES = 4  # uint32 masked CRC of the data
KEPT_SUFFIX = ".npz"
# zipfile decodes the kept files' member names with cp437, a codec otherwise imported on
# first use: by a reader thread, which may hold its import lock when another thread
# forks, and the child that needs the codec then waits for that lock for ever (seen).
log = logging.getLogger("tfshards")


@dataclass(frozen=True)
class RecordOffsets:
    """Start and framed length (header + data + footer) of every record of one shard."""

    starts: np.ndarray  # int64 [records]
    lengths: np.ndarray  # int64 [records]

    def __len__(self) -> int:
        return len(self.starts)

    @classmethod
    def from_starts(cls, starts: np.ndarray, file_bytes: int) -> RecordOffsets:
        starts = np.asarray(starts, np.int64)
        ends = np.append(starts[1:], np.int64(file_bytes))
        return cls(starts, ends - starts)


def load_index(path: Path, file_bytes: int) -> RecordOffsets:
    """Offsets from an ``.idx`` file, checked against the shard's size."""
    try:
        table = np.loadtxt(path, dtype=np.int64, ndmin=2)
    except ValueError as exc:
        raise RecordError(f"{path}: not an index file ('<offset> <length>' lines): {exc}") from exc
    if table.size == 0:
        return RecordOffsets(np.zeros(0, np.int64), np.zeros(0, np.int64))
    starts, lengths = table[:, 0], table[:, 1]
    if starts[0] != 0 or np.any(starts[1:] != starts[:-1] + lengths[:-1]):
        raise RecordError(f"{path}: offsets do not follow one another; the index is damaged")
    if starts[-1] + lengths[-1] != file_bytes:
        raise RecordError(
            f"{path}: the index ends at byte {starts[-1] + lengths[-1]} but its shard has "
            f"{file_bytes} bytes; the index belongs to another version of the shard"
        )
    return RecordOffsets(starts, lengths)


def scan_offsets(path: Path) -> RecordOffsets:
    """Offsets found by reading each record's header and seeking past its data."""
    starts: list[int] = []
    with open(path, "rb", buffering=0) as stream:
        size = os.fstat(stream.fileno()).st_size
        position = 0
        while position < size:
            header = os.pread(stream.fileno(), HEADER_BYTES, position)
            length = _checked_length(header, path, len(starts))
            starts.append(position)
            position += HEADER_BYTES + length + FOOTER_BYTES
        if position != size:
            raise RecordError(f"{path}: record {len(starts) - 1} is truncated")
    return RecordOffsets.from_starts(np.array(starts, np.int64), size)


def shard_offsets(
    path: Path,
    sha256: str,
    file_bytes: int,
    keep_in: Path | None,
    *,
    records: int | None = None,
) -> RecordOffsets:
    """The offsets of one uncompressed shard of ``file_bytes`` bytes (``records`` records,
    when known): its ``.idx``, kept offsets that agree with it, or a scan (kept under
    ``keep_in`` when given, as ``<sha256>.npz``)."""
    index = index_path(path)
    if index.is_file():
        return load_index(index, file_bytes)
    kept = keep_in / f"{sha256}{KEPT_SUFFIX}" if keep_in is not None else None
    if kept is not None:
        offsets = _load_kept(kept, file_bytes, records)
        if offsets is not None:
            return offsets
    offsets = scan_offsets(path)
    if kept is not None:
        _keep(kept, offsets.starts, file_bytes)
    return offsets


def forget_kept(sha256: str, keep_in: Path) -> None:
    """Remove the kept offsets of the shard of ``sha256`` (its copy was damaged)."""
    _remove(keep_in / f"{sha256}{KEPT_SUFFIX}")


def _remove(kept: Path) -> None:
    """A kept file that cannot be removed (a read-only cache folder) costs only rescans."""
    with contextlib.suppress(OSError):
        kept.unlink(missing_ok=True)


def _load_kept(kept: Path, file_bytes: int, records: int | None) -> RecordOffsets | None:
    """Kept offsets that agree with the shard; None where there are none (a damaged or
    disagreeing file is named in a warning and removed)."""
    try:
        with np.load(kept) as stored:
            starts, size = stored["starts"], int(stored["file_bytes"])
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a damaged zip fails in many ways
        problem = f"unreadable ({type(exc).__name__}: {exc})"
    else:
        problem = _disagreement(starts, size, file_bytes, records)
        if problem is None:
            return RecordOffsets.from_starts(starts, file_bytes)
    log.warning(
        "%s: kept offsets %s; removed, the shard is scanned again (the dataset is not at "
        "fault: this file is in the user cache folder)",
        kept,
        problem,
    )
    _remove(kept)
    return None


def _disagreement(
    starts: np.ndarray, size: int, file_bytes: int, records: int | None
) -> str | None:
    """How kept ``starts`` (for a file of ``size`` bytes) disagree with a shard of
    ``file_bytes`` bytes and ``records`` records; None if they agree."""
    if starts.ndim != 1 or starts.dtype != np.int64:
        return f"are not a list of int64 offsets ({starts.dtype}, {starts.ndim} dimensions)"
    if size != file_bytes:
        return f"are those of a file of {size} bytes, but the shard has {file_bytes}"
    if records is not None and len(starts) != records:
        return f"list {len(starts)} records, but the manifest says {records}"
    ends = np.append(starts[1:], np.int64(file_bytes))
    if len(starts) and (starts[0] != 0 or np.any(ends - starts < HEADER_BYTES + FOOTER_BYTES)):
        return "do not follow one another"
    if not len(starts) and file_bytes:
        return f"list no record in a shard of {file_bytes} bytes"
    return None


def read_record(fd: int, start: int, length: int, where: str) -> bytes:
    """The data of the record framed at ``start`` (``length`` bytes in all), CRCs checked.

    ``where`` names the record in errors (shard file and record number). The data is
    read on its own (three reads, no slice): a copy of a large record costs more than
    two small system calls."""
    start, length = int(start), int(length)
    size = length - HEADER_BYTES - FOOTER_BYTES
    if unbuffered(fd):  # one aligned read of the whole record (direct_reads.py)
        span = read_span(fd, start, length)
        data = bytes(span[HEADER_BYTES : HEADER_BYTES + max(size, 0)])
        footer = bytes(span[HEADER_BYTES + size : length]) if size >= 0 else b""
        crc = masked_crc32c(data)
        _check_frame(bytes(span[:HEADER_BYTES]), footer, len(span), length, crc, where)
        return data
    header = os.pread(fd, HEADER_BYTES, start)
    data = os.pread(fd, size, start + HEADER_BYTES) if size > 0 else b""
    footer = os.pread(fd, FOOTER_BYTES, start + HEADER_BYTES + size)
    got = len(header) + len(data) + len(footer)
    _check_frame(header, footer, got, length, masked_crc32c(data), where)
    return data


def read_record_into(
    fd: int, start: int, length: int, where: str, parts: Sequence[np.ndarray]
) -> None:
    """:func:`read_record`, with the data landing in ``parts`` (contiguous uint8 arrays
    whose sizes add up to the data's, in the record's order: the caller's layout) by one
    ``preadv``, and its CRC computed where it landed: pixels read into their batch need
    no copy.

    Only where ``tfrecord.crc32c_at()`` is not None (the caller checks)."""
    if unbuffered(fd):
        header, footer, got = _copied_from_span(fd, start, length, where, parts)
    else:
        header, footer = np.empty(HEADER_BYTES, np.uint8), np.empty(FOOTER_BYTES, np.uint8)
        got = os.preadv(fd, [header, *parts, footer], start)
    crc, extend = 0, crc32c_at()
    for part in parts:
        crc = extend(crc, part.ctypes.data, part.nbytes)
    _check_frame(header.tobytes(), footer.tobytes(), got, length, mask_crc(crc), where)


def _copied_from_span(
    fd: int, start: int, length: int, where: str, parts: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, int]:
    """An unbuffered read of a whole record, its data copied into ``parts``: its header,
    footer and the bytes read (a truncated record raises here, before any copy)."""
    span = np.frombuffer(read_span(fd, start, length), np.uint8)
    if len(span) != length or length < HEADER_BYTES + FOOTER_BYTES:
        raise RecordError(f"{where}: truncated ({len(span)} of {length} bytes)")
    at = HEADER_BYTES
    for part in parts:
        np.copyto(part, span[at : at + part.nbytes])
        at += part.nbytes
    return span[:HEADER_BYTES], span[length - FOOTER_BYTES :], len(span)


def _check_frame(
    header: bytes, footer: bytes, got: int, length: int, data_crc: int, where: str
) -> None:
    """A record read whole (``got`` of its ``length`` framed bytes) whose header agrees
    with its length and whose footer holds ``data_crc``, or a RecordError naming it."""
    size = length - HEADER_BYTES - FOOTER_BYTES
    if got != length or size < 0:
        raise RecordError(f"{where}: truncated ({got} of {length} bytes)")
    data_length = _checked_length(header, where, None)
    if data_length != size:
        raise RecordError(f"{where}: its header says {data_length} bytes, its offsets disagree")
    if struct.unpack("<I", footer)[0] != data_crc:
        raise RecordError(f"{where}: data CRC mismatch (corrupt bytes)")


def _checked_length(header: bytes, where: object, index: int | None) -> int:
    at = f"{where}" if index is None else f"{where}: record {index}"
    if len(header) < HEADER_BYTES:
        raise RecordError(f"{at}: truncated header ({len(header)} of {HEADER_BYTES} bytes)")
    (length,) = struct.unpack("<Q", header[:8])
    if struct.unpack("<I", header[8:HEADER_BYTES])[0] != masked_crc32c(header[:8]):
        raise RecordError(f"{at}: length CRC mismatch (corrupt header)")
    return length


def _keep(path: Path, starts: np.ndarray, file_bytes: int) -> None:
    """Write atomically (not flushed to the disk: a file torn by a crash fails its CRC
    and is scanned again); a cache folder that cannot be written only costs a rescan."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as out:
            np.savez(out, starts=starts, file_bytes=np.int64(file_bytes))
        os.replace(tmp, path)
    except OSError:
        pass
