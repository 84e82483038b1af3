"""Tile geometry: where the tiles of an image lie, and how a tile's record is named.

Pure functions, no I/O; the converter (``converters/tiling.py``), ``tfshards.tiles``
and the stitcher share them.

Along each axis of length ``L``, tiles of ``T`` pixels start at 0 and step ``T - O``
(``O``: the overlap); the last tile is shifted inward to end at the edge (``L - T``),
so every pixel is covered and no tile is padded or cut. An axis shorter than the tile
holds one tile of the axis's own length. Tiles are listed in grid order: row by row,
left to right.

A tile's record key is ``<source key>@r<row>_c<column>`` (the window's top-left pixel
in the source image); the record also holds its source key and window as features
(``schemas/record.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tfshards.arguments import checked_int
from tfshards.errors import OptionsError

TILE_SMALLER = ("keep", "fail")  # an image smaller than the tile: one tile of its size, or fail
_TILE_KEY = re.compile(r"(?P<source>.*)@r(?P<row>\d+)_c(?P<column>\d+)\Z", re.DOTALL)


@dataclass(frozen=True)
class Window:
    """A rectangle of a source image, in pixels: top row, left column, height, width."""

    row: int
    column: int
    height: int
    width: int

    def __post_init__(self) -> None:
        for name in ("row", "column"):
            checked_int(name, getattr(self, name), low=0)
        for name in ("height", "width"):
            checked_int(name, getattr(self, name), low=1)

    @property
    def bottom(self) -> int:
        return self.row + self.height

    @property
    def right(self) -> int:
        return self.column + self.width

    @property
    def slices(self) -> tuple[slice, slice]:
        """``array[window.slices]``: the window's pixels of a source-sized array."""
        return slice(self.row, self.bottom), slice(self.column, self.right)


def check_tiling(tile_size: int | None, overlap: int, smaller: str) -> None:
    """OptionsError unless ``tile_size`` (None: no tiling) and ``overlap`` make a grid."""
    checked_int("tile_size", tile_size, low=1, none=True)
    checked_int("tile_overlap", overlap, low=0)
    if smaller not in TILE_SMALLER:
        raise OptionsError(
            f"tile_smaller must be one of {', '.join(TILE_SMALLER)}; got {smaller!r}"
        )
    if tile_size is None:
        if overlap:
            raise OptionsError(f"tile_overlap {overlap} needs a tile_size (--tile)")
        return
    if overlap >= tile_size:
        raise OptionsError(
            f"tile_overlap must be smaller than tile_size, got overlap {overlap} for tiles of "
            f"{tile_size}: tiles would not advance"
        )


def axis_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Where the tiles along an axis of ``length`` pixels start (the last shifted inward)."""
    if length <= tile:
        return [0]
    step = tile - overlap
    starts = list(range(0, length - tile, step))
    starts.append(length - tile)
    return starts


def grid_windows(
    height: int, width: int, tile: int, overlap: int, *, rows: list[int] | None = None
) -> list[Window]:
    """The windows covering a ``height`` x ``width`` image, in grid order (``rows``: only
    the windows starting at these rows, a band of ``axis_starts(height, ...)``).

    >>> [(w.row, w.column) for w in grid_windows(70, 100, 32, 8)][:4]
    [(0, 0), (0, 24), (0, 48), (0, 68)]
    """
    tile_height, tile_width = min(tile, height), min(tile, width)
    return [
        Window(row, column, tile_height, tile_width)
        for row in (axis_starts(height, tile, overlap) if rows is None else rows)
        for column in axis_starts(width, tile, overlap)
    ]


def tile_key(source: str, window: Window) -> str:
    return f"{source}@r{window.row}_c{window.column}"


def tile_position(key: str) -> tuple[str, int, int] | None:
    """(source key, row, column) of a tile's key, or None for a key of no tile."""
    match = _TILE_KEY.match(key)
    if match is None:
        return None
    return match.group("source"), int(match.group("row")), int(match.group("column"))


def source_size(windows: list[Window]) -> tuple[int, int]:
    """(height, width) of the image that tiles ``windows`` cover (they reach its edges)."""
    return max(w.bottom for w in windows), max(w.right for w in windows)
