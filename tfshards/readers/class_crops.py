"""Crops that find the class: the centre of each crop of a class-balanced read, taken from
the per-record table before the record is decoded.

A record drawn for class ``c`` (sampling.py) has the table's 4x4 grid of cells in which
``c`` appears. With ``ClassBalanced(crop_fraction=f)``, a share ``f`` of the crops is
centred on one of those cells (drawn among them), moved from the cell's centre by a
random offset that keeps the whole cell inside the crop; the other crops, and records
drawn for no class, are placed uniformly (``NaN`` centres, see crops.py). Every draw is
keyed by (seed, epoch, batch, position in the batch), so a batch read again, elsewhere
or resumed, gets the same crops.

A crop at least as large as a cell (a quarter of the record on each side) so holds the
whole cell, hence pixels of the class, when the record is not scaled; a smaller crop is
centred within the cell and may miss a class that fills only part of it. With
``crop_scale`` the offsets are in the record's own pixels, before scaling.
"""

from __future__ import annotations

import numpy as np

from tfshards.schemas.record_table import RecordTable

_CENTRES = 0x63656E74  # "cent": draws of their own, apart from crops.py's
DRAWS = 4  # per crop: centred or not, which cell, the row and column offsets


def class_centres(
    table: RecordTable,
    records: np.ndarray,
    classes: np.ndarray,
    fraction: float,
    crop_size: tuple[int, int],
    key: tuple[int, int, int],
    positions: np.ndarray,
) -> np.ndarray:
    """``[B, 2]`` float centres (row, column, in the record's pixels) of a batch's crops:
    on a cell of the class each record was drawn for, or NaN (placed uniformly).
    ``key``: (seed, epoch, batch); ``positions``: each crop's place in the batch."""
    centres = np.full((len(records), 2), np.nan)
    grid = table.grid
    for k, (record, klass, position) in enumerate(zip(records, classes, positions, strict=True)):
        if klass < 0:
            continue
        draws = np.random.default_rng([_CENTRES, *key, int(position)]).random(DRAWS)
        if draws[0] >= fraction:
            continue
        bits = table.cells(int(record), int(klass))
        cells = [cell for cell in range(grid * grid) if bits >> cell & 1]
        if not cells:
            continue  # a class without a cell: not in this record after all
        row, column = divmod(cells[min(int(draws[1] * len(cells)), len(cells) - 1)], grid)
        cell = (int(table.heights[record]) / grid, int(table.widths[record]) / grid)
        centres[k] = [
            (place + 0.5) * side + (draw - 0.5) * max(0.0, crop - side)
            for place, side, draw, crop in zip(
                (row, column), cell, draws[2:], crop_size, strict=True
            )
        ]
    return centres
