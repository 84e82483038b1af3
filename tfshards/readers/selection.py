"""read()'s and Pairs' ``records=``, ``sampling=`` and ``epoch_size=``, checked against the
per-record table and resolved into a :class:`~tfshards.readers.sampling.Selection`.

Every refusal is an OptionsError naming the argument and what was wrong, raised before
the first batch: unknown keys (named), an empty subset, weights of the wrong length,
negative, NaN or all zero, a table of another length than the split.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from tfshards.arguments import checked_int
from tfshards.errors import OptionsError
from tfshards.readers.sampling import NO_CLASS, ClassBalanced, Selection
from tfshards.schemas.record_table import RecordTable, RecordTableError

log = logging.getLogger("tfshards")
# epoch_size: an epoch's order is an int64 array; 2**31 records (16 GiB) is a typo, not an
# epoch (and takes minutes to draw).
EPOCH_BOUND = 2**31


def subset_indices(
    records: Any, length: int, positions: Callable[[list[str]], np.ndarray]
) -> np.ndarray:
    """``records=`` (keys, a boolean mask over the split's ``length`` records, or record
    indices) as sorted, distinct record indices; ``positions`` finds keys (the table's)."""
    values = _values(records)
    if values.size and values.dtype.kind in "USO":
        keys, counts = np.unique(values.astype(str), return_counts=True)
        if (counts > 1).any():  # named by key: their indices would mean nothing to a user
            raise OptionsError(
                f"records= names keys more than once ({keys[counts > 1][:5].tolist()}); a "
                "subset holds each record once: to show records more often, pass sampling= "
                "weights"
            )
        try:
            indices = positions([str(v) for v in values])
        except RecordTableError as exc:
            raise OptionsError(f"records=: {exc}") from exc
    elif values.dtype == bool:
        if len(values) != length:
            raise OptionsError(
                f"records= as a boolean mask needs one value per record of the split "
                f"({length}), got {len(values)}"
            )
        indices = np.flatnonzero(values)
    elif values.dtype.kind in "iu" or not values.size:
        indices = values.astype(np.int64)
        bad = indices[(indices < 0) | (indices >= length)]
        if bad.size:
            raise OptionsError(
                f"records= holds indices outside the split's {length} records "
                f"(0..{length - 1}): {bad[:5].tolist()}"
            )
    else:
        raise OptionsError(
            f"records= takes keys (str), a boolean mask or integer indices; got values of "
            f"type {values.dtype}"
        )
    return _distinct(indices)


def _values(records: Any) -> np.ndarray:
    """``records=`` as a 1-D array of one kind: keys, booleans or integers."""
    takes = "records= takes keys (str), a boolean mask or record indices"
    if isinstance(records, str | bytes):
        raise OptionsError(f"{takes}, not one string ({records!r}); pass [{records!r}]")
    if not hasattr(records, "__array__") and not isinstance(records, Iterable):
        raise OptionsError(f"{takes}; got {type(records).__name__}")
    if not hasattr(records, "__array__"):  # a list of one kind (NumPy would make 2 a "2")
        records = list(records)
        kinds = {_kind(v) for v in records}
        if len(kinds) > 1 or None in kinds:
            shown = ", ".join(sorted({type(v).__name__ for v in records}))
            raise OptionsError(f"{takes}, one kind at a time; got values of type {shown}")
        records = np.array(records, dtype=object) if kinds == {"int"} else records
    try:
        values = np.asarray(records)
    except (TypeError, ValueError) as exc:
        raise OptionsError(f"{takes}; got {type(records).__name__} ({exc})") from exc
    if values.ndim != 1:
        raise OptionsError(f"records= must be one-dimensional, got shape {values.shape}")
    if values.dtype.kind == "O":  # Python objects: all keys, all bools or all integers
        kinds = {_kind(v) for v in values.tolist()}
        if len(kinds) != 1 or None in kinds:
            raise OptionsError(f"{takes}, one kind at a time; got {sorted(map(str, kinds))}")
        kind = kinds.pop()
        if kind == "int" and any(not -(2**62) < v < 2**62 for v in values.tolist()):
            raise OptionsError(f"records= holds an index beyond any split: {values[:5].tolist()}")
        values = values.astype({"key": str, "bool": bool, "int": np.int64}[kind])
    return values


def _kind(value: Any) -> str | None:
    if isinstance(value, bool | np.bool_):
        return "bool"
    if isinstance(value, int | np.integer):
        return "int"
    return "key" if isinstance(value, str | np.str_) else None


def _distinct(indices: np.ndarray) -> np.ndarray:
    if not indices.size:
        raise OptionsError("records= selects no record: an empty subset has nothing to read")
    ordered = np.sort(indices)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if repeated.size and set(np.unique(ordered).tolist()) <= {0, 1}:
        raise OptionsError(
            "records= holds only 0s and 1s, repeated: a mask of 0/1 integers? Pass it as "
            "booleans (mask.astype(bool)); integers are record indices"
        )
    if repeated.size:
        raise OptionsError(
            f"records= names records more than once ({np.unique(repeated)[:5].tolist()}); a "
            "subset holds each record once: to show records more often, pass sampling= "
            "weights"
        )
    return ordered


def checked_weights(sampling: Any, table: RecordTable, kept: np.ndarray) -> np.ndarray:
    """``sampling=`` weights: one finite weight >= 0 per record, some above 0 in ``kept``;
    scaled so that the largest is 1 (a sum of huge weights would overflow)."""
    takes = "sampling= takes one weight per record (numbers) or tfshards.ClassBalanced(...)"
    try:
        given = np.asarray(sampling)
        weights = given.astype(np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise OptionsError(f"{takes}; got {type(sampling).__name__}") from exc
    if given.dtype.kind not in "biuf":
        raise OptionsError(f"{takes}; got values of type {given.dtype}")
    if weights.shape != (len(table),):
        raise OptionsError(
            f"sampling= needs one weight per record of the split ({len(table)}), got "
            f"shape {weights.shape}"
        )
    for bad, what in ((~np.isfinite(weights), "not finite"), (weights < 0, "negative")):
        if bad.any():
            where = np.flatnonzero(bad)[:5].tolist()
            raise OptionsError(f"sampling= weights are {what} at records {where}")
    weights = np.where(kept, weights, 0.0)
    if weights.any():
        weights = weights / weights.max()
    else:
        raise OptionsError(
            "sampling= weights are all zero over the records read: no record can be drawn"
        )
    return weights


def select(table: RecordTable, records: Any, sampling: Any, epoch_size: int | None) -> Selection:
    """The selection an epoch draws from (see sampling.py)."""
    subset = None
    if records is not None:
        subset = subset_indices(records, len(table), table.keys.positions)
    kept = np.ones(len(table), bool)
    if subset is not None:
        kept[:] = False
        kept[subset] = True
    available = len(table) if subset is None else len(subset)
    size = available
    if epoch_size is not None:  # an epoch's record indices are held in memory: 8 B each
        size = checked_int("epoch_size", epoch_size, low=1, high=EPOCH_BOUND)
    common = {"records": len(table), "subset": subset, "epoch_size": size}
    if isinstance(sampling, ClassBalanced):
        selection = _balanced(table, kept, sampling, common)
    elif sampling is not None:
        selection = Selection(**common, weights=checked_weights(sampling, table, kept))
    elif epoch_size is not None:
        selection = Selection(**common, weights=kept.astype(np.float64))
    else:
        selection = Selection(**common, weights=None)
    return _with_digest(selection)


def _balanced(
    table: RecordTable, kept: np.ndarray, balanced: ClassBalanced, common: dict
) -> Selection:
    members = class_members(table, kept)
    ratios = balanced.ratios
    for klass in sorted(set(ratios) | set(balanced.exclude)):
        if klass >= table.num_classes:
            raise OptionsError(
                f"ClassBalanced names class {klass}, but the dataset has "
                f"{table.num_classes} classes (0..{table.num_classes - 1})"
            )
    drawn = {c: m for c, m in members.items() if c not in balanced.exclude}
    drawn = {c: m for c, m in drawn.items() if ratios.get(c, 1.0) > 0}
    if not drawn:
        raise OptionsError(
            f"{balanced.describe()} leaves no class to draw for: every class present in the "
            "records read is excluded or has ratio 0"
        )
    if balanced.rule == "class_uniform":
        total = sum(ratios.get(c, 1.0) for c in drawn)
        per_class = tuple((c, m, ratios.get(c, 1.0) / total) for c, m in sorted(drawn.items()))
        return Selection(
            **common, weights=None, per_class=per_class, balanced=balanced, table=table
        )
    weights, classes = _repeat_factors(kept, drawn, balanced)
    return Selection(**common, weights=weights, drawn_class=classes, balanced=balanced, table=table)


def _repeat_factors(
    kept: np.ndarray, members: dict[int, np.ndarray], balanced: ClassBalanced
) -> tuple[np.ndarray, np.ndarray]:
    """LVIS's factors: each record weighted by the largest factor of its classes, and
    drawn for that class (records of no drawn class: weight 1, no class)."""
    available = int(kept.sum())
    factors = {
        c: max(1.0, float(np.sqrt(balanced.threshold / (len(m) / available))))
        * balanced.ratios.get(c, 1.0)
        for c, m in members.items()
    }
    weights = kept.astype(np.float64)
    classes = np.full(len(kept), NO_CLASS, np.int16)
    for klass in sorted(factors, key=lambda c: factors[c]):  # the largest written last
        weights[members[klass]] = factors[klass]
        classes[members[klass]] = klass
    return weights, classes


def class_members(table: RecordTable, kept: np.ndarray) -> dict[int, np.ndarray]:
    """Each class present in the kept records: the kept records holding it, ascending."""
    everything = bool(kept.all())
    per_record = np.diff(table.class_ends.astype(np.int64), prepend=0)
    owner = np.repeat(np.arange(len(table), dtype=np.int32), per_record)
    by_class = np.argsort(table.class_ids, kind="stable")  # a radix sort: small ints
    ends = np.cumsum(np.bincount(table.class_ids, minlength=1))
    members = {}
    for klass in np.flatnonzero(np.diff(ends, prepend=0)).tolist():
        lo, hi = int(ends[klass - 1]) if klass else 0, int(ends[klass])
        records = owner[by_class[lo:hi]].astype(np.int64)
        if not everything:
            records = records[kept[records]]
        if records.size:
            members[int(klass)] = records
    return members


def _with_digest(selection: Selection) -> Selection:
    """The selection with a digest of everything that decides its epochs (resume.py)."""
    if selection.uniform and selection.subset is None:
        return selection  # every record once: the state of an ordinary read
    digest = hashlib.sha256(f"{selection.epoch_size}".encode())
    for part in (selection.subset, selection.weights):
        digest.update(b"-" if part is None else np.ascontiguousarray(part).tobytes())
    if selection.balanced is not None:
        digest.update(selection.balanced.describe().encode())
    return replace(selection, digest=digest.hexdigest()[:16])
