"""The records of one pair: the pair whole, or its tiles (docs/large-images.md).

- ``tile_size`` given: every pair is cut into tiles (``schemas/tiles.py``): each tile a
  record keyed ``<key>@r<row>_c<column>``, in grid order, holding its source key and
  window. An image smaller than the tile along an axis holds one tile of its own length
  there (``tile_smaller="keep"``), or fails its pair (``"fail"``).
- No ``tile_size``: a pair is one record, unless its image has more pixels than Pillow's
  limit (``PIL.Image.MAX_IMAGE_PIXELS``, about 89 million: such an image decoded whole
  would be refused as a decompression bomb, and as one record it would be hundreds of
  MB to read for every crop). Then it is cut into ``AUTO_TILE`` tiles without overlap,
  and the conversion says so (``convert.py``). Nothing that fits on disk is refused.

A pair's split follows its key (no tile of an image in train and another in val). The
tiles of a pair go to its shard, one after another, except for an image and mask read
by windows, cut into bands of tile rows (:func:`planned_bands`) so that several shard
jobs convert one large image; an image decoded whole is one unit, decoded once. The
shard job stays the unit of crash safety and ``--resume``.
Tiles are all kept, background or not: sampling weighs them from the per-record table
(docs/large-images.md says why).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from tfshards import storage
from tfshards.converters.deep_files import LayoutError
from tfshards.converters.options import ConvertOptions
from tfshards.converters.pair_table import PairTable
from tfshards.converters.pairing import Pair
from tfshards.converters.validation import PreparedPair, checked_pixels, prepare_pair
from tfshards.converters.windows import WholeArray, WindowError, header, window_source
from tfshards.errors import PairError
from tfshards.schemas.format import SourceFile, itemsize
from tfshards.schemas.tiles import Window, axis_starts, grid_windows, tile_key
from tfshards.storage import Location, StorageOptions

AUTO_TILE = 1024  # tiles of an image too large for one record, when no tile size is given
WHOLE = (0, 2**31)  # the band of every tile row: a pair not cut into bands
_NO_SOURCE = SourceFile(b"", "", False)  # a tile's pixels are encoded anew


@dataclass(frozen=True)
class PairRecord:
    """One record of a pair: the pair whole (``window`` None) or one of its tiles."""

    prepared: PreparedPair
    source: str
    window: Window | None = None
    auto_tiled: bool = False  # a tile of an image too large for one record
    source_bytes: int = 0  # a tile: its band's share of the pair's file bytes (progress)


def pair_records(
    pair: Pair,
    options: ConvertOptions,
    channels: int,
    store: StorageOptions = None,
    prepare: Callable[..., PreparedPair] = prepare_pair,
    band: tuple[int, int] | None = None,
) -> Iterator[PairRecord]:
    """The records of ``pair``, in order; PairError (naming the file) for a bad pair.
    ``prepare``: how a whole pair is decoded and checked (``validation.prepare_pair``).
    ``band``: only the tiles of these grid rows [first, end) (see :func:`planned_bands`)."""
    if options.tile_size is not None:
        tile, overlap = options.tile_size, options.tile_overlap
        yield from _tiles(pair, options, channels, store, tile, overlap, band)
        return
    if not _too_large(pair, pair.image, store):
        try:
            prepared = prepare(pair, options, channels, store)
        except PairError as exc:
            if not _over_pixel_limit(exc):
                raise
        else:
            yield PairRecord(prepared, pair.key)
            return
    for record in _tiles(pair, options, channels, store, AUTO_TILE, 0):
        yield replace(record, auto_tiled=True)


def _tiles(
    pair: Pair,
    options: ConvertOptions,
    channels: int,
    store: StorageOptions,
    tile: int,
    overlap: int,
    band: tuple[int, int] | None = None,
) -> Iterator[PairRecord]:
    limit = options.decode_limit
    with (
        _opened(pair, pair.image, "image", limit, store) as image,
        _opened(pair, pair.mask, "mask", limit, store) as mask,
    ):
        if isinstance(image, WholeArray):  # a .npy's bands: first or last, told by its mask
            image.bands_by_mask(mask.height, mask.width)
        _check_sizes(pair, image, mask, tile, options.tile_smaller)
        every = axis_starts(image.height, tile, overlap)
        rows = every if band is None else every[band[0] : band[1]]
        read = _file_bytes(pair, store) * len(rows) // len(every)
        for window in grid_windows(image.height, image.width, tile, overlap, rows=rows):
            with _stage(pair, pair.image, "image"):
                image_window = image.read(window)
            with _stage(pair, pair.mask, "mask"):
                mask_window = mask.read(window)
            pixels, labels = checked_pixels(pair, image_window, mask_window, options, channels)
            prepared = PreparedPair(
                tile_key(pair.key, window), pixels, labels, _NO_SOURCE, _NO_SOURCE
            )
            yield PairRecord(prepared, pair.key, window, source_bytes=read)


def _file_bytes(pair: Pair, store: StorageOptions) -> int:
    """Bytes of the pair's two files, for the progress bar (0 for files in a bucket)."""
    if storage.is_url(pair.image) or storage.is_url(pair.mask):
        return 0
    return os.stat(pair.image).st_size + os.stat(pair.mask).st_size


