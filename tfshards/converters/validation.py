"""Decode and check one image/mask pair; every failure names the key, the file and the cause.

Choices, documented once here:

- EXIF orientation is applied to the image and to the mask alike, so both are
  stored as an image viewer shows them; sizes are compared after it.
- A dataset's images share one channel count (1 to 64) and sample type (uint8 or
  uint16), set by ConvertOptions or by the first image; an image of another is
  refused, naming both (16-bit pixels are never truncated to 8 bits). 8-bit
  images Pillow reads become 1 (L), 3 (RGB) or 4 (RGBA) channels; 16-bit grayscale
  files (PNG, TIFF: Pillow's I;16 and I modes) are one uint16 band; multi-band,
  16-bit and multi-page TIFFs and ``.npy`` arrays keep their bands as stored
  (``deep_files.py`` says how their band axis is found). Float images are refused.
- Images in any other Pillow mode (P, PA, LA, CMYK, YCbCr, LAB, HSV, RGBX, RGBa,
  La, ...) are converted by Pillow's own converters, through RGB(A) when there
  is no direct one; a mode Pillow cannot convert is refused with its name.
- Masks must hold class indices in one channel: L, P or PA (palette indices,
  never the palette colours, except a palette of gray levels in another order,
  as GIF writers make of grayscale masks: then the gray levels), LA (the L
  channel), 1-bit, 16-bit (values must fit in 0..255; 16-bit TIFF and integer
  ``.npy`` masks alike), or RGB/RGBA/RGBX whose
  colour channels are all equal. Colour-coded
  RGB masks and colour-space masks (CMYK, YCbCr, LAB, HSV) are refused.
- Any other failure while reading, decoding, orienting or converting one file
  (whatever Pillow, NumPy or the OS raised) becomes a per-pair error naming the
  key, the file and the original exception; only MemoryError and interrupts end
  the job.
"""

from __future__ import annotations

import contextlib
import io
import signal
import threading
import warnings
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from tfshards import storage
from tfshards.converters import deep_files
from tfshards.converters.options import BINARY_MASK_MAP, ConvertOptions
from tfshards.converters.pairing import Pair
from tfshards.errors import PairError
from tfshards.schemas.format import SourceFile
from tfshards.storage import Location, StorageOptions

_EXIF_ORIENTATION = 0x0112
_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
_CHANNEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_SIXTEEN_BIT_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})  # I: int32 of 16-bit files
_BITS_PER_SAMPLE = 258  # the TIFF tag
# A decoder that spins on a crafted file fails its pair after this long (main thread only:
# SIGALRM; conversion workers are processes, so their decoding runs there).
DECODE_SECONDS = 60
_COLOUR_SPACE_MODES = frozenset({"CMYK", "YCbCr", "LAB", "HSV"})
_EQUAL_CHANNEL_MODES = frozenset({"RGB", "RGBA", "RGBX", "RGBa"})


