"""What one epoch of a mix shows: each dataset's share of the records and pixels, and each
shared class's share of the pixels and records, from the per-record tables alone (no
pixel read, no TensorFlow). Expectations over epochs, as ``exposure`` gives them for one
dataset: a source's count is the floor or ceiling of its share (mixing.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfshards.checks.exposure import exposure_of
from tfshards.storage import StorageOptions


@dataclass(frozen=True)
class MixExposure:
    """Per dataset and per shared class: what one epoch of the mix holds on average."""

    names: tuple[str, ...]
    epoch_records: int
    records: np.ndarray  # float64 [sources]: expected records of each dataset per epoch
    pixels: np.ndarray  # float64 [sources, classes]: expected pixels per epoch
    holding: np.ndarray  # float64 [sources, classes]: expected records holding each class

    @property
    def num_classes(self) -> int:
        """The shared taxonomy's classes (every source's map reads into them)."""
        return self.pixels.shape[1]

    @property
    def source_share(self) -> np.ndarray:
        return self.records / self.epoch_records

    @property
    def class_pixel_share(self) -> np.ndarray:
        total = self.pixels.sum(axis=0)
        return total / max(total.sum(), 1e-300)

    @property
    def class_record_share(self) -> np.ndarray:
        return self.holding.sum(axis=0) / self.epoch_records

    def as_dict(self) -> dict:
        """The report as JSON-ready values (``tfshards inspect --json``)."""
        classes = []
        for klass, share in enumerate(self.class_pixel_share.tolist()):
            total = max(float(self.pixels[:, klass].sum()), 1e-300)
            from_each = {n: float(self.pixels[k, klass]) / total for k, n in enumerate(self.names)}
            held = float(self.class_record_share[klass])
            classes.append({"class": klass, "pixel_share": share, "record_share": held})
            classes[-1]["pixels_from"] = from_each
        datasets = [
            {"name": n, "records": float(self.records[k]), "share": float(self.source_share[k])}
            for k, n in enumerate(self.names)
        ]
        return {"epoch_records": self.epoch_records, "datasets": datasets, "classes": classes}

    def describe(self) -> str:
        """The report as text; columns as wide as the longest name (paths, say)."""
        wide = max(7, *(len(name) for name in self.names))
        lines = [
            f"one epoch of {self.epoch_records} records, {self.num_classes} shared classes:",
            f"{'dataset':>{wide}}  records   share  pixels",
        ]
        pixels = self.pixels.sum(axis=1) / max(self.pixels.sum(), 1e-300)
        for k, name in enumerate(self.names):
            lines.append(
                f"{name:>{wide}}  {self.records[k]:7.1f}  {self.source_share[k]:6.1%}  "
                f"{pixels[k]:6.1%}"
            )
        widths = [max(7, len(name)) for name in self.names]
        lines.append("class's share of the epoch's pixels and records, and its pixels from each:")
        names = "  ".join(f"{n:>{w}}" for n, w in zip(self.names, widths, strict=True))
        lines.append(f"class  pixels  records  {names}")
        for klass, share in enumerate(self.class_pixel_share):
            from_each = self.pixels[:, klass] / max(self.pixels[:, klass].sum(), 1e-300)
            parts = "  ".join(f"{v:{w}.1%}" for v, w in zip(from_each, widths, strict=True))
            lines.append(
                f"{klass:5d}  {share:6.1%}  {self.class_record_share[klass]:7.1%}  {parts}"
            )
        return "\n".join(lines)


def mix_exposure(
    sources: Mapping[str, Any],
    *,
    weights: Any,
    epoch_size: int | None = None,
    split: str = "train",
    num_classes: int | None = None,
    storage_options: StorageOptions = None,
) -> MixExposure:
    """One epoch of ``read(sources, weights=..., epoch_size=..., split=...)``, per dataset
    and per shared class (see :class:`MixExposure`); a dataset's share of a class's
    pixels is in ``pixels[:, class]``.

    >>> report = tfshards.mix_exposure({"a": "a/", "b": "b/"}, weights=[1, 1])  # doctest: +SKIP
    >>> print(report.describe())  # doctest: +SKIP
    """
    from tfshards.readers.mixing import (
        check_distinct,
        mix_epoch_size,
        mix_shares,
        naming,
        resolved_maps,
        sources_of,
    )
    from tfshards.readers.selection import select
    from tfshards.readers.shards import split_shards
    from tfshards.sources.record_tables import split_table

    given = sources_of(sources)
    shares = mix_shares(weights, list(given))
    shards = {}
    for name, source in given.items():
        with naming(name):
            shards[name] = split_shards(
                source.path, source.split or split, storage_options=storage_options
            )
    check_distinct(shards)
    maps = resolved_maps(given, {n: s.manifest for n, s in shards.items()}, num_classes)
    tables, selections = {}, {}
    for name, source in given.items():
        table = split_table(shards[name], storage_options=storage_options)
        tables[name] = table if maps[name] is None else maps[name].table(table)
        with naming(name):  # its records= or sampling=
            selections[name] = select(tables[name], source.records, source.sampling, None)
    size = mix_epoch_size(epoch_size, list(selections.values()), shares)
    classes = max(t.num_classes for t in tables.values())
    pixels, holding = np.zeros((len(given), classes)), np.zeros((len(given), classes))
    for k, name in enumerate(given):
        one = exposure_of(tables[name], selections[name])
        scale = shares[k] * size / selections[name].epoch_size
        pixels[k, : len(one.pixels)] = one.pixels * scale
        holding[k, : len(one.pixels)] = one.record_share * selections[name].epoch_size * scale
    return MixExposure(tuple(given), size, shares * size, pixels, holding)
