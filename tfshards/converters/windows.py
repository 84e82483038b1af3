"""Read windows of one image file for tiling, with memory bounded whatever its size.

- TIFF and BigTIFF, tiled or striped (chunky samples; :func:`_by_windows` says which):
  read by ``tifffile`` one segment (tile or strip) at a time: a window decodes only the
  segments it touches, and the segments of the current row of tiles are kept until the
  next row starts below them, so memory holds about one band of the image, never the
  image.
- Everything else (PNG, JPEG, ..., TIFFs whose samples are stored as separate planes,
  and TIFFs where ``tifffile`` is not installed): decoded whole, once, by Pillow or
  ``tifffile``, after checking the decoded size against ``decode_limit``
  (``--decode-limit``); the error names the limit when it is exceeded. Pillow's
  pixel limit (its decompression-bomb guard) is replaced by this stated bound.

Windows come back as Pillow images (mode L, RGB or RGBA for 8-bit pixels) or as arrays
(16-bit or multi-band pixels, ``.npy`` files, multi-page TIFFs, read as
``deep_files`` reads them whole), which the shard job checks and converts as it does
whole images (``validation.checked_pixels``). A ``.npy`` file is memory-mapped: its
windows are read from the file, the array never whole in memory. A multi-page TIFF
(bands as pages) is decoded whole, within the decode limit.
The TIFF ``Orientation`` tag is not applied to TIFFs read by windows.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
from PIL import Image, ImageOps

from tfshards import storage
from tfshards.converters import deep_files
from tfshards.schemas.tiles import Window
from tfshards.storage import Location, StorageOptions

TIFF_SUFFIXES = (".tif", ".tiff")
LIMIT_OPTION = "--decode-limit (decode_limit=)"


class WindowError(Exception):
    """A file cannot be read by windows; the shard job makes it a PairError for its pair."""


class WindowSource(Protocol):
    height: int
    width: int

    def read(self, window: Window) -> Image.Image | np.ndarray: ...


def header(
    path: Location, store: StorageOptions = None, mask: bool = False
) -> tuple[int, int, bool]:
    """(height, width, read by windows?) of an image (or a ``mask``) from its header."""
    if _is_tiff(path) and _tifffile() is not None:
        with _opened_tiff(path, store) as tiff:
            page = tiff.pages.first
            windowed = _by_windows(tiff, page, mask)
            return int(page.imagelength), int(page.imagewidth), windowed
    with (
        storage.open_file(path, "rb", store) as handle,
        no_pixel_limit(),
        Image.open(handle) as image,
    ):
        return image.height, image.width, False


@contextlib.contextmanager
def window_source(
    path: Location, limit: int, store: StorageOptions = None, mask: bool = False
) -> Iterator[WindowSource]:
    """A source of windows of the image (or ``mask``) at ``path`` (module docstring)."""
    if deep_files.is_npy(path):
        yield WholeArray(_npy_pixels(path, limit, store))
        return
    if _is_tiff(path) and _tifffile() is not None:
        with _opened_tiff(path, store) as tiff:
            page = tiff.pages.first
            if len(tiff.series[0].pages) > 1:  # bands as pages: the series decoded whole
                yield WholeArray(_tiff_series(tiff, limit))
            elif _by_windows(tiff, page, mask):
                yield TiffWindows(tiff, page, _file_size(path, store), limit)
            elif deep_files.pillow_reads(tiff):  # colours Pillow converts: as whole images
                yield WholeImage(_pillow_image(path, limit, store))
            else:  # separate planes: decoded whole
                pixels = _tiff_pixels(page, path, limit)
                yield WholeArray(pixels) if isinstance(pixels, np.ndarray) else WholeImage(pixels)
        return
    yield WholeImage(_pillow_image(path, limit, store))


def _by_windows(tiff: Any, page: Any, mask: bool) -> bool:
    """Whether a TIFF is read by windows: its samples are chunky (or one), and they are the
    pixels the whole-image path gives. A TIFF Pillow reads (8 bits, 1 to 4 samples) is
    converted by Pillow when whole: its palette, CMYK, min-is-white, bilevel, gray and
    alpha or premultiplied RGBA samples become other values or bands, so such a TIFF is
    decoded by Pillow here too; only 8-bit gray, RGB and (unassociated) RGBA samples are
    the pixels as stored, and a mask's palette indices (its classes, as Pillow reads them)."""
    if page.planarconfig != 1 and page.samplesperpixel != 1:
        return False
    if not deep_files.pillow_reads(tiff):
        return True  # 16-bit or multi-band: stored samples in both paths (deep_files)
    gray = page.photometric in ((1, 3) if mask else (1,)) and page.samplesperpixel == 1
    # RGB, or RGBA of unassociated alpha (premultiplied samples are not the pixels);
    # JPEG-compressed YCbCr (slide scanners') is decoded to RGB by tifffile, as by Pillow
    rgb = page.photometric == 2 or (page.photometric == 6 and page.compression == 7)
    alpha = tuple(page.extrasamples) == (2,)
    colour = rgb and (page.samplesperpixel == 3 or alpha)
    return page.bitspersample == 8 and (gray or colour)