@contextlib.contextmanager
def pair_stage(pair: Pair, path: Location, field: str):
    """Turn any failure on one file into a PairError naming the key, file and cause."""
    try:
        yield
    except (PairError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever Pillow, NumPy or the OS raised
        raise PairError(pair.key, str(path), field, f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class PreparedPair:
    key: str
    image: np.ndarray  # uint8 or uint16 [height, width, channels]
    mask: np.ndarray  # uint8 [height, width]
    image_source: SourceFile
    mask_source: SourceFile


@dataclass(frozen=True)
class _Decoded:
    """One decoded file: a Pillow image, or the array of a ``.npy`` or tifffile TIFF."""

    image: Image.Image | None
    array: np.ndarray | None
    data: bytes
    format: str
    rotated: bool

    @property
    def size(self) -> tuple[int, int]:
        """(height, width)"""
        if self.array is not None:
            return self.array.shape[0], self.array.shape[1]
        return self.image.height, self.image.width


def image_layout(pair: Pair, storage_options: StorageOptions = None) -> tuple[int, str]:
    """(channels, dtype name) 'auto' picks for a dataset whose first pair is ``pair``:
    an 8-bit image Pillow reads gives 1 if grayscale else 3; a 16-bit grayscale one 1,
    uint16; a ``.npy`` or tifffile image its own bands and sample type."""
    path = pair.image
    try:
        with storage.open_file(path, "rb", storage_options) as handle:
            head = handle.read(4)
        if deep_files.is_tiff(head):
            with (
                pair_stage(pair, path, "image"),
                storage.open_file(path, "rb", storage_options) as tiff,
            ):
                layout = deep_files.tiff_layout(tiff)
            if layout is not None:
                return layout
        if deep_files.is_npy(path):
            with pair_stage(pair, path, "image"):
                decoded = _open(pair, path, "image", storage_options)
            if decoded.array is not None:
                pixels = _bands_of(pair, decoded, storage_options)
                return pixels.shape[2], pixels.dtype.name
        with storage.open_file(path, "rb", storage_options) as handle, Image.open(handle) as image:
            dtype = "uint16" if image.mode in _SIXTEEN_BIT_MODES else "uint8"
            return (1 if image.mode in _GRAY_MODES else 3), dtype
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as exc:
        stem = storage.name(path).rpartition(".")[0]
        raise PairError(stem, storage.display(path), "image", f"cannot read ({exc})") from exc


def _bands_of(pair: Pair, decoded: _Decoded, storage_options: StorageOptions) -> np.ndarray:
    """A first image's array as [H, W, C], a ``.npy``'s band axis told by its mask."""
    mask_size = None
    if deep_files.is_npy(pair.image) and decoded.array.ndim == 3:
        with pair_stage(pair, pair.mask, "mask"):
            mask_size = _open(pair, pair.mask, "mask", storage_options).size
    with pair_stage(pair, pair.image, "image"):
        array = deep_files.bands_last(decoded.array, mask_size)
    return array.reshape(*array.shape[:2], -1)


def prepare_pair(
    pair: Pair, options: ConvertOptions, channels: int, storage_options: StorageOptions = None
) -> PreparedPair:
    with pair_stage(pair, pair.image, "image"):
        image = _open(pair, pair.image, "image", storage_options)
    with pair_stage(pair, pair.mask, "mask"):
        mask = _open(pair, pair.mask, "mask", storage_options)
    if image.array is not None and deep_files.is_npy(pair.image):
        with pair_stage(pair, pair.image, "image"):
            image = replace(image, array=deep_files.bands_last(image.array, mask.size))
    if image.size != mask.size:
        raise PairError(
            pair.key,
            str(pair.mask),
            "mask",
            f"mask is {mask.size[0]}x{mask.size[1]} (HxW) but image {pair.image} is "
            f"{image.size[0]}x{image.size[1]}",
        )
    dtype = options.image_dtype or "uint8"
    with pair_stage(pair, pair.image, "image"):
        image_pixels, image_changed = _image_pixels(pair, image, channels, dtype)
    with pair_stage(pair, pair.mask, "mask"):
        mask_pixels, mask_changed = _mask_pixels(pair, mask, options)
    if options.resize is not None:
        with pair_stage(pair, pair.image, "image"):
            image_pixels, mask_pixels = _resized(image_pixels, mask_pixels, options.resize)
    resized = options.resize is not None and options.resize != image.size
    return PreparedPair(
        key=pair.key,
        image=image_pixels,
        mask=mask_pixels,
        image_source=SourceFile(
            image.data, image.format, not (image.rotated or image_changed or resized)
        ),
        mask_source=SourceFile(
            mask.data, mask.format, not (mask.rotated or mask_changed or resized)
        ),
    )


def _open(pair: Pair, path: Location, field: str, storage_options: StorageOptions) -> _Decoded:
    """Read, decode fully and EXIF-orient one file."""

    def fail(reason: str, exc: BaseException | None = None) -> PairError:
        if data and deep_files.is_tiff(data) and deep_files.missing_tifffile_reason():
            reason += f" ({deep_files.missing_tifffile_reason()})"
        error = PairError(pair.key, str(path), field, reason)
        error.__cause__ = exc
        return error

    data = b""
    try:
        data = storage.read_bytes(path, storage_options)
    except OSError as exc:
        raise fail(f"cannot read ({exc.strerror or exc})", exc) from exc
    if not data:
        raise fail("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            # Pillow warns, and goes on, on truncated TIFF strips and corrupt EXIF: refused.
            warnings.simplefilter("error", UserWarning)
            with _time_limit(DECODE_SECONDS):
                array = deep_files.array_of(data, path)
                if array is not None:
                    return _Decoded(None, array, data, _array_format(path), False)
                image = Image.open(io.BytesIO(data))
                image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise fail(f"over Pillow's decompression-bomb limit ({exc})", exc) from exc
    except UnidentifiedImageError as exc:
        raise fail("not an image file Pillow can decode", exc) from exc
    except _DecodeTimeout as exc:
        raise fail(f"took over {DECODE_SECONDS} s to decode; refused", exc) from exc
    except deep_files.LayoutError as exc:  # a readable file tfshards does not take
        raise fail(str(exc), exc) from exc
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this pair's error
        raise fail(f"corrupt or truncated image ({type(exc).__name__}: {exc})", exc) from exc
    image_format = (image.format or "").lower()
    rotated = image.getexif().get(_EXIF_ORIENTATION, 1) not in (1, None)
    if rotated:
        image = ImageOps.exif_transpose(image)
    return _Decoded(image, None, data, image_format, rotated)


def _array_format(path: Location) -> str:
    return "npy" if deep_files.is_npy(path) else "tiff"


class _DecodeTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _DecodeTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _image_pixels(
    pair: Pair, decoded: _Decoded, channels: int, dtype: str
) -> tuple[np.ndarray, bool]:
    """[H, W, channels] pixels of ``dtype``, or a PairError naming what the file holds."""
    if decoded.array is not None:
        return _checked_layout(pair, decoded.array, channels, dtype), True
    image = decoded.image
    if image.mode == "F":
        raise _image_error(pair, "float images (Pillow mode F) are not supported")
    truncating = _pillow_truncates(image)
    if truncating is not None:
        raise _image_error(pair, truncating)
    if image.mode in _SIXTEEN_BIT_MODES:
        values = np.asarray(image)
        if values.dtype != np.uint16 and values.size and (values.min() < 0 or values.max() > 65535):
            raise _image_error(pair, f"{image.mode} image values do not fit in 16 bits")
        return _checked_layout(pair, values.astype(np.uint16), channels, dtype), True
    if dtype != "uint8" or channels not in _CHANNEL_MODES:
        bands = 1 if image.mode in _GRAY_MODES else len(image.getbands())
        raise _layout_error(pair, (bands, "uint8"), (channels, dtype))
    target = _CHANNEL_MODES[channels]
    changed = image.mode != target
    if changed:
        image = _converted(pair, image, target)
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels.reshape(pixels.shape[0], pixels.shape[1], channels), changed


def _pillow_truncates(image: Image.Image) -> str | None:
    """Why Pillow's pixels of a TIFF are not the file's (read without tifffile), or None."""
    if image.format != "TIFF" or image.mode in _SIXTEEN_BIT_MODES:
        return None
    bits = image.tag_v2.get(_BITS_PER_SAMPLE, (8,))
    bits = bits if isinstance(bits, tuple) else (bits,)
    if max(bits) <= 8 and getattr(image, "n_frames", 1) == 1:
        return None
    return deep_files.missing_tifffile_reason()


def _checked_layout(pair: Pair, pixels: np.ndarray, channels: int, dtype: str) -> np.ndarray:
    """``pixels`` as [H, W, C] native-order uint8/uint16, when they are the dataset's."""
    if pixels.dtype.kind != "u" or pixels.dtype.itemsize > 2:
        raise _image_error(
            pair,
            f"{pixels.dtype} images are not supported; tfshards stores uint8 and uint16 images",
        )
    pixels = pixels.astype(f"u{pixels.dtype.itemsize}", copy=False)  # native byte order
    pixels = pixels.reshape(*pixels.shape[:2], -1)
    held, wanted = (pixels.shape[2], pixels.dtype.name), (channels, dtype)
    if held != wanted:
        raise _layout_error(pair, held, wanted)
    return pixels


def _layout_error(pair: Pair, held: tuple[int, str], wanted: tuple[int, str]) -> PairError:
    never = " (16-bit pixels are never cut to 8 bits)" if held[1] == "uint16" else ""
    return _image_error(
        pair,
        f"the image holds {held[0]} channel(s) of {held[1]} but this dataset stores "
        f"{wanted[0]} of {wanted[1]}{never}: a dataset's images share one channel count "
        "and sample type (set by channels / image_dtype, else by the first image)",
    )


def _image_error(pair: Pair, reason: str) -> PairError:
    return PairError(pair.key, str(pair.image), "image", reason)


def _converted(pair: Pair, image: Image.Image, target: str) -> Image.Image:
    """Pillow's converter, through RGBA or RGB where it has no direct one (LAB -> L)."""
    for route in ((), ("RGBA",), ("RGB",)):
        try:
            converted = image
            for mode in (*route, target):
                converted = converted.convert(mode)
            return converted
        except ValueError:
            continue
    raise PairError(
        pair.key,
        str(pair.image),
        "image",
        f"Pillow cannot convert {image.mode} images to {target}; save them as RGB or grayscale",
    )


def _mask_pixels(pair: Pair, decoded: _Decoded, options: ConvertOptions) -> tuple[np.ndarray, bool]:
    def fail(reason: str) -> PairError:
        return PairError(pair.key, str(pair.mask), "mask", reason)

    if decoded.array is not None:
        values = _array_mask(decoded.array, fail)
        return _class_indices(values, f"{values.dtype} array", options, fail), True
    mask = decoded.image
    if mask.mode in _COLOUR_SPACE_MODES or mask.mode == "La":
        raise fail(
            f"{mask.mode} masks cannot hold class indices (colour-space or premultiplied "
            "values); save masks as grayscale or palette PNGs"
        )
    values = np.asarray(mask)
    changed = mask.mode != "L"
    if mask.mode in ("P", "PA") and _gray_palette_of_other_values(mask, values):
        values = np.asarray(mask.convert("L"))  # a grayscale mask saved as GIF: gray levels
    if values.ndim == 3:
        equal_channels = mask.mode in _EQUAL_CHANNEL_MODES
        colour = values[:, :, :3] if equal_channels else values[:, :, :1]
        if equal_channels and not (
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
    changed = changed or options.mask_map is not None
    return _class_indices(values, f"{mask.mode} mask", options, fail), changed


def _array_mask(array: np.ndarray, fail) -> np.ndarray:
    """The class indices [H, W] of a ``.npy`` or tifffile mask."""
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim != 2:
        raise fail(f"mask has shape {array.shape}; class indices are one band [H, W]")
    if array.dtype.kind not in "biu":
        raise fail(f"{array.dtype} masks are not supported; masks hold integer class indices")
    return array


def _class_indices(values: np.ndarray, what: str, options: ConvertOptions, fail) -> np.ndarray:
    """Mapped and checked class indices as uint8; a value over 255 or the classes fails."""
    if options.mask_map is not None:
        values = _remapped(values.astype(np.int64), options.mask_map, fail)
    if values.dtype != np.uint8 and values.size and (values.min() < 0 or values.max() > 255):
        raise fail(
            f"mask value {int(values.max())} does not fit in 0..255 ({what}); "
            "tfshards stores class indices as uint8; remap them with --mask-map"
        )
    if options.num_classes is not None and values.size and values.max() >= options.num_classes:
        _check_classes(values, options, fail)
    return values.astype(np.uint8, copy=False)


def _check_classes(values: np.ndarray, options: ConvertOptions, fail) -> None:
    """Values at or above num_classes, other than the ignore label, fail the pair."""
    labelled = values if options.ignore_label is None else values[values != options.ignore_label]
    if labelled.size and labelled.max() >= options.num_classes:
        high = int(labelled.max())
        count = int((labelled >= options.num_classes).sum())
        raise fail(
            f"mask value {high} is not below --num-classes {options.num_classes} "
            f"({count} pixels); remap values with --mask-map, e.g. 0:0,255:1"
        )


def _gray_palette_of_other_values(mask: Image.Image, values: np.ndarray) -> bool:
    """True when every used palette colour is a gray level and some differ from their index.

    Palette masks (VOC style) store classes as indices with colourful palettes; a
    grayscale mask written by a palette-only format (GIF) gets a gray palette in
    arbitrary order, and then the gray levels are what the author meant.
    """
    palette = mask.getpalette() or []
    indices = values[..., 0] if values.ndim == 3 else values
    used = np.flatnonzero(np.bincount(indices.ravel(), minlength=256))  # no sort, unlike unique
    colours = [tuple(palette[3 * i : 3 * i + 3]) for i in used]
    if not colours or any(len(c) < 3 or not c[0] == c[1] == c[2] for c in colours):
        return False
    return any(c[0] != i for c, i in zip(colours, used, strict=True))


def _remapped(values: np.ndarray, mask_map, fail) -> np.ndarray:
    if values.size and (values.min() < 0 or values.max() >= 2**16):
        raise fail(f"mask values outside 0..65535 cannot be remapped ({int(values.max())})")
    table = np.full(2**16, -1, dtype=np.int64)
    for source, target in mask_map:
        table[source] = target
    mapped = table[values]
    if (mapped < 0).any():
        unknown = sorted(int(v) for v in np.unique(values[mapped < 0]))[:10]
        where = "--binary-masks (0, 1, 255)" if mask_map == BINARY_MASK_MAP else "--mask-map"
        raise fail(f"mask values {unknown} are not in {where}")
    return mapped


def _resized(
    image: np.ndarray, mask: np.ndarray, size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    height, width = size
    if image.shape[:2] == (height, width):
        return image, mask
    channels = image.shape[2]
    # Smooth filter for pixels; NEAREST for masks so no new class index appears at edges.
    if image.dtype == np.uint8 and channels in _CHANNEL_MODES:
        source = Image.fromarray(image[:, :, 0] if channels == 1 else image)
        smooth = np.asarray(source.resize((width, height), Image.Resampling.BICUBIC))
    else:  # one band at a time in floats (Pillow's "F"), rounded back into the dtype
        bands = [
            np.asarray(
                Image.fromarray(image[:, :, band].astype(np.float32), "F").resize(
                    (width, height), Image.Resampling.BICUBIC
                )
            )
            for band in range(channels)
        ]
        top = np.iinfo(image.dtype).max
        smooth = np.clip(np.rint(np.stack(bands, axis=2)), 0, top).astype(image.dtype)
    nearest = np.asarray(Image.fromarray(mask).resize((width, height), Image.Resampling.NEAREST))
    return smooth.reshape(height, width, channels), nearest


def checked_pixels(
    pair: Pair,
    image: Image.Image | np.ndarray,
    mask: Image.Image | np.ndarray,
    options: ConvertOptions,
    channels: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The stored pixels of an image and mask already decoded (a tiled source, whole or a
    window: ``converters/tiling.py``), by the checks and conversions of :func:`prepare_pair`:
    a Pillow image, or an array [H, W] / [H, W, C] of a TIFF read by tifffile or a ``.npy``."""
    with pair_stage(pair, pair.image, "image"):
        image_pixels, _ = _image_pixels(pair, _decoded(image), channels, options.image_dtype)
    with pair_stage(pair, pair.mask, "mask"):
        mask_pixels, _ = _mask_pixels(pair, _decoded(mask), options)
    return image_pixels, mask_pixels


def _decoded(pixels: Image.Image | np.ndarray) -> _Decoded:
    if isinstance(pixels, np.ndarray):
        return _Decoded(None, pixels, b"", "array", False)
    return _Decoded(pixels, None, b"", (pixels.format or "").lower(), False)
