"""Decode and check one image/mask pair; every failure names the key, the file and the cause.

Choices, documented once here:

- EXIF orientation is applied to the image and to the mask alike, so both are
  stored as an image viewer shows them; sizes are compared after it.
- Images become 1 (L), 3 (RGB) or 4 (RGBA) channels; 16-bit and float images
  are refused (tfshards stores 8-bit images).
- Masks must hold class indices in one channel: L, P (palette indices, never
  the palette colours), 1-bit, 16-bit (values must fit in 0..255), or RGB/RGBA
  whose colour channels are all equal. Colour-coded RGB masks are refused.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from tfshards.converters.options import ConvertOptions
from tfshards.converters.pairing import Pair
from tfshards.errors import PairError
from tfshards.schemas.format import SourceFile

_EXIF_ORIENTATION = 0x0112
_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
_CHANNEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_HIGH_DEPTH_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


@dataclass(frozen=True)
class PreparedPair:
    key: str
    image: np.ndarray  # uint8 [height, width, channels]
    mask: np.ndarray  # uint8 [height, width]
    image_source: SourceFile
    mask_source: SourceFile


def image_channels(path: Path) -> int:
    """The channel count 'auto' picks for a dataset whose first image is ``path``."""
    try:
        with Image.open(path) as image:
            return 1 if image.mode in _GRAY_MODES else 3
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as exc:
        raise PairError(path.stem, str(path), "image", f"cannot read ({exc})") from exc


def prepare_pair(pair: Pair, options: ConvertOptions, channels: int) -> PreparedPair:
    image, image_data, image_format, image_rotated = _open(pair, pair.image, "image")
    mask, mask_data, mask_format, mask_rotated = _open(pair, pair.mask, "mask")
    if image.size != mask.size:
        raise PairError(
            pair.key,
            str(pair.mask),
            "mask",
            f"mask is {mask.height}x{mask.width} (HxW) but image {pair.image} is "
            f"{image.height}x{image.width}",
        )
    image_pixels, image_changed = _image_pixels(pair, image, channels)
    mask_pixels, mask_changed = _mask_pixels(pair, mask, options)
    if options.resize is not None:
        image_pixels, mask_pixels = _resized(image_pixels, mask_pixels, options.resize)
    resized = options.resize is not None and options.resize != (image.height, image.width)
    return PreparedPair(
        key=pair.key,
        image=image_pixels,
        mask=mask_pixels,
        image_source=SourceFile(
            image_data, image_format, not (image_rotated or image_changed or resized)
        ),
        mask_source=SourceFile(
            mask_data, mask_format, not (mask_rotated or mask_changed or resized)
        ),
    )


def _open(pair: Pair, path: Path, field: str) -> tuple[Image.Image, bytes, str, bool]:
    """Read, decode fully and EXIF-orient one file."""

    def fail(reason: str, exc: BaseException | None = None) -> PairError:
        error = PairError(pair.key, str(path), field, reason)
        error.__cause__ = exc
        return error

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot read ({exc.strerror or exc})", exc) from exc
    if not data:
        raise fail("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise fail(f"over Pillow's decompression-bomb limit ({exc})", exc) from exc
    except UnidentifiedImageError as exc:
        raise fail("not an image file Pillow can decode", exc) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise fail(f"corrupt or truncated image ({exc})", exc) from exc
    image_format = (image.format or "").lower()
    rotated = image.getexif().get(_EXIF_ORIENTATION, 1) not in (1, None)
    if rotated:
        image = ImageOps.exif_transpose(image)
    return image, data, image_format, rotated


def _image_pixels(pair: Pair, image: Image.Image, channels: int) -> tuple[np.ndarray, bool]:
    if image.mode in _HIGH_DEPTH_MODES:
        raise PairError(
            pair.key,
            str(pair.image),
            "image",
            f"{image.mode} images (16-bit or float) are not supported; convert to 8-bit first",
        )
    target = _CHANNEL_MODES[channels]
    changed = image.mode != target
    if changed:
        image = image.convert(target)
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels.reshape(pixels.shape[0], pixels.shape[1], channels), changed


def _mask_pixels(pair: Pair, mask: Image.Image, options: ConvertOptions) -> tuple[np.ndarray, bool]:
    def fail(reason: str) -> PairError:
        return PairError(pair.key, str(pair.mask), "mask", reason)

    values = np.asarray(mask)
    changed = mask.mode != "L"
    if values.ndim == 3:
        colour = values[:, :, :3] if mask.mode in ("RGB", "RGBA") else values[:, :, :1]
        if mask.mode in ("RGB", "RGBA") and not (
            np.array_equal(colour[:, :, 0], colour[:, :, 1])
            and np.array_equal(colour[:, :, 0], colour[:, :, 2])
        ):
            raise fail(
                f"{mask.mode} mask with differing colour channels: tfshards needs class indices "
                "in one channel (a grayscale or palette PNG)"
            )
        values = colour[:, :, 0]
    if mask.mode == "F":
        raise fail("float masks are not supported; masks hold integer class indices")
    if options.mask_map is not None:
        values = _remapped(values.astype(np.int64), options.mask_map, fail)
        changed = True
    if values.dtype != np.uint8 and values.size and (values.min() < 0 or values.max() > 255):
        raise fail(
            f"mask value {int(values.max())} does not fit in 0..255 ({mask.mode} mask); "
            "tfshards stores class indices as uint8; remap them with --mask-map"
        )
    if options.num_classes is not None and values.size and values.max() >= options.num_classes:
        high = int(values.max())
        count = int((values >= options.num_classes).sum())
        raise fail(
            f"mask value {high} is not below --num-classes {options.num_classes} "
            f"({count} pixels); remap values with --mask-map, e.g. 0:0,255:1"
        )
    return values.astype(np.uint8, copy=False), changed


def _remapped(values: np.ndarray, mask_map, fail) -> np.ndarray:
    if values.size and (values.min() < 0 or values.max() >= 2**16):
        raise fail(f"mask values outside 0..65535 cannot be remapped ({int(values.max())})")
    table = np.full(2**16, -1, dtype=np.int64)
    for source, target in mask_map:
        table[source] = target
    mapped = table[values]
    if (mapped < 0).any():
        unknown = sorted(int(v) for v in np.unique(values[mapped < 0]))[:10]
        raise fail(f"mask values {unknown} are not in --mask-map")
    return mapped


def _resized(
    image: np.ndarray, mask: np.ndarray, size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    height, width = size
    if image.shape[:2] == (height, width):
        return image, mask
    channels = image.shape[2]
    source = Image.fromarray(image[:, :, 0] if channels == 1 else image)
    # Smooth filter for pixels; NEAREST for masks so no new class index appears at edges.
    smooth = np.asarray(source.resize((width, height), Image.Resampling.BICUBIC))
    nearest = np.asarray(Image.fromarray(mask).resize((width, height), Image.Resampling.NEAREST))
    return smooth.reshape(height, width, channels), nearest
