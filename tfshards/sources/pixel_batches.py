"""Records of one size decoded a batch at a time into one uint8 array, without TensorFlow.

For raw and deflate records (``batches_of``). The first record of each length is walked
by the pure-Python protobuf parser (``tfrecord.example_fields``: where each value lies,
no copies) and its sizes and formats are checked against the manifest; that walk is
remembered as a :class:`RecordLayout`, and a later record of the same length whose bytes
around its pixels and key are the same is placed by it without a walk (a raw dataset's
records all share one or a few layouts; the walk was a third of the raw stream's Python
time per pair). The pixels are copied (raw) or inflated (deflate, by ISA-L where
installed, which releases the GIL) into row ``k`` of the batch.
PNG and JPEG are left to TensorFlow's decoders: Pillow here cost 0.23-0.30 ms more CPU
per 256x256 pair (benchmarks/README.md).

Why not TensorFlow's ops: turning the records into a ``tf.string`` tensor, parsing it
and ``decode_raw`` copy every pixel byte three more times, about 0.27 ms of CPU per
256x256 RGB pair in all, against 0.05 here for parsing and the one copy; and
``tf.io.decode_compressed`` is zlib, about twice ISA-L's time to inflate
(``benchmarks/studies/ordered_reader_time.py`` and ``benchmarks/README.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from tfshards.errors import TfshardsError
from tfshards.schemas import deflate
from tfshards.schemas.format import image_encoding, mask_encoding
from tfshards.schemas.offsets import FOOTER_BYTES, HEADER_BYTES, read_record, read_record_into
from tfshards.schemas.tfrecord import RecordError, Span, crc32c_at, example_fields

if TYPE_CHECKING:
    from tfshards.sources.records import SplitRecords

ALIGNMENT = 64  # TensorFlow takes a NumPy array of this alignment without a copy
BATCH_FORMATS = ("raw", "deflate")
MAX_LAYOUTS = 16  # record layouts remembered per reader (one per record length)
FRAMING_BYTES = HEADER_BYTES + FOOTER_BYTES


class PairDecodeError(TfshardsError, ValueError):
    """A record's bytes are intact (CRCs match) but its pair does not decode."""


