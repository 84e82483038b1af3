"""Records of one size decoded a batch at a time into one uint8 array, without TensorFlow.

For raw and deflate records (``batches_of``). Each record is parsed by the pure-Python
protobuf walk (its pixel fields stay views of the record, no copies), its sizes and
formats are checked against the manifest, and its pixels are copied (raw) or inflated
(deflate, by ISA-L where installed, which releases the GIL) into row ``k`` of the batch.
PNG and JPEG are left to TensorFlow's decoders: Pillow here cost 0.23-0.30 ms more CPU
per 256x256 pair (benchmarks/README.md).

Why not TensorFlow's ops: turning the records into a ``tf.string`` tensor, parsing it
and ``decode_raw`` copy every pixel byte three more times, about 0.27 ms of CPU per
256x256 RGB pair in all, against 0.05 here for parsing and the one copy; and
``tf.io.decode_compressed`` is zlib, about twice ISA-L's time to inflate
(``benchmarks/ordered_reader_time.py`` and ``benchmarks/README.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tfshards.errors import TfshardsError
from tfshards.schemas import deflate
from tfshards.schemas.format import image_encoding, mask_encoding
from tfshards.schemas.tfrecord import RecordError, Span, example_fields

ALIGNMENT = 64  # TensorFlow takes a NumPy array of this alignment without a copy
BATCH_FORMATS = ("raw", "deflate")
MAX_LAYOUTS = 16  # record layouts remembered per reader (one per record length)


class PairDecodeError(TfshardsError, ValueError):
    """A record's bytes are intact (CRCs match) but its pair does not decode."""


def aligned_empty(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array whose data starts at a multiple of ``ALIGNMENT``."""
    size = int(np.prod(shape))
    buffer = np.empty(size + ALIGNMENT, np.uint8)
    skip = -buffer.ctypes.data % ALIGNMENT
    return buffer[skip : skip + size].reshape(shape)


@dataclass(frozen=True)
class PixelBatches:
    """Decodes records of ``shape`` (H, W, C) whose image and mask pixels are stored in
    one of ``image_formats`` and ``mask_formats`` (each record says which); ``where``
    names the dataset and split in messages."""

    shape: tuple[int, int, int]
    image_formats: tuple[str, ...]
    mask_formats: tuple[str, ...]
    where: str
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
        height, width, channels = self.shape
        images = aligned_empty((len(records), height, width, channels))
        masks = aligned_empty((len(records), height, width, 1))
        keys = []
        for k, record in enumerate(records):
            try:
                layout = self._layouts.get(len(record))
                if layout is None or not layout.fits(record):
                    layout = self._learn(record, located, k)
                _pixels_into(images[k], record, layout.image, layout.image_format)
                _pixels_into(masks[k], record, layout.mask, layout.mask_format)
                keys.append(str(record[slice(*layout.key)], "utf-8", "replace"))
            except PairDecodeError:
                raise
            except (RecordError, KeyError, TypeError, ValueError) as exc:
                raise PairDecodeError(f"{located(k)}: {_cause(exc)}") from exc
        return images, masks, keys

    def _learn(self, record: bytes, located: Callable[[int], str], k: int) -> RecordLayout:
        """The layout of a record walked in full and checked (sizes, formats); remembered
        for the records of its length that follow."""
        features = example_fields(record)
        self._check_sizes(features, record, located, k)
        formats = [self._format(features, record, part) for part in ("image", "mask")]
        spans = [_span(features, name) for name in ("image/encoded", "mask/encoded", "key")]
        layout = RecordLayout.of(record, *spans, *formats)
        if len(self._layouts) < MAX_LAYOUTS:
            self._layouts[len(record)] = layout
        return layout

    def _check_sizes(
        self, features: dict, record: bytes, located: Callable[[int], str], k: int
    ) -> None:
        """The record's own sizes are the manifest's, or a PairDecodeError."""
        height, width, channels = self.shape
        holds = (features["image/height"], features["image/width"], features["image/channels"])
        mask_channels = features["mask/channels"]
        if holds != self.shape or mask_channels != 1:
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
    formats, and needs no walk: about 3 us against 30 for a 256x256 record (the walk is
    Python and holds the GIL, the comparison a few short ``memcmp``)."""

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
    if manifest.image_shape is None or not set(formats) <= set(BATCH_FORMATS):
        return None
    return PixelBatches(tuple(manifest.image_shape), image.formats, mask.formats, where)