def _npy_pixels(path: Location, limit: int, store: StorageOptions) -> np.ndarray:
    """A ``.npy`` image: memory-mapped where it is a local file (windows read from disk),
    else read whole within the decode limit."""
    if not storage.is_url(path):
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    else:
        size = _file_size(path, store)
        _check_limit(1, 1, size or 0, limit)
        array = deep_files.array_of(storage.read_bytes(path, store), path)
    if array.ndim not in (2, 3) or 0 in array.shape:
        raise WindowError(f"a {array.ndim}-D array of shape {array.shape}; images are 2-D or 3-D")
    return array


def _tiff_series(tiff: Any, limit: int) -> np.ndarray:
    series = tiff.series[0]
    _check_limit(1, 1, int(np.prod(series.shape)) * series.dtype.itemsize, limit)
    return deep_files.tiff_bands_last(series.asarray(), series.axes)


def middle_window(path: Location, store: StorageOptions = None, size: int = 1024) -> np.ndarray:
    """Pixels of a ``size`` x ``size`` window in the middle of a large tiled or striped TIFF,
    read by windows (a sample of a mask too large to decode); WindowError for any other
    file, which would be decoded whole."""
    if not _is_tiff(path) or _tifffile() is None:
        raise WindowError("only TIFFs are sampled by windows")
    with window_source(path, 2**28, store, mask=True) as source:
        if not isinstance(source, TiffWindows):
            raise WindowError("its samples are separate planes")
        height, width = min(size, source.height), min(size, source.width)
        window = Window((source.height - height) // 2, (source.width - width) // 2, height, width)
        return np.asarray(source.read(window))


class WholeArray:
    """An array [H, W] or [H, W, C] (a memory-mapped ``.npy``, a multi-page TIFF); windows
    are slices of it. A ``.npy`` of (bands, H, W) is told by its mask (``bands_by_mask``)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.height, self.width = array.shape[0], array.shape[1]

    def bands_by_mask(self, height: int, width: int) -> None:
        self.array = deep_files.bands_last(self.array, (height, width))
        self.height, self.width = self.array.shape[0], self.array.shape[1]

    def read(self, window: Window) -> np.ndarray:
        rows, columns = slice(window.row, window.bottom), slice(window.column, window.right)
        return np.ascontiguousarray(self.array[rows, columns])


class WholeImage:
    """An image decoded once; windows are crops of it."""

    def __init__(self, image: Image.Image) -> None:
        self.image = image
        self.height, self.width = image.height, image.width

    def read(self, window: Window) -> Image.Image:
        box = (window.column, window.row, window.right, window.bottom)
        if box == (0, 0, self.width, self.height):
            return self.image
        return self.image.crop(box)


class TiffWindows:
    """Windows of a tiled or striped TIFF page, decoded segment by segment."""

    def __init__(self, tiff: Any, page: Any, file_bytes: int | None, limit: int) -> None:
        self.tiff, self.page = tiff, page
        self.height, self.width = int(page.imagelength), int(page.imagewidth)
        self.samples = int(page.samplesperpixel)
        if page.is_tiled:
            self.seg_height, self.seg_width = int(page.tilelength), int(page.tilewidth)
        else:
            self.seg_height, self.seg_width = min(int(page.rowsperstrip), self.height), self.width
        self.across = math.ceil(self.width / self.seg_width)
        self.decode = page.decode
        self.cache: dict[int, np.ndarray | None] = {}
        _check_segments(page, file_bytes)
        # One strip of a whole image (a TIFF written without tiles or strips) is decoded
        # whole: the decode limit applies to it.
        _check_limit(self.seg_height, self.seg_width, self.samples * page.dtype.itemsize, limit)

    def read(self, window: Window) -> Image.Image:
        out = np.zeros((window.height, window.width, self.samples), self.page.dtype)
        for down in range(window.row // self.seg_height, _ceil_div(window.bottom, self.seg_height)):
            for across in range(
                window.column // self.seg_width, _ceil_div(window.right, self.seg_width)
            ):
                self._place(down * self.across + across, down, across, window, out)
        self._forget_above(window.row)
        return _as_image(out)

    def _place(self, index: int, down: int, across: int, window: Window, out: np.ndarray) -> None:
        segment = self._segment(index)
        if segment is None:  # a sparse file's empty segment: zeros
            return
        top, left = down * self.seg_height, across * self.seg_width
        rows = slice(max(window.row, top), min(window.bottom, top + segment.shape[0]))
        cols = slice(max(window.column, left), min(window.right, left + segment.shape[1]))
        out[rows.start - window.row : rows.stop - window.row,
            cols.start - window.column : cols.stop - window.column] = segment[
            rows.start - top : rows.stop - top, cols.start - left : cols.stop - left
        ]  # fmt: skip

    def _segment(self, index: int) -> np.ndarray | None:
        if index not in self.cache:
            page = self.page
            data = None
            if page.databytecounts[index]:
                handle = self.tiff.filehandle
                handle.seek(page.dataoffsets[index])
                data = handle.read(page.databytecounts[index])
            try:
                segment = self.decode(data, index, jpegtables=page.jpegtables)[0]
            except Exception as exc:  # noqa: BLE001 - whatever the codec raised
                raise WindowError(f"segment {index} does not decode ({exc})") from exc
            self.cache[index] = None if segment is None else segment[0]
        return self.cache[index]

    def _forget_above(self, row: int) -> None:
        """Drop segments that end above ``row``: later windows (grid order) start lower."""
        for index in [i for i in self.cache if (i // self.across + 1) * self.seg_height <= row]:
            del self.cache[index]


def _check_segments(page: Any, file_bytes: int | None) -> None:
    """A truncated file is refused before any window is written: each segment must lie
    within the file."""
    offsets = np.asarray(page.dataoffsets, np.int64)
    counts = np.asarray(page.databytecounts, np.int64)
    expected = math.ceil(page.imagelength / (page.tilelength if page.is_tiled else max(
        min(page.rowsperstrip, page.imagelength), 1))) * (
        math.ceil(page.imagewidth / page.tilewidth) if page.is_tiled else 1
    )  # fmt: skip
    if len(offsets) < expected:
        raise WindowError(f"{len(offsets)} segments listed, the image needs {expected}")
    ends = offsets + counts
    if file_bytes is not None and ends.size and int(ends.max()) > file_bytes:
        raise WindowError(
            f"truncated: a segment ends at byte {int(ends.max())}, past the file's end "
            f"({file_bytes} bytes)"
        )


def _ceil_div(value: int, step: int) -> int:
    return -(-value // step)


def _as_image(pixels: np.ndarray) -> Image.Image | np.ndarray:
    """Window pixels [H, W, samples] as Pillow holds them for 8-bit gray, RGB or RGBA
    (checked and converted as whole images are); others (16-bit, multi-band) as arrays."""
    if pixels.dtype == np.uint8 and pixels.shape[2] == 1:
        return Image.fromarray(np.ascontiguousarray(pixels[:, :, 0]))
    if pixels.dtype == np.uint8 and pixels.shape[2] in (3, 4):
        return Image.fromarray(np.ascontiguousarray(pixels))
    return pixels[:, :, 0] if pixels.shape[2] == 1 else pixels


def _tiff_pixels(page: Any, path: Location, limit: int) -> Image.Image | np.ndarray:
    """A TIFF page that cannot be read by windows (separate planes), decoded whole."""
    _check_limit(page.imagelength, page.imagewidth, page.samplesperpixel * page.dtype.itemsize,
                 limit)  # fmt: skip
    pixels = page.asarray()
    if pixels.ndim == 3 and pixels.shape[0] == page.samplesperpixel:  # separate: planes first
        pixels = np.moveaxis(pixels, 0, -1)
    return _as_image(pixels.reshape(page.imagelength, page.imagewidth, -1))


def _pillow_image(path: Location, limit: int, store: StorageOptions) -> Image.Image:
    with storage.open_file(path, "rb", store) as handle, no_pixel_limit():
        deep_files.check_png_depth(handle.read(26))
        handle.seek(0)
        image = Image.open(handle)
        bands = len(image.getbands())
        depth = 2 if image.mode.startswith("I;16") else 4 if image.mode in ("I", "F") else 1
        _check_limit(image.height, image.width, bands * depth, limit)
        image.load()
    if image.getexif().get(0x0112, 1) not in (1, None):
        image = ImageOps.exif_transpose(image)  # as validation.py does for whole pairs
    return image


def _check_limit(height: int, width: int, pixel_bytes: int, limit: int) -> None:
    """Checked before decoding: the pixels decoded at once must fit the stated bound."""
    needed = int(height) * int(width) * int(pixel_bytes)
    if needed > limit:
        raise WindowError(
            f"{height}x{width} (HxW) decoded at once takes {_size(needed)}, over the decode "
            f"limit of {_size(limit)} ({LIMIT_OPTION}); this file is decoded whole (or in "
            "strips this large): save it as a tiled TIFF (read by windows) or raise the limit"
        )


def _size(size: int) -> str:
    """A size in the unit that tells it apart from the limit (a small --decode-limit read
    "0.00 GiB, over the decode limit of 0.00 GiB")."""
    if size < 2**20:
        return f"{size} bytes"
    return f"{size / 2**20:.1f} MiB" if size < 2**30 else f"{size / 2**30:.2f} GiB"


@contextlib.contextmanager
def no_pixel_limit():
    """Pillow's decompression-bomb guard off while a file is opened: the decode limit,
    checked before decoding, takes its place."""
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def _is_tiff(path: Location) -> bool:
    return str(path).lower().endswith(TIFF_SUFFIXES)


def _tifffile() -> Any:
    try:
        import tifffile
    except ImportError:
        return None
    return tifffile


@contextlib.contextmanager
def _opened_tiff(path: Location, store: StorageOptions) -> Iterator[Any]:
    tifffile = _tifffile()
    with storage.open_file(path, "rb", store) as handle:
        try:
            tiff = tifffile.TiffFile(handle)
            if not len(tiff.pages):
                tiff.close()
                raise ValueError("it holds no image")
            tiff.pages.first  # noqa: B018 - read now: a broken first page is the file's error
        except Exception as exc:  # noqa: BLE001 - tifffile's errors for a broken header
            raise WindowError(f"not a readable TIFF ({type(exc).__name__}: {exc})") from exc
        with tiff:
            yield tiff


def _file_size(path: Location, store: StorageOptions) -> int | None:
    if storage.is_url(path):
        return None
    return os.stat(path).st_size
