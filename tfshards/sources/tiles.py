"""``tfshards.tiles``: the tiles of one source image, in grid order, with their windows.

The records of a source are found in the split's per-record table, by key (a tile's key
is ``<source>@r<row>_c<column>``, ``schemas/tiles.py``; an untiled image's is the source
key itself), and their windows follow from the key and the table's heights and widths:
nothing is decoded to list them. Reading a tile reads its record by offset (as
``tfshards.Pairs`` does) and checks the window the record itself holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tfshards import storage
from tfshards.arguments import checked_path, checked_str
from tfshards.errors import RecordTableError
from tfshards.readers.options import ReadOptions, read_options
from tfshards.schemas.record import decode_record
from tfshards.schemas.tfrecord import parse_example
from tfshards.schemas.tiles import Window, source_size, tile_position
from tfshards.sources.pairs import Pairs
from tfshards.sources.record_tables import records


@dataclass(frozen=True)
class Tile:
    """One tile: its record's key, its window in the source, its image and mask."""

    key: str
    window: Window
    image: np.ndarray  # uint8 [height, width, channels]
    mask: np.ndarray  # uint8 [height, width]: class indices


class SourceTiles(Sequence[Tile]):
    """The tiles of one source image in grid order (row by row, left to right).

    ``windows`` lists them without reading a record; ``height`` and ``width`` are the
    source image's; ``tiles[i]`` or iterating reads the records one at a time.
    """

    def __init__(self, pairs: Pairs, source: str, indices: list[int], windows: list[Window]):
        self.pairs, self.source = pairs, source
        self.indices, self.windows = indices, windows
        self.height, self.width = source_size(windows)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index):  # noqa: ANN001 - an int or a slice, as a Sequence takes
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        record = self.indices[index]
        data = self.pairs.records.read([record])[0]
        where = f"{self.pairs.records.located(record)} (record {record})"
        try:
            features = parse_example(data)
            decoded = decode_record(features, self.pairs.manifest.image.dtype)
        except ValueError as exc:
            raise RecordTableError(f"{where}: {exc}") from exc
        window = self.windows[index]
        _check_window(features, self.source, window, where)
        return Tile(decoded.key, window, decoded.image, decoded.mask)

    def __iter__(self) -> Iterator[Tile]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return (
            f"SourceTiles({self.source!r}: {len(self)} tiles of a {self.height}x{self.width} image)"
        )


def tiles(
    path: str | os.PathLike,
    split: str = "train",
    *,
    source: str,
    options: ReadOptions | None = None,
) -> SourceTiles:
    """The tiles of the image whose key is ``source``, in grid order, with their windows.

    >>> tiles = tfshards.tiles("shards", "val", source="slide_07")  # doctest: +SKIP
    >>> stitcher = tfshards.Stitcher(tiles.height, tiles.width, classes=3,
    ...                              out="pred.npy")  # doctest: +SKIP
    >>> for tile in tiles:  # doctest: +SKIP
    ...     stitcher.add(tile.window, model.predict(tile.image[None])[0])
    >>> labels = stitcher.finish()  # a memmap of the source's size  # doctest: +SKIP

    ``options``: a ``ReadOptions`` for a dataset at a URL (as ``tfshards.Pairs`` takes).
    """
    checked_path("path", path)
    checked_str("split", split)
    checked_str("source", source)
    options = read_options(options)
    table = records(path, split, storage_options=options.storage_options, progress=False)
    found: list[tuple[int, int, int]] = []  # (row, column, record)
    named: int | None = None  # the record keyed ``source`` itself
    for index, key in enumerate(table.keys):
        position = tile_position(key)
        if position is not None and position[0] == source:
            found.append((position[1], position[2], index))
        elif key == source:
            found.append((0, 0, index))
            named = index
    pairs = Pairs(path, split, options=options)
    if named is not None and tile_position(source) is not None:  # a whole image, or a tile
        found = _without_tile_named(pairs, source, named, found)
    if not found:
        raise RecordTableError(
            f"{storage.display(path)} (split {split}): no record of source {source!r}; "
            "sources are the keys of the converted pairs (tile keys without '@r<row>_c<col>')"
        )
    found.sort()
    windows = [
        Window(row, column, int(table.heights[index]), int(table.widths[index]))
        for row, column, index in found
    ]
    return SourceTiles(pairs, source, [index for _, _, index in found], windows)


def _without_tile_named(
    pairs: Pairs, source: str, named: int, found: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """``found`` less the record keyed ``source`` where that record is a tile of another
    image (the table cannot tell it from a whole image keyed like a tile): listed, it
    would sit at window (0, 0) of a source of its size. A tile's key alone is refused,
    naming its source."""
    features = parse_example(pairs.records.read([named])[0])
    if features.get("source/key") is None:
        return found
    rest = [entry for entry in found if entry[2] != named]
    if not rest:
        held = os.fsdecode(features["source/key"])
        raise RecordTableError(
            f"source {source!r} is the key of one tile of {held!r} (row "
            f"{int(features['source/row'])}, column {int(features['source/column'])}); "
            f"pass source={held!r} for the tiles of that image"
        )
    return rest


def _check_window(features: dict, source: str, window: Window, where: str) -> None:
    """The record's own source features, where it has them, agree with its key."""
    if features.get("source/key") is None:  # a whole image
        key = os.fsdecode(features["key"])
        if key != source or (window.row, window.column) != (0, 0):
            raise RecordTableError(
                f"{where}: record {key!r} is a whole image, not a tile of {source!r} (a "
                "source key that looks like a tile's)"
            )
        return
    held = (
        os.fsdecode(features["source/key"]),
        int(features["source/row"]),
        int(features["source/column"]),
    )
    if held != (source, window.row, window.column):
        raise RecordTableError(
            f"{where}: the record holds source {held[0]!r} at row {held[1]}, column "
            f"{held[2]}, but its key says {source!r} at {window.row}, {window.column}"
        )
