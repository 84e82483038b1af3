"""Which records an epoch holds when it is not every record once: subsets, weights and
class balance, decided from the per-record table before any pixel is read.

    records=  (keys, a boolean mask or indices)   -> a subset: each of its records once
    sampling= (one weight per record)              -> epoch_size records, drawn by weight
    sampling= ClassBalanced(...)                   -> epoch_size records, drawn by class

A draw is a pure function of (seed, epoch) and the arguments, in any process, never of
an earlier epoch. Draws are low-variance: a record whose expected count in an epoch is
``e`` appears ``floor(e)`` or ``ceil(e)`` times, the records that get the extra copy
chosen by systematic sampling over a random order of the records (probability exactly
``e - floor(e)`` each). Independent draws would leave a record of weight 1 out of about
37% of epochs and show another three times; here each appears once.

The drawn records are then placed like an ordinary epoch's (order.py): grouped by the
shard groups of the epoch's order, in random order within a group, so reads stay
within a few shards at a time and a record's copies are spread over its group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from tfshards.errors import OptionsError
from tfshards.readers.order import EpochOrder

RULES = ("class_uniform", "repeat_factor")
NO_CLASS = -1  # a drawn record that was not drawn for a class
_ARRANGE, _DRAW = 1, 2  # generator streams beside the epoch order's own


@dataclass(frozen=True)
class ClassBalanced:
    """Sampling that shows rare classes more often, from the per-record table alone.

    rule: ``"class_uniform"`` draws a class (in proportion to ``ratios``, equal by
    default), then a record that holds it; ``"repeat_factor"`` weights each record by
    ``max(1, sqrt(threshold / f(c)))`` of its rarest class ``c``, where ``f(c)`` is the
    share of records holding ``c`` (LVIS's rule; ``ratios`` multiply each class's factor).
    exclude: classes never drawn for (background, say); records are still drawn for
    their other classes. crop_fraction: with ``crop_size``, the share of crops centred on
    the class their record was drawn for (nnU-Net oversamples foreground in a third of its
    crops); the others are placed uniformly.

    >>> tfshards.read("shards/", sampling=tfshards.ClassBalanced(exclude=[0]))  # doctest: +SKIP
    """

    rule: str = "class_uniform"
    ratios: Mapping[int, float] | None = None
    exclude: Sequence[int] = ()
    threshold: float = 0.1
    crop_fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise OptionsError(f"ClassBalanced: rule must be one of {RULES}, got {self.rule!r}")
        if self.ratios is not None and not isinstance(self.ratios, Mapping):
            raise OptionsError(
                "ClassBalanced: ratios is a mapping {class: ratio}, e.g. {3: 2.0}; got "
                f"{type(self.ratios).__name__}"
            )
        ratios = dict(self.ratios or {})
        for klass, ratio in ratios.items():
            _check_class("ratios", klass)
            if not _finite(ratio) or ratio < 0:
                raise OptionsError(
                    f"ClassBalanced: ratios[{klass}] must be a finite number >= 0, got {ratio!r}"
                )
        object.__setattr__(self, "ratios", ratios)
        if isinstance(self.exclude, str | bytes) or not isinstance(self.exclude, Iterable):
            raise OptionsError(
                f"ClassBalanced: exclude is a list of classes, e.g. [0]; got {self.exclude!r}"
            )
        exclude = tuple(sorted({_check_class("exclude", c) for c in self.exclude}))
        object.__setattr__(self, "exclude", exclude)
        if not _finite(self.threshold) or not 0 < self.threshold <= 1:
            raise OptionsError(
                f"ClassBalanced: threshold must be in (0, 1], got {self.threshold!r}"
            )
        if not _finite(self.crop_fraction) or not 0 <= self.crop_fraction <= 1:
            raise OptionsError(
                f"ClassBalanced: crop_fraction must be in [0, 1], got {self.crop_fraction!r}"
            )

    def __hash__(self) -> int:  # ratios is a dict: hashed by what decides the draws
        return hash(self.describe())

    def describe(self) -> str:
        """What decides the draws and the crops (also a resume state's digest): the
        threshold only under repeat_factor, which uses it."""
        ratios = {c: float(r) for c, r in sorted(self.ratios.items())}
        threshold = f", threshold={float(self.threshold)!r}" if self.rule == "repeat_factor" else ""
        return (
            f"ClassBalanced(rule={self.rule!r}, ratios={ratios}, exclude={list(self.exclude)}"
            f"{threshold}, crop_fraction={float(self.crop_fraction)!r})"
        )


def _finite(value: Any) -> bool:
    number = isinstance(value, int | float | np.integer | np.floating)
    return number and not isinstance(value, bool) and math.isfinite(value)


def _check_class(name: str, klass: Any) -> int:
    if isinstance(klass, bool) or not isinstance(klass, int | np.integer) or klass < 0:
        raise OptionsError(f"ClassBalanced: {name} takes class indices >= 0, got {klass!r}")
    return int(klass)


@dataclass(frozen=True, eq=False)
class Selection:
    """What an epoch draws from: resolved once per read() (``select``), then used for
    every epoch (``SampledOrder``). ``expected`` is each record's expected copies per
    epoch; ``per_class`` (class-uniform only) each class's records and its share."""

    records: int  # the table's length
    subset: np.ndarray | None  # sorted record indices; None: every record
    weights: np.ndarray | None  # float64 [records]; None: each record of the subset once
    epoch_size: int
    drawn_class: np.ndarray | None = None  # int16 [records]: the class a record stands for
    per_class: tuple[tuple[int, np.ndarray, float], ...] = ()  # (class, records, share)
    digest: str = ""  # what a saved state must match (resume.py)
    balanced: ClassBalanced | None = None
    table: Any = None  # a class-balanced read's RecordTable: where its crops are centred

    @property
    def uniform(self) -> bool:
        """Each record of the subset once, in the epoch order's places."""
        return self.weights is None and not self.per_class

    def expected(self) -> np.ndarray:
        """Expected copies of each record in one epoch (float64 [records])."""
        if self.per_class:
            out = np.zeros(self.records)
            for _, members, share in self.per_class:
                out[members] += self.epoch_size * share / len(members)
            return out
        if self.weights is None:
            out = np.zeros(self.records)
            out[self.subset if self.subset is not None else slice(None)] = 1.0
            return out
        return self.weights * (self.epoch_size / self.weights.sum())


def low_variance_counts(expected: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Counts that sum to ``total``, each ``floor`` or ``ceil`` of ``expected`` (which sums
    to ``total``), the ceilings chosen by systematic sampling over a random order.

    The order is a random affine one, ``(a * i + b) mod n`` with ``a`` coprime to ``n``:
    half the cost of a full permutation at 10M records, and enough here, as records
    neighbour each other only through the converter's shuffle; each record still gets
    its ceiling with probability exactly its fraction."""
    counts = np.floor(expected).astype(np.int64)
    rest = int(total - counts.sum())
    if rest <= 0:
        return counts
    order = _affine_order(len(expected), rng)
    fractions = np.cumsum((expected - counts)[order])
    points = rng.random() + np.arange(rest)
    picked = np.minimum(np.searchsorted(fractions, points, side="right"), len(expected) - 1)
    counts += np.bincount(order[picked], minlength=len(expected))
    return counts


def _affine_order(n: int, rng: np.random.Generator) -> np.ndarray:
    """A random order of ``range(n)``: ``(a * i + b) mod n``, ``a`` coprime to ``n``."""
    while True:  # most draws are coprime: about 6 in 10 for a random n
        step = int(rng.integers(1, max(2, min(n, 2**31))))
        if math.gcd(step, n) == 1:
            break
    return (step * np.arange(n, dtype=np.int64) + int(rng.integers(0, n))) % n


@dataclass(frozen=True, eq=False)
class SampledOrder:
    """An epoch order over a :class:`Selection`: ``records(epoch)`` and ``classes(epoch)``
    as ``EpochOrder`` gives them for a whole split."""

    base: EpochOrder
    selection: Selection

    @property
    def size(self) -> int:
        return self.selection.epoch_size

    @property
    def shuffle(self) -> bool:
        return self.base.shuffle

    def records(self, epoch: int) -> np.ndarray:
        return _sampled(self, int(epoch))[0]

    def classes(self, epoch: int) -> np.ndarray:
        """The class each position of the epoch was drawn for (NO_CLASS: none)."""
        return _sampled(self, int(epoch))[1]


@lru_cache(maxsize=4)
def _sampled(order: SampledOrder, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    selection, base = order.selection, order.base
    if selection.uniform:
        everything = base.records(epoch)
        if selection.subset is None:
            return everything, _no_classes(len(everything))
        kept = np.zeros(selection.records, bool)
        kept[selection.subset] = True
        records = everything[kept[everything]]
        return _frozen(records), _no_classes(len(records))
    rng = np.random.Generator(np.random.PCG64([base.seed, epoch, _DRAW]))
    records, classes = _drawn(selection, rng)
    return _arranged(base, epoch, records, classes)


def _drawn(selection: Selection, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The epoch's records (with repeats) and the class each was drawn for."""
    if not selection.per_class:
        counts = low_variance_counts(selection.expected(), selection.epoch_size, rng)
        records = np.repeat(np.arange(selection.records, dtype=np.int64), counts)
        if selection.drawn_class is None:
            return records, _no_classes(len(records))
        return records, selection.drawn_class[records]
    shares = np.array([share for _, _, share in selection.per_class])
    per_class = low_variance_counts(shares * selection.epoch_size, selection.epoch_size, rng)
    records, classes = [], []
    for (klass, members, _), count in zip(selection.per_class, per_class, strict=True):
        whole, rest = divmod(int(count), len(members))
        picked = [np.tile(members, whole), members[rng.choice(len(members), rest, replace=False)]]
        records.append(np.concatenate(picked))
        classes.append(np.full(int(count), klass, np.int16))
    return np.concatenate(records).astype(np.int64), np.concatenate(classes)


def _arranged(
    base: EpochOrder, epoch: int, records: np.ndarray, classes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Drawn records in reading order: by shard group of the epoch's order, at random within
    a group (shuffled reads), or by record index (``shuffle=False``)."""
    if not base.shuffle:
        order = np.argsort(records, kind="stable")
    else:
        order = _shuffled_by_group(base.record_groups(epoch)[records], base, epoch)
    return _frozen(records[order]), _frozen(classes[order])


def _shuffled_by_group(group: np.ndarray, base: EpochOrder, epoch: int) -> np.ndarray:
    """Positions sorted by group (a radix sort of 16-bit keys where they fit), then in a
    random order within each group."""
    narrow = np.uint16 if group.size and int(group.max()) < 2**16 else np.uint32
    order = np.argsort(group.astype(narrow), kind="stable")
    rng = np.random.Generator(np.random.PCG64([base.seed, epoch, _ARRANGE]))
    start = 0
    for end in np.cumsum(np.bincount(group)).tolist():
        if end - start > 1:
            order[start:end] = order[start:end][rng.permutation(end - start)]
        start = end
    return order


def _no_classes(count: int) -> np.ndarray:
    return np.broadcast_to(np.int16(NO_CLASS), (count,))


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class SamplingRequest:
    """read()'s ``records``, ``sampling`` and ``epoch_size`` as given."""

    records: Any = None
    sampling: Any = None
    epoch_size: int | None = None
    label: str = field(default="read()", compare=False)

    @property
    def active(self) -> bool:
        return self.records is not None or self.sampling is not None or self.epoch_size is not None
