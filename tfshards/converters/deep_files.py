"""Images Pillow cannot hold: 16-bit and multi-band TIFFs (through tifffile) and ``.npy``.

The rules, documented once here (and in docs/large-images.md):

- A ``.npy`` file is read by NumPy (never with pickles). A 2-D array is one band; a 3-D
  array holds its bands on the last axis, (height, width, bands), unless its last two
  axes are the mask's height and width and its first two are not: then it is
  (bands, height, width), as rasterio and GDAL read rasters.
- A TIFF (or BigTIFF) of more than 8 bits per sample, more than 4 samples per pixel, or
  more than one page is read by tifffile (the ``tiff`` extra), its first series as
  stored: no palette, orientation or photometric conversion. The bands are the one axis
  of that series other than Y and X whose length is above 1, whatever tifffile names it
  (samples of a contiguous or planar TIFF, or pages): the TIFF's own tags say which axis
  it is, never the array's sizes. A series with two such axes (pages of RGB images)
  is refused. Any other TIFF (8-bit, one page, 1 to 4 samples) is read by Pillow, as
  every other format.
- Images are uint8 or uint16; other sample types (int16, float, ...) are refused
  (``validation.py``). A file that breaks these rules raises LayoutError, which
  validation turns into a PairError naming the file and the rule.
"""

from __future__ import annotations

import io

import numpy as np

from tfshards import storage
from tfshards.storage import Location

TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic TIFF and BigTIFF
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_COLOUR_TYPES = {2: "RGB", 4: "gray and alpha", 6: "RGBA"}  # Pillow reads 16 bits as 8
_SPATIAL = frozenset("YX")


class LayoutError(ValueError):
    """A file that breaks the rules above; the caller names the file (PairError)."""


def is_npy(path: Location) -> bool:
    return storage.name(path).lower().endswith(".npy")


def is_tiff(data: bytes) -> bool:
    return data[:4] in TIFF_MAGIC


def array_of(data: bytes, path: Location) -> np.ndarray | None:
    """The pixels of a ``.npy`` file (as stored: :func:`bands_last` places its bands) or of
    a TIFF that needs tifffile (bands last: [H, W] or [H, W, C]); None when Pillow reads
    the file."""
    check_png_depth(data[:26])
    if is_npy(path):
        array = np.load(io.BytesIO(data), allow_pickle=False)
        if array.ndim not in (2, 3) or 0 in array.shape:
            raise LayoutError(
                f"a {array.ndim}-D array of shape {array.shape}; images are 2-D or 3-D "
                "arrays of at least one pixel and one band"
            )
        return array
    if not is_tiff(data):
        return None
    tifffile = _tifffile()
    if tifffile is None:
        return None  # Pillow reads what it can; validation refuses what it truncates
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        if pillow_reads(tif):
            return None
        series = tif.series[0]
        return tiff_bands_last(series.asarray(), series.axes)


def check_png_depth(head: bytes) -> None:
    """LayoutError for a PNG of 16-bit colour samples (its header's first 26 bytes): Pillow
    reads them as 8 bits, silently, and a 16-bit image is never cut to 8 bits (a mask's
    class 300 would become 1). 16-bit grayscale PNGs are read whole."""
    if head[:8] != PNG_MAGIC or head[12:16] != b"IHDR" or len(head) < 26:
        return
    depth, colour = head[24], head[25]
    if depth == 16 and colour in _PNG_COLOUR_TYPES:
        raise LayoutError(
            f"a 16-bit {_PNG_COLOUR_TYPES[colour]} PNG, which Pillow reads as 8 bits per "
            "sample; tfshards never cuts 16-bit pixels: save it as a TIFF (tifffile) or .npy"
        )


def tiff_layout(handle) -> tuple[int, str] | None:
    """(bands, dtype name) of a TIFF that needs tifffile, from its tags alone (a slide is
    not decoded to learn them); None when Pillow reads the file."""
    tifffile = _tifffile()
    if tifffile is None:
        return None
    with tifffile.TiffFile(handle) as tif:
        if pillow_reads(tif):
            return None
        series = tif.series[0]
        bands = _band_axis(series.shape, series.axes)
        return (1 if bands is None else int(series.shape[bands])), series.dtype.name


def missing_tifffile_reason() -> str | None:
    """Why a TIFF Pillow cannot read faithfully is refused, or None when tifffile is here."""
    if _tifffile() is not None:
        return None
    return "16-bit, multi-band and multi-page TIFFs need tifffile: pip install 'tfshards[tiff]'"


def _tifffile():
    try:
        import tifffile
    except ImportError:
        return None
    return tifffile


def pillow_reads(tif) -> bool:
    if not len(tif.pages):  # tifffile found no page: its header's offset is broken
        raise LayoutError("a TIFF whose header points to no readable page (corrupt)")
    page = tif.pages[0]
    return len(tif.pages) == 1 and page.bitspersample <= 8 and page.samplesperpixel <= 4


def _band_axis(shape: tuple[int, ...], axes: str) -> int | None:
    """The index of the one non-spatial axis longer than 1, None when there is none."""
    others = [i for i, axis in enumerate(axes) if axis not in _SPATIAL and shape[i] > 1]
    if len(others) > 1:
        raise LayoutError(
            f"TIFF series of axes {axes!r} and shape {tuple(shape)} has {len(others)} axes "
            "besides Y and X; tfshards takes one band axis (write one band axis, or one "
            "file per image)"
        )
    return others[0] if others else None


def tiff_bands_last(array: np.ndarray, axes: str) -> np.ndarray:
    bands = _band_axis(array.shape, axes)
    order = [axes.index("Y"), axes.index("X")] + ([] if bands is None else [bands])
    return array.transpose(order + [i for i in range(array.ndim) if i not in order]).reshape(
        [array.shape[i] for i in order]
    )


def bands_last(array: np.ndarray, mask_size: tuple[int, int] | None) -> np.ndarray:
    """A ``.npy`` array as [H, W] or [H, W, C]: (bands, H, W) when only its last two axes
    are ``mask_size`` (height, width), else bands last."""
    if array.ndim == 3 and mask_size is not None:
        first, last = tuple(array.shape[1:]), tuple(array.shape[:2])
        if first == tuple(mask_size) and last != tuple(mask_size):
            return np.moveaxis(array, 0, -1)
    return array