def _check_sizes(pair: Pair, image, mask, tile: int, smaller: str) -> None:
    if (image.height, image.width) != (mask.height, mask.width):
        raise PairError(
            pair.key,
            str(pair.mask),
            "mask",
            f"mask is {mask.height}x{mask.width} (HxW) but image {pair.image} is "
            f"{image.height}x{image.width}",
        )
    if smaller == "fail" and min(image.height, image.width) < tile:
        raise PairError(
            pair.key,
            str(pair.image),
            "image",
            f"image is {image.height}x{image.width} (HxW), smaller than the tile size {tile} "
            "(--tile-smaller fail); with --tile-smaller keep it is one tile of its own size",
        )


class _stage:
    """Errors while reading one file's windows become the pair's PairError."""

    def __init__(self, pair: Pair, path: Location, field: str) -> None:
        self.pair, self.path, self.field = pair, path, field

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:  # noqa: ANN001 - the protocol's
        if (
            exc is None
            or isinstance(exc, PairError | MemoryError)
            or not isinstance(exc, Exception)
        ):
            return False
        plain = isinstance(exc, WindowError | LayoutError)
        reason = str(exc) if plain else f"{type(exc).__name__}: {exc}"
        raise PairError(self.pair.key, str(self.path), self.field, reason) from exc


class _opened:
    """A window source for one file of a pair, its failures the pair's PairError."""

    def __init__(
        self, pair: Pair, path: Location, field: str, limit: int, store: StorageOptions
    ) -> None:
        self.stage = _stage(pair, path, field)
        self.context = window_source(path, limit, store, mask=field == "mask")

    def __enter__(self):
        with self.stage:
            return self.context.__enter__()

    def __exit__(self, kind, exc, traceback) -> bool:  # noqa: ANN001 - the protocol's
        return bool(self.context.__exit__(kind, exc, traceback))


def _too_large(pair: Pair, path: Location, store: StorageOptions) -> bool:
    """A TIFF over Pillow's pixel limit, known from its header (it is not read whole)."""
    if not str(path).lower().endswith((".tif", ".tiff")) or Image.MAX_IMAGE_PIXELS is None:
        return False
    with _stage(pair, path, "image"):
        height, width, _ = header(path, store)
    return height * width > Image.MAX_IMAGE_PIXELS


def _over_pixel_limit(error: PairError) -> bool:
    cause = error.__cause__
    return error.field == "image" and isinstance(
        cause, Image.DecompressionBombError | Image.DecompressionBombWarning
    )


def planned_bands(
    pairs: PairTable, options: ConvertOptions, channels: int, store: StorageOptions = None
) -> tuple[PairTable, np.ndarray, np.ndarray]:
    """The units of a tiled conversion's plan: (pairs, each one's band of tile rows
    [first, end), its estimated bytes), a pair listed once per band.

    A pair whose image and mask are both read by windows (``converters/windows.py``) is
    cut into bands of tile rows of about ``shard_size`` bytes each, so that the shards
    of one large image are written by all the workers; any other pair (decoded whole, or
    unreadable: its shard reports it) is one unit. Sizes come from the headers alone.
    """
    units, bands, sizes = [], [], []
    tile, overlap = options.tile_size, options.tile_overlap
    for index, pair in enumerate(pairs):
        try:
            height, width, windowed = header(pair.image, store)
            windowed = windowed and header(pair.mask, store, mask=True)[2]
        except Exception:  # noqa: BLE001 - an unreadable file fails its pair when converted
            units.append(index), bands.append(WHOLE), sizes.append(tile * tile * 4)
            continue
        rows = len(axis_starts(height, tile, overlap))
        row_bytes = min(tile, height) * width * (channels * itemsize(options.image_dtype) + 1)
        step = rows if not windowed else max(1, options.shard_size // max(row_bytes, 1))
        for first in range(0, rows, step):
            end = min(first + step, rows)
            units.append(index), sizes.append(row_bytes * (end - first))
            bands.append(WHOLE if step >= rows else (first, end))
    return (
        pairs.subset(np.asarray(units, np.int64)),
        np.asarray(bands, np.int64).reshape(-1, 2),
        np.asarray(sizes, np.int64),
    )
