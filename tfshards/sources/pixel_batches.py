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
from dataclasses import dataclass

import numpy as np

from tfshards.errors import TfshardsError
from tfshards.schemas import deflate
from tfshards.schemas.format import image_encoding, mask_encoding
from tfshards.schemas.tfrecord import RecordError, parse_example

ALIGNMENT = 64  # TensorFlow takes a NumPy array of this alignment without a copy
BATCH_FORMATS = ("raw", "deflate")


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
                features = parse_example(memoryview(record))
                self._check_sizes(features, located, k)
                for part, rows in (("image", images), ("mask", masks)):
                    _pixels_into(rows[k], features[f"{part}/encoded"], self._format(features, part))
                keys.append(bytes(features["key"]).decode("utf-8", "replace"))
            except PairDecodeError:
                raise
            except (RecordError, KeyError, TypeError, ValueError) as exc:
                raise PairDecodeError(f"{located(k)}: {_cause(exc)}") from exc
        return images, masks, keys

    def _check_sizes(self, features: dict, located: Callable[[int], str], k: int) -> None:
        """The record's own sizes are the manifest's, or a PairDecodeError."""
        height, width, channels = self.shape
        holds = (features["image/height"], features["image/width"], features["image/channels"])
        mask_channels = features["mask/channels"]
        if holds != self.shape or mask_channels != 1:
            key = bytes(features["key"]).decode("utf-8", "replace")
            raise PairDecodeError(
                f"{self.where}: record {key} disagrees with the manifest: it holds "
                f"{'x'.join(map(str, holds))} (HxWxC) pixels, the manifest says "
                f"{height}x{width} with {channels} channels and masks 1 (this record: mask "
                f"channels {mask_channels}; {located(k)}); the manifest was edited or "
                "belongs to other shards: convert again, and run `tfshards verify` on the dataset"
            )

    def _format(self, features: dict, part: str) -> str:
        """The record's format of its ``part`` pixels, one the manifest allows, or a ValueError."""
        allowed = self.image_formats if part == "image" else self.mask_formats
        stored = bytes(features[f"{part}/format"]).decode("utf-8", "replace")
        if stored not in allowed:
            raise ValueError(
                f"its {part} is stored as {stored!r}, the manifest's encoding allows "
                f"{', '.join(allowed)}; run `tfshards verify` on the dataset"
            )
        return stored


def _pixels_into(row: np.ndarray, encoded: memoryview, fmt: str) -> None:
    """Pixels in ``fmt`` into ``row`` (H, W, C): raw bytes copied, a zlib stream inflated."""
    height, width, channels = row.shape
    pixels = deflate.decompress(encoded) if fmt == "deflate" else encoded
    if len(pixels) != row.size:
        raise ValueError(
            f"its {fmt} pixels are {len(pixels)} bytes where its size, "
            f"{height}x{width}x{channels} (HxWxC), makes {row.size}"
        )
    row.reshape(-1)[:] = np.frombuffer(pixels, np.uint8)


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
