"""Label maps: a dataset's classes onto a shared taxonomy, at read time, without reconverting.

    label_map={3: 1, 4: None}    source class 3 read as class 1, class 4 as the ignore label;
                                 every class not named keeps its index
    label_map=[0, 1, 1, None]    the same as a list: one shared class (or None) per class
    unannotated=[5]              (a mixed source) shared classes this source never labelled:
                                 pixels that map to them become the ignore label

A map is a lookup table over mask values (``LabelMap.lookup``), applied to each batch's
masks after they are decoded (and after the cache, which keeps the masks as stored, so
one cache serves any map). The source's ignore label, and the padding value of crops
and pads, map to the shared ignore label. Counts (the manifest's pixels per class, the
per-record table) are remapped by the same table, so ``info``, ``class_weights`` and
class-balanced sampling see the shared classes. No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfshards.errors import OptionsError
from tfshards.schemas.manifest import Manifest
from tfshards.schemas.record_table import RecordTable, smallest_unsigned

IGNORED = -1  # a lookup entry: the pixel becomes the shared ignore label
MASK_VALUES = 256  # masks are stored as uint8: every value has an entry
# readers/sizing.py's DEFAULT_PAD_LABEL (which imports TensorFlow; info() does not)
DEFAULT_PAD_LABEL = 255


@dataclass(frozen=True, eq=False)
class LabelMap:
    """One source's resolved map: ``lookup[v]`` is the shared class of mask value ``v``
    (IGNORED: the ignore label); ``num_classes`` the shared taxonomy's size; ``ignore``
    the value ignored pixels take in the masks read."""

    lookup: np.ndarray  # int64 [MASK_VALUES]
    num_classes: int
    ignore: int
    source_classes: int

    def values(self) -> np.ndarray:
        """int32 [MASK_VALUES]: the value each stored mask value is read as."""
        return np.where(self.lookup == IGNORED, self.ignore, self.lookup).astype(np.int32)

    def class_pixels(self, pixels: Sequence[int]) -> list[int]:
        """A source's pixels per class, as pixels per shared class (ignored ones dropped)."""
        out = np.zeros(self.num_classes, np.int64)
        for klass, count in enumerate(pixels):
            target = int(self.lookup[klass]) if klass < MASK_VALUES else klass
            if 0 <= target < self.num_classes:
                out[target] += int(count)
        return out.tolist()

    def table(self, table: RecordTable) -> RecordTable:
        """The per-record table in the shared classes (see :func:`remapped_table`)."""
        return remapped_table(table, self.lookup, self.num_classes)

    def describe(self) -> str:
        """What decides the masks read (a resume state's digest includes it)."""
        return f"{self.values()[: max(self.source_classes, 1)].tolist()}/{self.num_classes}"


def manifest_classes(manifest: Manifest) -> tuple[int, bool]:
    """A dataset's class count and whether it was inferred (not declared at conversion):
    declared (``--num-classes``, ``--binary-masks``), the largest ``--mask-map`` target
    + 1, else the largest class found in any split + 1."""
    mask = manifest.mask
    if mask.num_classes is not None:
        return mask.num_classes, False
    if mask.mask_map:
        return max(t for _, t in mask.mask_map) + 1, False
    found = [v for split in manifest.splits.values() for v in split.mask_values]
    return max(found, default=0) + 1, True


def label_map(
    given: Any,
    manifest: Manifest,
    *,
    where: str,
    unannotated: Iterable[int] = (),
    num_classes: int | None = None,
    ignore: int | None = None,
) -> LabelMap:
    """``label_map=`` (and a mixed source's ``unannotated``) checked against a dataset's
    classes: keys within its classes, targets within the shared taxonomy
    (``num_classes``, default: the largest target + 1). ``ignore``: the shared ignore
    label (default: the dataset's, else DEFAULT_PAD_LABEL)."""
    if num_classes is not None and (not _is_class(num_classes) or num_classes < 1):
        raise OptionsError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    classes = manifest_classes(manifest)[0]
    lookup = np.arange(MASK_VALUES, dtype=np.int64)
    for klass, target in _pairs(given, classes, where).items():
        lookup[klass] = IGNORED if target is None else target
    own_ignore = manifest.mask.ignore_label
    if own_ignore is not None:
        lookup[own_ignore] = IGNORED
    lookup[classes:][lookup[classes:] >= classes] = IGNORED  # no class: padding, ignore
    shared = num_classes if num_classes is not None else int(lookup[:classes].max(initial=-1)) + 1
    outside = sorted({int(t) for t in lookup[:classes] if t >= shared})
    if outside:
        raise OptionsError(
            f"label_map of {where}: it reads classes {outside} but the shared taxonomy has "
            f"{shared} classes (0..{shared - 1}); map them into it, or to None (ignored)"
        )
    for klass in given_classes("unannotated", unannotated, where):
        if klass >= shared:
            raise OptionsError(
                f"unannotated of {where}: class {klass} is outside the shared taxonomy "
                f"of {shared} classes (0..{shared - 1})"
            )
        lookup[lookup == klass] = IGNORED
    ignore = _ignore_value(ignore if ignore is not None else own_ignore, shared, where)
    return LabelMap(lookup, shared, ignore, classes)


