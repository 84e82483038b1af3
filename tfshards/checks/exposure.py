"""What one epoch shows the model under a sampling: each class's share of the pixels and
of the records, from the per-record table alone (no pixel is read), beside the uniform
order (every record read once).

Shares are expectations over epochs: record ``i`` appears ``e_i`` times on average
(``Selection.expected``), so class ``c`` gets ``sum_i e_i * pixels[i, c]`` pixels and is
held by ``sum_i e_i * [c in i]`` of the epoch's records. Whole records are counted:
with ``crop_size`` a crop holds part of its record, and crops centred on a class hold
more of it than this says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfshards.readers.sampling import Selection
from tfshards.readers.selection import select
from tfshards.schemas.record_table import RecordTable
from tfshards.storage import Location, StorageOptions


@dataclass(frozen=True)
class Exposure:
    """Per class: expected pixels and share of records per epoch, sampled and uniform."""

    epoch_records: int
    pixels: np.ndarray  # float64 [classes]: expected pixels per epoch under the sampling
    record_share: np.ndarray  # share of an epoch's records holding each class
    uniform_pixels: np.ndarray  # every record (of the subset) once
    uniform_record_share: np.ndarray

    @property
    def pixel_share(self) -> np.ndarray:
        return self.pixels / max(self.pixels.sum(), 1e-300)

    @property
    def uniform_pixel_share(self) -> np.ndarray:
        return self.uniform_pixels / max(self.uniform_pixels.sum(), 1e-300)

    def describe(self) -> str:
        lines = [
            f"one epoch of {self.epoch_records} records, sampled vs every record once:",
            "class  pixels sampled  uniform   records sampled  uniform",
        ]
        for klass in range(len(self.pixels)):
            pixels = f"{self.pixel_share[klass]:14.2%}  {self.uniform_pixel_share[klass]:7.2%}"
            held = f"{self.record_share[klass]:15.2%}  {self.uniform_record_share[klass]:7.2%}"
            lines.append(f"{klass:5d}  {pixels}   {held}")
        return "\n".join(lines)


def exposure_of(table: RecordTable, selection: Selection) -> Exposure:
    """The exposure of ``selection`` over ``table`` (see the module docstring)."""
    expected = selection.expected()
    uniform = np.zeros(len(table))
    uniform[selection.subset if selection.subset is not None else slice(None)] = 1.0
    owner = np.repeat(np.arange(len(table)), np.diff(table.class_ends.astype(np.int64), prepend=0))
    ids, counts = table.class_ids.astype(np.int64), table.class_counts.astype(np.float64)
    classes = table.num_classes

    def per_class(weights: np.ndarray, values: np.ndarray | float) -> np.ndarray:
        return np.bincount(ids, weights=weights[owner] * values, minlength=classes)

    return Exposure(
        epoch_records=selection.epoch_size,
        pixels=per_class(expected, counts),
        record_share=per_class(expected, 1.0) / selection.epoch_size,
        uniform_pixels=per_class(uniform, counts),
        uniform_record_share=per_class(uniform, 1.0) / max(uniform.sum(), 1),
    )


def exposure(
    path: Location,
    split: str = "train",
    *,
    records: Any = None,
    sampling: Any = None,
    epoch_size: int | None = None,
    storage_options: StorageOptions = None,
    label_map: Any = None,
) -> Exposure:
    """Each class's share of pixels and records in one epoch of ``read(path, split=split,
    records=..., sampling=..., epoch_size=..., label_map=...)``, beside every record once.

    >>> balanced = tfshards.ClassBalanced(exclude=[0])
    >>> print(tfshards.exposure("shards/", sampling=balanced).describe())  # doctest: +SKIP
    """
    from tfshards.arguments import checked_path
    from tfshards.errors import OptionsError
    from tfshards.readers.shards import split_shards
    from tfshards.sources.record_tables import split_table

    if isinstance(path, Mapping):
        raise OptionsError("exposure() reads one dataset; for several, tfshards.mix_exposure(...)")
    checked_path("path", path)
    shards = split_shards(path, split, storage_options=storage_options)
    table = split_table(shards, storage_options=storage_options)
    if label_map is not None:  # as read() takes it, or resolved (readers/labels.py)
        from tfshards.readers.labels import LabelMap
        from tfshards.readers.labels import label_map as resolved

        if not isinstance(label_map, LabelMap):
            label_map = resolved(label_map, shards.manifest, where=str(path))
        table = label_map.table(table)
    return exposure_of(table, select(table, records, sampling, epoch_size))
