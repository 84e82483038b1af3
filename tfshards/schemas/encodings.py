"""Pixel encodings, registered by name; the writer encodes with them, the reader decodes.

On-disk formats of the ``*/encoded`` bytes, named by ``*/format``:

- ``png``:  a PNG file (8-bit; grayscale, RGB or RGBA).
- ``jpeg``: a JPEG file (8-bit; grayscale or RGB).
- ``raw``:  the uint8 pixels in row-major height x width x channels order.

Encoding names (what the user asks for) map to those formats:

- ``keep``: the source file's own bytes when they already decode to the stored
  pixels (a PNG or JPEG, no EXIF rotation, no resize, no mode change);
  otherwise PNG. The fastest conversion.
- ``png``, ``jpeg``: always re-encoded. ``jpeg`` is lossy and refused for masks.
- ``raw``: decoded pixels; the largest shards, the fastest reading.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from tfshards.errors import OptionsError

JPEG_QUALITY = 95


@dataclass(frozen=True)
class SourceFile:
    """A source file's bytes and whether they decode to exactly the pixels to store."""

    data: bytes
    format: str  # "png", "jpeg", ... (lower case, as Pillow names it)
    reusable: bool


@dataclass(frozen=True)
class Encoding:
    name: str
    encode: Callable[[np.ndarray, SourceFile], tuple[bytes, str]]


def _png(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    Image.fromarray(_squeeze_gray(pixels)).save(buffer, format="PNG")
    return buffer.getvalue(), "png"


def _jpeg(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    Image.fromarray(_squeeze_gray(pixels)).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue(), "jpeg"


def _raw(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    return np.ascontiguousarray(pixels, dtype=np.uint8).tobytes(), "raw"


def _keep(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    if source.reusable and source.format in ("png", "jpeg"):
        return source.data, source.format
    return _png(pixels, source)


def _squeeze_gray(pixels: np.ndarray) -> np.ndarray:
    return pixels[:, :, 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels


IMAGE_ENCODINGS: dict[str, Encoding] = {
    "keep": Encoding("keep", encode=_keep),
    "png": Encoding("png", encode=_png),
    "jpeg": Encoding("jpeg", encode=_jpeg),
    "raw": Encoding("raw", encode=_raw),
}
# Masks hold class indices: a lossy encoding would invent classes at edges.
MASK_ENCODINGS: dict[str, Encoding] = {
    name: IMAGE_ENCODINGS[name] for name in ("keep", "png", "raw")
}


def image_encoding(name: str) -> Encoding:
    return _lookup(IMAGE_ENCODINGS, name, "image")


def mask_encoding(name: str) -> Encoding:
    if name == "jpeg":
        raise OptionsError(
            "mask encoding 'jpeg' is refused: JPEG is lossy and would change class indices "
            f"at object edges; use one of {sorted(MASK_ENCODINGS)}"
        )
    return _lookup(MASK_ENCODINGS, name, "mask")


def _lookup(registry: dict[str, Encoding], name: str, what: str) -> Encoding:
    try:
        return registry[name]
    except KeyError:
        raise OptionsError(
            f"unknown {what} encoding {name!r}; valid encodings: {', '.join(sorted(registry))}"
        ) from None