def aligned_empty(shape: tuple[int, ...], alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialised uint8 array whose data starts at a multiple of ``alignment``."""
    size = int(np.prod(shape))
    buffer = np.empty(size + alignment, np.uint8)
    skip = -buffer.ctypes.data % alignment
    return buffer[skip : skip + size].reshape(shape)


@dataclass(frozen=True)
class PixelBatches:
    """Decodes records of ``shape`` (H, W, C) whose image and mask pixels are stored in
    one of ``image_formats`` and ``mask_formats`` (each record says which); ``where``
    names the dataset and split in messages."""

    shape: tuple[int, int, int]  # the last axis counts bytes: channels x itemsize
    image_formats: tuple[str, ...]
    mask_formats: tuple[str, ...]
    where: str
    itemsize: int = 1  # bytes per image sample (2: uint16 images, delivered as bytes)
    _layouts: dict[int, RecordLayout] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        others = set(self.image_formats + self.mask_formats) - set(BATCH_FORMATS)
        if others:
            raise ValueError(f"pixel formats {sorted(others)} are not decoded a batch at a time")

    def decode(
        self, records: Sequence[bytes], located: Callable[[int], str]
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """uint8 images [B, H, W, C], masks [B, H, W, 1] and keys of ``records`` (their
        data, CRCs already checked); ``located(k)`` names record ``k`` (shard and number)
        in errors, which are :class:`PairDecodeError`."""
        images, masks = self._empty(len(records))
        keys = [
            self._decode_into(k, record, images, masks, located) for k, record in enumerate(records)
        ]
        return images, masks, keys

    def read(
        self, records: SplitRecords, indices: np.ndarray, located: Callable[[int], str]
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """The images, masks and keys of the records at ``indices``, read and decoded as
        :meth:`decode` does. A raw record of a remembered layout is read straight into
        its rows by one ``preadv``, its CRC computed there: no copy of its pixels."""
        images, masks = self._empty(len(indices))
        keys = [""] * len(indices)

        def read_one(k: int, fd: int, start: int, length: int, where: str) -> None:
            layout = self._layouts.get(length - FRAMING_BYTES)
            key = None
            if layout is not None:
                key = layout.read_into(fd, start, length, where, images[k], masks[k])
            if key is None:
                record = read_record(fd, start, length, where)
                key = self._decode_into(k, record, images, masks, located)
            keys[k] = key

        records.read_each(indices, read_one)
        return images, masks, keys

    def _empty(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        height, width, channels = self.shape
        images = aligned_empty((count, height, width, channels))
        return images, aligned_empty((count, height, width, 1))

    def _decode_into(
        self,
        k: int,
        record: bytes,
        images: np.ndarray,
        masks: np.ndarray,
        located: Callable[[int], str],
    ) -> str:
        """Record ``k``'s pixels into row ``k``; its key."""
        try:
            layout = self._layouts.get(len(record))
            if layout is None or not layout.fits(record):
                layout = self._walked(record, located, k)
            _pixels_into(images[k], record, layout.image, layout.image_format)
            _pixels_into(masks[k], record, layout.mask, layout.mask_format)
        except PairDecodeError:
            raise
        except (RecordError, KeyError, TypeError, ValueError) as exc:
            raise PairDecodeError(f"{located(k)}: {_cause(exc)}") from exc
        if len(self._layouts) < MAX_LAYOUTS:  # a layout whose pixels decoded
            self._layouts.setdefault(len(record), layout)
        return str(record[slice(*layout.key)], "utf-8", "replace")

    def _walked(self, record: bytes, located: Callable[[int], str], k: int) -> RecordLayout:
        """The layout of a record walked in full and checked (sizes, formats)."""
        features = example_fields(record)
        self._check_sizes(features, record, located, k)
        formats = [self._format(features, record, part) for part in ("image", "mask")]
        spans = [_span(features, name) for name in ("image/encoded", "mask/encoded", "key")]
        return RecordLayout.of(record, *spans, *formats)

    def _check_sizes(
        self, features: dict, record: bytes, located: Callable[[int], str], k: int
    ) -> None:
        """The record's own sizes are the manifest's, or a PairDecodeError."""
        height, width, channels = self.shape
        channels //= self.itemsize
        holds = (features["image/height"], features["image/width"], features["image/channels"])
        mask_channels = features["mask/channels"]
        if holds != (height, width, channels) or mask_channels != 1:
            key = str(record[slice(*_span(features, "key"))], "utf-8", "replace")
            raise PairDecodeError(
                f"{self.where}: record {key} disagrees with the manifest: it holds "
                f"{'x'.join(map(str, holds))} (HxWxC) pixels, the manifest says "
                f"{height}x{width} with {channels} channels and masks 1 (this record: mask "
                f"channels {mask_channels}; {located(k)}); the manifest was edited or "
                "belongs to other shards: convert again, and run `tfshards verify` on the dataset"
            )

    def _format(self, features: dict, record: bytes, part: str) -> str:
        """The record's format of its ``part`` pixels, one the manifest allows, or a ValueError."""
        allowed = self.image_formats if part == "image" else self.mask_formats
        stored = str(record[slice(*_span(features, f"{part}/format"))], "utf-8", "replace")
        if stored not in allowed:
            raise ValueError(
                f"its {part} is stored as {stored!r}, the manifest's encoding allows "
                f"{', '.join(allowed)}; run `tfshards verify` on the dataset"
            )
        return stored


@dataclass(frozen=True)
class RecordLayout:
    """Where a checked record's pixels and key lie, and its bytes around them.

    A protobuf walk is decided by tags and lengths alone, all of which lie outside the
    pixel and key values; so a record of the same length whose bytes outside those three
    spans equal these has the same fields at the same places, with the same sizes and
    formats, and needs no walk (a few short comparisons, against about 30 us of Python
    holding the GIL for a 256x256 record)."""

    length: int
    image: Span
    mask: Span
    key: Span
    image_format: str
    mask_format: str
    around: tuple[tuple[int, int, bytes], ...]  # (start, stop, bytes) outside the spans

    @classmethod
    def of(
        cls, record: bytes, image: Span, mask: Span, key: Span, image_format: str, mask_format: str
    ) -> RecordLayout:
        around, position = [], 0
        for start, stop in sorted((image, mask, key)):
            around.append((position, start, bytes(record[position:start])))
            position = stop
        around.append((position, len(record), bytes(record[position:])))
        return cls(len(record), image, mask, key, image_format, mask_format, tuple(around))

    def fits(self, record: bytes) -> bool:
        """True when ``record`` has this layout (see the class docstring)."""
        return len(record) == self.length and all(
            record[start:stop] == piece for start, stop, piece in self.around
        )

    @cached_property
    def _direct(self) -> tuple[tuple[tuple[int, int, int], ...], bytes] | None:
        """How a record of this layout is read straight into its rows: its segments in
        order, as (0 scratch / 1 image row / 2 mask row, start, stop), the bytes around
        first in the scratch and the key after them; and those bytes. None unless both
        are raw and the C CRC is at hand."""
        if (self.image_format, self.mask_format) != ("raw", "raw") or crc32c_at() is None:
            return None
        around = b"".join(piece for _, _, piece in self.around)
        values = {self.image: (1, 0, _size(self.image)), self.mask: (2, 0, _size(self.mask))}
        values[self.key] = (0, len(around), len(around) + _size(self.key))
        segments, at = [], 0
        for (start, stop, _), value in zip(self.around, [*sorted(values), None], strict=True):
            segments.append((0, at, at + stop - start))
            at += stop - start
            if value is not None:
                segments.append(values[value])
        return tuple(segment for segment in segments if segment[2] > segment[1]), around

    def read_into(
        self, fd: int, start: int, length: int, where: str, image: np.ndarray, mask: np.ndarray
    ) -> str | None:
        """Read the record framed at ``start`` into ``image`` and ``mask`` (rows of a
        batch), both CRCs checked: its key when it has this layout; None when it does not
        (the rows then hold other bytes: decode it another way) or is not raw."""
        direct = self._direct
        if direct is None or image.size != _size(self.image) or mask.size != _size(self.mask):
            return None
        segments, around = direct
        scratch = np.empty(len(around) + _size(self.key), np.uint8)
        rows = (scratch, image.reshape(-1), mask.reshape(-1))
        parts = [rows[source][first:stop] for source, first, stop in segments]
        read_record_into(fd, start, length, where, parts)
        if scratch[: len(around)].tobytes() != around:
            return None
        return str(scratch[len(around) :].tobytes(), "utf-8", "replace")


def _size(span: Span) -> int:
    return span[1] - span[0]


def _span(features: dict, name: str) -> Span:
    """The span of a bytes feature; KeyError when missing, ValueError when not bytes."""
    value = features[name]
    if not isinstance(value, tuple):
        raise ValueError(f"feature {name!r} is not a bytes value")
    return value


def _pixels_into(row: np.ndarray, record: bytes, span: Span, fmt: str) -> None:
    """Pixels in ``fmt`` at ``span`` of ``record`` into ``row`` (H, W, C): raw bytes
    copied, a zlib stream inflated."""
    height, width, channels = row.shape
    start, stop = span
    if fmt == "deflate":
        pixels = np.frombuffer(deflate.decompress(memoryview(record)[start:stop]), np.uint8)
    else:
        pixels = np.frombuffer(record, np.uint8, stop - start, start)
    if pixels.size != row.size:
        raise ValueError(
            f"its {fmt} pixels are {pixels.size} bytes where its size, "
            f"{height}x{width}x{channels} (HxWxC), makes {row.size}"
        )
    row.reshape(-1)[:] = pixels


def _cause(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"missing feature {exc}"
    return str(exc)


def batches_of(manifest, where: str) -> PixelBatches | None:
    """The batch decoder of a dataset whose records all have the manifest's size and
    raw or deflate pixels; None for others (mixed sizes, PNG, JPEG)."""
    image = image_encoding(manifest.image.encoding)
    mask = mask_encoding(manifest.mask.encoding)
    formats = (*image.formats, *mask.formats)
    if manifest.byte_shape is None or not set(formats) <= set(BATCH_FORMATS):
        return None
    shape, itemsize = tuple(manifest.byte_shape), manifest.image.itemsize
    return PixelBatches(shape, image.formats, mask.formats, where, itemsize)