def _pairs(given: Any, classes: int, where: str) -> dict[int, int | None]:
    """``label_map=`` as {source class: shared class or None}, every key a class."""
    takes = "label_map takes {class: shared class or None} or a list of one per class"
    if isinstance(given, Mapping):
        pairs = dict(given)
    elif isinstance(given, Sequence | np.ndarray) and not isinstance(given, str | bytes):
        given = list(given)
        if len(given) != classes:
            raise OptionsError(
                f"label_map of {where}: a list needs one entry per class of the dataset "
                f"({classes}), got {len(given)}"
            )
        pairs = dict(enumerate(given))
    else:
        raise OptionsError(f"{takes}; got {type(given).__name__} (for {where})")
    for klass, target in pairs.items():
        if not _is_class(klass) or not 0 <= klass < classes:
            raise OptionsError(
                f"label_map of {where}: {klass!r} is not one of its {classes} classes "
                f"(0..{classes - 1})"
            )
        if target is not None and (not _is_class(target) or target < 0):
            raise OptionsError(
                f"label_map of {where}: class {klass} maps to {target!r}; a shared class "
                "is an integer >= 0, or None for the ignore label"
            )
    return {int(k): None if t is None else int(t) for k, t in pairs.items()}


def given_classes(name: str, values: Iterable[int], where: str) -> list[int]:
    """A list of class indices (``unannotated``), checked."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise OptionsError(f"{name} of {where} is a list of shared classes, got {values!r}")
    values = list(values)
    bad = [v for v in values if not _is_class(v) or v < 0]
    if bad:
        raise OptionsError(f"{name} of {where} takes class indices >= 0, got {bad}")
    return [int(v) for v in values]


def _is_class(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _ignore_value(ignore: int | None, shared: int, where: str) -> int:
    value = DEFAULT_PAD_LABEL if ignore is None else int(ignore)
    if value < shared:
        raise OptionsError(
            f"{where}: the ignore label {value} is one of the shared taxonomy's {shared} "
            "classes; a taxonomy of that many classes needs a dataset converted with "
            "another --ignore-label"
        )
    return value


def remapped_table(table: RecordTable, lookup: np.ndarray, num_classes: int) -> RecordTable:
    """``table`` with each class entry moved to ``lookup[class]``: entries that meet on one
    shared class are merged (pixels summed, cells joined), ignored ones counted as ignored
    pixels."""
    records = table.entry_records()
    targets = lookup[table.class_ids.astype(np.int64)]
    counts = table.class_counts.astype(np.int64)
    dropped = targets == IGNORED
    ignored = table.ignored_pixels.astype(np.int64) + np.bincount(
        records[dropped], weights=counts[dropped], minlength=len(table)
    ).astype(np.int64)
    keep = ~dropped
    key = records[keep] * num_classes + targets[keep]
    unique, inverse = np.unique(key, return_inverse=True)
    merged = np.bincount(inverse, weights=counts[keep], minlength=len(unique)).astype(np.int64)
    cells = table.class_cells[keep].astype(np.int64)
    joined = np.zeros(len(unique), np.int64)
    np.bitwise_or.at(joined, inverse, cells)
    owner = unique // num_classes
    return RecordTable(
        key_ends=table.key_ends,
        key_bytes=table.key_bytes,
        heights=table.heights,
        widths=table.widths,
        ignored_pixels=smallest_unsigned(ignored),
        class_ends=smallest_unsigned(np.cumsum(np.bincount(owner, minlength=len(table)))),
        class_ids=smallest_unsigned(unique % num_classes),
        class_counts=smallest_unsigned(merged),
        class_cells=joined.astype(np.uint16),
        num_classes=num_classes,
    )


@dataclass(frozen=True, eq=False)
class MaskLabels:
    """The maps of a read's sources, by global record index: source ``s`` holds records
    ``offsets[s]`` on, and its masks are read through ``values[s]``."""

    values: np.ndarray  # int32 [sources, MASK_VALUES]
    offsets: np.ndarray  # int64 [sources], ascending, the first 0
    num_classes: int
    ignore: int

    @classmethod
    def of(cls, maps: Sequence[LabelMap], offsets: Sequence[int]) -> MaskLabels:
        return cls(
            np.stack([m.values() for m in maps]),
            np.asarray(offsets, np.int64),
            maps[0].num_classes,
            maps[0].ignore,
        )

    def relabelled(self, indices: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """NumPy masks [B, H, W, 1] of the records at ``indices``, in the shared classes."""
        source = np.searchsorted(self.offsets, np.asarray(indices), side="right") - 1
        out = np.empty(masks.shape, masks.dtype if self.ignore < 256 else np.int32)
        for k, s in enumerate(source.tolist()):
            np.take(self.values[s].astype(out.dtype), masks[k], out=out[k])
        return out


def check_one_dataset(given: Any, num_classes: Any, weights: Any) -> None:
    """One dataset's ``label_map=``/``num_classes=``/``weights=`` (read, info, class_weights):
    weights= belongs to several datasets, num_classes= to a map or several datasets."""
    if weights is not None:
        raise OptionsError("weights= mixes several datasets: pass path={name: path, ...}")
    if given is None and num_classes is not None:
        raise OptionsError(
            "num_classes= is the shared taxonomy's size: it goes with label_map= or "
            "several datasets; without them the dataset's own classes are read"
        )


def read_labels(shards: Any, a: dict[str, Any], unordered: str | None) -> LabelMap | None:
    """read()'s ``label_map=`` and ``num_classes=`` for one dataset, checked."""
    given, classes = a.get("label_map"), a.get("num_classes")
    check_one_dataset(given, classes, a.get("weights"))
    if given is None:
        return None
    if unordered is not None:
        raise OptionsError(f"label_map= needs a read by index, and this one cannot be: {unordered}")
    where = f"{shards.root} (split {shards.split})"
    return label_map(given, shards.manifest, where=where, num_classes=classes)
