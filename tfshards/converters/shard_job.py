"""Write one planned shard: decode, validate and encode its pairs, in record order.

This runs in worker processes, which import neither TensorFlow nor tqdm.
"""

from __future__ import annotations

import base64
import multiprocessing
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tfshards import storage
from tfshards.converters.image_stats import ChannelSums
from tfshards.converters.options import ConvertOptions
from tfshards.converters.pairing import Pair
from tfshards.converters.planning import ShardSpec
from tfshards.converters.tiling import WHOLE, PairRecord, pair_records
from tfshards.converters.validation import PreparedPair, pair_stage, prepare_pair
from tfshards.converters.writer import ShardWriter
from tfshards.errors import PairError
from tfshards.schemas import deflate
from tfshards.schemas.format import image_encoding, index_path, mask_encoding
from tfshards.schemas.manifest import SkippedPair
from tfshards.schemas.record import EncodedPair
from tfshards.schemas.record_table import RecordRow, RecordTable, record_row
from tfshards.storage import Location, StorageOptions

ProgressCallback = Callable[[int, int], None]  # (pairs done, source bytes read)


@dataclass
class ShardResult:
    file: str
    split: str
    records: int
    bytes: int
    sha256: str
    class_pixels: list[int]
    image_sizes: list[tuple[int, int]]  # distinct (height, width), at most two kept
    skipped: list[SkippedPair] = field(default_factory=list)
    crc32c: str | None = None  # None in a journal written before tfshards had it
    # The shard's rows of the per-record table (schemas/record_table.py), as the base64 of
    # a table's bytes: it travels in the journal (JSON) from any runner. None in a journal
    # written before tfshards had it.
    record_table: str | None = None
    # Exact per-channel counts of the stored images (image_stats.ChannelSums.to_json);
    # None in a journal written before tfshards had them.
    image_stats: dict | None = None
    auto_tiled: int = 0  # images too large for one record, tiled without --tile

    def table(self) -> RecordTable | None:
        """The shard's per-record table (its rows, in record order), if it has one."""
        if self.record_table is None:
            return None
        data = base64.b64decode(self.record_table)
        return RecordTable.from_bytes(data, where=f"the journal entry of {self.file}")


def write_shard(
    spec: ShardSpec,
    options: ConvertOptions,
    channels: int,
    out_dir: Location,
    progress: ProgressCallback | None = None,
    storage_options: StorageOptions = None,
) -> ShardResult:
    """Write one shard into a folder, or into a bucket: then it is written to a local
    temporary folder (``TMPDIR``), hashed while written, and uploaded whole, its index
    file first."""
    with deflate.library(options.deflate_library):
        if not storage.is_url(out_dir):
            return _write_file(spec, options, channels, Path(out_dir), progress, storage_options)
        with tempfile.TemporaryDirectory(prefix="tfshards-shard-") as tmp:
            result = _write_file(spec, options, channels, Path(tmp), progress, storage_options)
            upload_shard(Path(tmp), spec.file_name, out_dir, options.index, storage_options)
    return result


def upload_shard(
    folder: Path, file_name: str, out: str, index: bool, storage_options: StorageOptions
) -> None:
    """Upload a finished shard from a local folder, its index file first, then remove both
    local files."""
    local = folder / file_name
    if index:
        storage.put(index_path(local), storage.join(out, index_path(local).name), storage_options)
        index_path(local).unlink()
    storage.put(local, storage.join(out, file_name), storage_options)
    local.unlink()


class _Tally:
    """What a shard job learns from the records it writes: class pixels, the first two
    sizes, the per-record table's rows and the per-channel sums."""

    def __init__(self, ignore_label: int | None) -> None:
        self.ignore_label = ignore_label
        self.class_pixels = np.zeros(256, dtype=np.int64)
        self.sizes: list[tuple[int, int]] = []
        self.rows: list[RecordRow] = []
        self.sums = ChannelSums()

    def add(self, prepared: PreparedPair) -> None:
        row = record_row(prepared.key, prepared.mask, self.ignore_label)
        self.rows.append(row)
        self.sums.add(prepared.image)
        self.class_pixels[row.class_ids] += row.class_counts
        if self.ignore_label is not None:
            self.class_pixels[self.ignore_label] += row.ignored_pixels
        if prepared.mask.shape not in self.sizes and len(self.sizes) < 2:
            self.sizes.append(prepared.mask.shape)


def _write_file(
    spec: ShardSpec,
    options: ConvertOptions,
    channels: int,
    out_dir: Path,
    progress: ProgressCallback | None,
    storage_options: StorageOptions,
) -> ShardResult:
    tally, skipped, auto_tiled = _Tally(options.ignore_label), [], 0
    with ShardWriter(
        out_dir / spec.file_name,
        compression=options.compression,
        level=options.compression_level,
        index=options.index,
    ) as writer:
        for number, pair in enumerate(spec.pairs):
            before = writer.records
            band = None if spec.bands is None else tuple(spec.bands[number].tolist())
            band = None if band == WHOLE else band
            try:
                for record in pair_records(
                    pair, options, channels, storage_options, prepare_pair, band
                ):
                    writer.write(_encoded(pair, record, options, channels))
                    tally.add(record.prepared)
                    auto_tiled += record.auto_tiled and writer.records == before + 1
            except PairError as exc:
                shared = _shared(spec, number)
                if options.on_error == "fail" or writer.records > before or shared:
                    raise _unskippable(exc, writer.records - before, shared) from exc
                skipped.append(SkippedPair(exc.key, exc.path, exc.reason))
                _report(progress, 0)
                continue
            prepared = record.prepared
            source_bytes = len(prepared.image_source.data) + len(prepared.mask_source.data)
            _report(progress, record.source_bytes or source_bytes)
    return ShardResult(
        file=spec.file_name,
        split=spec.split,
        records=writer.records,
        bytes=writer.bytes,
        sha256=writer.sha256,
        crc32c=writer.crc32c,
        class_pixels=tally.class_pixels.tolist(),
        image_sizes=tally.sizes,
        skipped=skipped,
        record_table=base64.b64encode(RecordTable.from_rows(tally.rows, 256).to_bytes()).decode(),
        image_stats=tally.sums.to_json(),
        auto_tiled=auto_tiled,
    )


def _shared(spec: ShardSpec, number: int) -> bool:
    """Whether entry ``number`` of the shard is one band of a pair cut into several (its
    other bands go to other shards: skipping this one would keep part of the image)."""
    return spec.bands is not None and tuple(spec.bands[number].tolist()) != WHOLE


def _unskippable(error: PairError, written: int, shared: bool) -> PairError:
    """A pair that fails after some of its tiles were written, or one band of a pair cut
    into several (``tiling.planned_bands``), cannot be skipped: its shard fails (and is not
    published) rather than keep part of an image."""
    if not (written or shared):
        return error
    why = (
        "its image is cut into bands of tile rows written by several shards"
        if shared
        else f"{written} of its tiles were written before"
    )
    reason = (
        f"{error.reason}; {why}, so it cannot be skipped: the shard is not written (fix or "
        "remove the file and --resume)"
    )
    return PairError(error.key, error.path, error.field, reason)


def _encoded(pair: Pair, record: PairRecord, options: ConvertOptions, channels: int) -> bytes:
    """Encode one record of a pair (prepared: decoded and checked); PairError if it fails."""
    prepared = record.prepared
    with pair_stage(pair, pair.image, "image"):
        image, image_format = image_encoding(options.encoding).encode(
            prepared.image, prepared.image_source
        )
    with pair_stage(pair, pair.mask, "mask"):
        mask, mask_format = mask_encoding(options.mask_encoding).encode(
            prepared.mask, prepared.mask_source
        )
    height, width = prepared.mask.shape
    window = record.window
    encoded = EncodedPair(
        prepared.key, image, image_format, height, width, channels, mask, mask_format,
        source=None if window is None else record.source,
        row=0 if window is None else window.row,
        column=0 if window is None else window.column,
    )  # fmt: skip
    return encoded.to_example()


def _report(progress: ProgressCallback | None, source_bytes: int) -> None:
    if progress is not None:
        progress(1, source_bytes)


# Worker-process side: the progress queue is handed over once, at process start.
_worker_queue: multiprocessing.Queue | None = None


def init_worker(queue: multiprocessing.Queue) -> None:
    """Runs first in each worker: the launching process handles Ctrl-C and stops workers."""
    global _worker_queue
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_queue = queue


def write_shard_in_worker(
    spec: ShardSpec,
    options: ConvertOptions,
    channels: int,
    out_dir: Location,
    storage_options: StorageOptions = None,
) -> ShardResult:
    progress = _BatchedProgress(_worker_queue)
    try:
        return write_shard(spec, options, channels, out_dir, progress, storage_options)
    finally:
        progress.flush()


class _BatchedProgress:
    """Progress sent a few times a second, not once per pair: a queue put wakes a feeder
    thread and the parent, which cost more than the pair's bookkeeping."""

    _SECONDS = 0.25

    def __init__(self, queue: multiprocessing.Queue) -> None:
        self.queue = queue
        self.pairs = self.source_bytes = 0
        self.sent = time.monotonic()

    def __call__(self, pairs: int, source_bytes: int) -> None:
        self.pairs += pairs
        self.source_bytes += source_bytes
        if time.monotonic() - self.sent >= self._SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.pairs:
            self.queue.put((self.pairs, self.source_bytes))
        self.pairs = self.source_bytes = 0
        self.sent = time.monotonic()
