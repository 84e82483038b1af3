"""Several datasets read as one: ``read({"city": "cityscapes/", "synth": "gta/"},
weights={"city": 0.7, "synth": 0.3}, epoch_size=N)``.

The sources are one virtual split: source ``s`` holds global records ``offsets[s]`` on
(its records in its manifest's order), so the ordered reader, the resume state and
``start=`` see one dataset. An epoch (``MixOrder``), a pure function of (seed, epoch):

    per-source counts: N x weight share, floor or ceil, the extra records given by
      systematic sampling over the sources (low_variance_counts; exact in expectation,
      a source of expected count 12.3 gets 12 or 13 records)
    -> each source's stream of that many records (``source_stream``): a source read by
      index (all its records, or its records= subset) in passes of the order a read of
      it alone has (its shard groups, so reads stay within a few of its shards at a
      time), as many whole passes as the count allows, the last cut short (sampled
      without repeats); with its sampling= (weights or ClassBalanced) drawn as for one
      dataset with that epoch size, then arranged by its shard groups
    -> the streams merged at random places (a shuffle of the sources' labels):
      interleaved, not in blocks; with shuffle=False each source in turn, by index

Masks are read through each source's label map (labels.py) into one taxonomy; the
tables, the counts of ``info``/``class_weights`` and class-balanced draws are in it.
The disk cache is one entry per source of weight above zero, the one a read of that
source alone would use.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from tfshards.errors import ManifestError, OptionsError
from tfshards.readers.labels import LabelMap, MaskLabels, label_map
from tfshards.readers.order import EpochOrder
from tfshards.readers.sampling import (
    NO_CLASS,
    ClassBalanced,
    Selection,
    _arranged,
    _drawn,
    low_variance_counts,
)
from tfshards.readers.shard_cache import shard_cache_key

_MIX = 0x6D6978  # "mix": generator streams of the mix, apart from sampling.py's


@dataclass(frozen=True)
class Source:
    """One dataset of a mix, with what applies to it alone.

    label_map: its classes onto the shared taxonomy (``{class: shared class or None}``,
    or a list of one per class; None: ignored). unannotated: shared classes it never
    labelled: pixels that map to them become the ignore label. records, sampling: a
    subset of it, or weights / ``ClassBalanced`` within it, as ``read()`` takes them.

    >>> tfshards.read({"city": "cityscapes/", "ours": tfshards.Source("ours/",
    ...     label_map={2: 0}, unannotated=[5])}, weights={"city": 1, "ours": 1},
    ...     epoch_size=10_000)  # doctest: +SKIP
    """

    path: str | os.PathLike
    label_map: Any = None
    unannotated: Sequence[int] = ()
    records: Any = None
    sampling: Any = None
    split: str | None = None  # default: read()'s split


def sources_of(given: Mapping) -> dict[str, Source]:
    """read()'s mapping {name: path or Source}, checked."""
    if not isinstance(given, Mapping):
        raise OptionsError(
            f"several datasets are a mapping {{name: path or tfshards.Source}}, got "
            f"{type(given).__name__}"
        )
    if not given:
        raise OptionsError("read() was given an empty mapping of datasets: name at least one")
    out = {}
    for name, value in given.items():
        if not isinstance(name, str) or not name:
            raise OptionsError(f"datasets are named by non-empty strings, got {name!r}")
        if isinstance(value, str | os.PathLike):
            value = Source(value)
        if not isinstance(value, Source):
            raise OptionsError(
                f"dataset {name!r}: a path or tfshards.Source(path, ...), got "
                f"{type(value).__name__}"
            )
        out[name] = value
    return out


@contextmanager
def naming(name: str) -> Iterator[None]:
    """Errors of one source (its options, a missing or unfinished dataset or split) named
    by the source, as several paths make a bare one hard to place."""
    try:
        yield
    except (OptionsError, ManifestError) as exc:
        raise type(exc)(f"dataset {name!r}: {exc}") from exc


def refuse_one_for_all(given: Mapping[str, Any]) -> None:
    """``records=``, ``sampling=``, ``label_map=`` given once for several datasets (read,
    class_weights): refused, as each dataset takes its own."""
    for name, value in given.items():
        if value is not None:
            raise OptionsError(
                f"{name}= with several datasets is given to each: tfshards.Source(path, {name}=...)"
            )


def mix_shares(weights: Any, names: list[str]) -> np.ndarray:
    """``weights=`` ({name: weight}, or one per dataset in order) as shares summing to 1."""
    if weights is None:
        raise OptionsError(
            f"several datasets ({', '.join(names)}) need weights=, e.g. "
            f"{ {n: 1.0 for n in names} }: how often each is seen"
        )
    if isinstance(weights, Mapping):
        unknown = sorted(set(map(str, weights)) - set(names))
        missing = [n for n in names if n not in weights]
        if unknown or missing:
            raise OptionsError(
                f"weights= must name the datasets {names}: "
                + "; ".join(
                    part
                    for part in (
                        f"unknown {unknown}" if unknown else "",
                        f"missing {missing}" if missing else "",
                    )
                    if part
                )
            )
        values = [weights[n] for n in names]
    elif isinstance(weights, Sequence | np.ndarray) and not isinstance(weights, str | bytes):
        values = list(weights)
        if len(values) != len(names):
            raise OptionsError(
                f"weights= holds {len(values)} weights for {len(names)} datasets {names}"
            )
    else:
        raise OptionsError(f"weights= is {{name: weight}}, got {type(weights).__name__}")
    return _shares(values, names)


def _shares(values: list[Any], names: list[str]) -> np.ndarray:
    floats = []
    for name, value in zip(names, values, strict=True):
        number = isinstance(value, int | float | np.integer | np.floating)
        try:  # an int beyond a float's range (10**400) overflows
            as_float = float(value) if number and not isinstance(value, bool) else math.nan
        except OverflowError:
            as_float = math.inf
        if not math.isfinite(as_float) or as_float < 0:
            raise OptionsError(
                f"weights= of dataset {name!r} must be a finite number >= 0, got {value!r}"
            )
        floats.append(as_float)
    shares = np.asarray(floats, np.float64)
    if not shares.any():
        raise OptionsError(f"weights= are all zero ({dict(zip(names, values, strict=True))})")
    shares = shares / shares.max()  # weights near the float maximum sum to inf otherwise
    return shares / shares.sum()


def mix_epoch_size(epoch_size: Any, selections: Sequence[Selection], shares: np.ndarray) -> int:
    """Records per epoch of a mix: ``epoch_size=``, else those of its sources of weight
    above zero (a dataset switched off by weight 0 does not lengthen the epoch)."""
    if epoch_size is not None:
        from tfshards.arguments import checked_int
        from tfshards.readers.selection import EPOCH_BOUND

        return checked_int("epoch_size", epoch_size, low=1, high=EPOCH_BOUND)
    return sum(s.epoch_size for s, share in zip(selections, shares, strict=True) if share > 0)


@dataclass(frozen=True, eq=False)
class MixOrder:
    """Every epoch of a mix (see the module docstring); ``records(epoch)`` are global
    indices, ``classes(epoch)`` the class each was drawn for (NO_CLASS: none)."""

    bases: tuple[EpochOrder, ...]  # each source's own order (shards, groups, seed)
    selections: tuple[Selection, ...]  # what each source draws from
    offsets: np.ndarray  # int64 [sources]: each source's first global index
    shares: np.ndarray  # float64 [sources], summing to 1
    size: int  # records per epoch
    seed: int
    shuffle: bool
    selection: Selection | None = None  # the whole mix's (class crops, store, resume)

    def records(self, epoch: int) -> np.ndarray:
        return _mixed(self, int(epoch))[0]

    def classes(self, epoch: int) -> np.ndarray:
        return _mixed(self, int(epoch))[1]

    def counts(self, epoch: int) -> np.ndarray:
        """Records of each source in epoch ``epoch``."""
        rng = np.random.Generator(np.random.PCG64([self.seed, int(epoch), _MIX]))
        return low_variance_counts(self.shares * self.size, self.size, rng)


@lru_cache(maxsize=4)
def _mixed(order: MixOrder, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    counts = order.counts(epoch)
    parts, classes = [], []
    for s, (base, selection) in enumerate(zip(order.bases, order.selections, strict=True)):
        records, drawn = source_stream(base, selection, int(counts[s]), epoch, s)
        parts.append(records + order.offsets[s])
        classes.append(drawn)
    records = np.concatenate(parts)
    drawn = None  # no source draws for classes (the common case): no array of them
    if any(c is not None for c in classes):
        filled = [
            np.full(len(r), NO_CLASS, np.int16) if c is None else c
            for r, c in zip(parts, classes, strict=True)
        ]
        drawn = np.concatenate(filled)
    if order.shuffle:  # each source's stream at random places: interleaved
        rng = np.random.Generator(np.random.PCG64([order.seed, epoch, _MIX, len(counts)]))
        kind = np.int8 if len(counts) < 2**7 else np.int16
        labels = np.repeat(np.arange(len(counts), dtype=kind), counts)
        rng.shuffle(labels)
        places = np.argsort(labels, kind="stable")  # a radix sort of small ints
        mixed = np.empty_like(records)
        mixed[places] = records
        if drawn is not None:
            mixed_classes = np.empty_like(drawn)
            mixed_classes[places] = drawn
            drawn = mixed_classes
        records = mixed
    if drawn is None:
        drawn = np.broadcast_to(np.int16(NO_CLASS), records.shape)
    records.flags.writeable = False
    return records, drawn


PASSES = 8  # a source read whole more often than this: drawn (tiled), not passed over


def source_stream(
    base: EpochOrder, selection: Selection, count: int, epoch: int, source: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """``count`` local records of one source in reading order, and the class each was
    drawn for (None: none was, the source is not class-balanced).

    A source read by index (all its records, or its records= subset), shuffled: passes
    over it, each in an order of a read of it alone (``EpochOrder``, its shard groups),
    the last pass cut short; a cut pass holds a random part of the source, read a few of
    its shards at a time, every record with the same chance to be in it when its
    shards hold as many records each. Otherwise (weights, class balance, shuffle=False,
    a source repeated more than PASSES times) drawn as ``source_draw`` says, then
    arranged by shard group."""
    uniform = selection.uniform and base.shuffle
    if uniform and count <= PASSES * len(_members(selection)):
        return _passes(base, selection, count, epoch), None
    rng = np.random.Generator(np.random.PCG64([base.seed, epoch, _MIX, source]))
    records, drawn = source_draw(selection, count, rng)
    records, drawn = _arranged(base, epoch, records, drawn)
    return records, drawn if selection.per_class or selection.drawn_class is not None else None


def _members(selection: Selection) -> np.ndarray:
    if selection.subset is not None:
        return selection.subset
    return np.arange(selection.records, dtype=np.int64)


def _passes(base: EpochOrder, selection: Selection, count: int, epoch: int) -> np.ndarray:
    kept = None
    if selection.subset is not None:
        kept = np.zeros(selection.records, bool)
        kept[selection.subset] = True
    out, left = [], count
    for copy in range(PASSES):
        if left <= 0:
            break
        order = base if copy == 0 else replace(base, seed=_source_seed(base.seed, copy))
        records = order.records(epoch)
        if kept is not None:
            records = records[kept[records]]
        out.append(records[:left])
        left -= len(out[-1])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def source_draw(
    selection: Selection, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` local records of one source and the class each was drawn for: each
    record of a uniform selection repeated whole as often as ``count`` allows, the rest
    sampled without repeats; weighted and class-balanced ones drawn as for one dataset."""
    if count == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int16)
    if selection.uniform:
        members = _members(selection)
        whole, rest = divmod(count, len(members))
        picked = members[rng.choice(len(members), rest, replace=False)]  # placed later
        records = np.concatenate([np.tile(members, whole), picked]).astype(np.int64)
        return records, np.full(count, NO_CLASS, np.int16)
    records, classes = _drawn(replace(selection, epoch_size=count), rng)
    return records, np.asarray(classes, np.int16)


@dataclass(frozen=True)
class Part:
    """One source of a read mix: its name, plan (its selection included) and label map."""

    name: str
    plan: Any  # the ReadPlan of a read of this source alone
    labels: LabelMap | None
    table: Any = field(default=None, repr=False)  # its per-record table, shared classes


@dataclass(frozen=True, eq=False)
class Mix:
    """A mixed read's sources, plus what ``ordered.py`` and ``pipeline.py`` ask of it."""

    parts: tuple[Part, ...]
    shares: np.ndarray
    epoch_size: int
    selection: Selection

    @property
    def offsets(self) -> np.ndarray:
        sizes = [part.plan.shards.records for part in self.parts]
        return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    def order(self, shuffle: bool, seed: int) -> MixOrder:
        plans = [part.plan for part in self.parts]
        return mix_order(
            [tuple(shard.records for shard in plan.shards.shards) for plan in plans],
            [plan.group_shards for plan in plans],
            [plan.selection for plan in plans],
            self.shares,
            self.epoch_size,
            seed,
            shuffle,
            self.selection,
        )


def mix_order(
    shard_records: Sequence[tuple[int, ...]],
    groups: Sequence[int],
    selections: Sequence[Selection],
    shares: np.ndarray,
    size: int,
    seed: int,
    shuffle: bool,
    selection: Selection | None = None,
) -> MixOrder:
    """The order of a mix of sources with these shards' record counts, shard groups and
    selections (``read`` and ``Pairs`` build the same one)."""
    bases = tuple(
        EpochOrder(records, shuffle, _source_seed(seed, k), group)
        for k, (records, group) in enumerate(zip(shard_records, groups, strict=True))
    )
    sizes = [sum(records) for records in shard_records]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return MixOrder(bases, tuple(selections), offsets, shares, size, int(seed), shuffle, selection)


def _source_seed(seed: int, source: int) -> int:
    """Each source's order seed, apart from the others' and from the mix's own streams."""
    state = np.random.SeedSequence([int(seed), _MIX, source]).generate_state(2, np.uint32)
    return int(state[0]) << 32 | int(state[1])


def mix_digest(parts: Sequence[Part], shares: np.ndarray, epoch_size: int) -> str:
    """What decides a mix's epochs (a resume state must match it), one short digest per
    kind of argument, so a refused state can name the one that differs (mix_difference)."""
    datasets, weights, selections, maps = [], [], [], []  # the last three by name, sorted:
    for part, share in zip(parts, shares.tolist(), strict=True):  # reordering is one change
        plan, name = part.plan, part.name
        key = shard_cache_key(plan.shards.manifest)  # its shard groups order it
        datasets.append(f"{name}|{key}|{plan.shards.split}|{plan.group_shards}")
        weights.append(f"{name}|{share.hex()}")
        selections.append(f"{name}|{plan.selection.digest or plan.shards.records}")
        maps.append(f"{name}|{part.labels.describe() if part.labels is not None else '-'}")
    described = {
        "datasets": _short(datasets),
        "weights": _short(sorted(weights)),
        "epoch_size": str(epoch_size),
        "records/sampling": _short(sorted(selections)),
        "label_maps": _short(sorted(maps)),
    }
    return "mix " + " ".join(f"{kind}={value}" for kind, value in described.items())


def _short(texts: Sequence[str]) -> str:
    return hashlib.sha256("|".join(texts).encode()).hexdigest()[:8]


MIX_ARGUMENTS = {
    "datasets": "the datasets (their names, order, shards or splits)",
    "weights": "weights=",
    "epoch_size": "epoch_size=",
    "records/sampling": "a dataset's records= or sampling=",
    "label_maps": "a dataset's label_map or unannotated (or num_classes=)",
}


def mix_difference(saved: str, here: str) -> str | None:
    """Why a resume state's mix digest (``saved``) is not this read's (``here``), in words;
    None when neither is a mix's."""
    mixes = [digest.startswith("mix ") for digest in (saved, here)]
    if not any(mixes):
        return None
    if not all(mixes):
        if mixes[0]:
            return "the saved state was made by a read of several datasets, this read reads one"
        return (  # a mix's state of an earlier tfshards carried one digest, without "mix"
            "the saved state was not made by a mix of several datasets (but by a read of "
            "one, or by a mix under an earlier tfshards), and this read mixes several"
        )
    ours, theirs = (  # a part without "=" (an edited state) differs from every part
        dict(p.partition("=")[::2] for p in d.split()[1:]) for d in (saved, here)
    )
    differ = [what for kind, what in MIX_ARGUMENTS.items() if ours.get(kind) != theirs.get(kind)]
    return f"the saved state was made with another mix: {', '.join(differ) or 'its digest'} differ"


def shared_labels(parts: Sequence[Part]) -> MaskLabels | None:
    """The sources' maps by global index; None when every source is read as stored."""
    if all(part.labels is None for part in parts):
        return None
    sizes = [part.plan.shards.records for part in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return MaskLabels.of([part.labels for part in parts], offsets)


def resolved_maps(
    sources: Mapping[str, Source], manifests: Mapping[str, Any], num_classes: int | None
) -> dict[str, LabelMap | None]:
    """Each source's label map in one taxonomy: ``num_classes``, else the largest any
    source reads + 1. None for every source when none is mapped and their classes agree."""
    from tfshards.readers.labels import given_classes, manifest_classes

    ignore = _one_ignore_label(manifests)
    mapped = any(
        s.label_map is not None or given_classes("unannotated", s.unannotated, f"dataset {n!r}")
        for n, s in sources.items()
    )
    classes = {name: manifest_classes(m)[0] for name, m in manifests.items()}
    if not mapped and num_classes is None and len(set(classes.values())) == 1:
        return dict.fromkeys(sources)
    if num_classes is None:
        own = [
            label_map(s.label_map or {}, manifests[n], where=f"dataset {n!r}", ignore=ignore)
            for n, s in sources.items()
        ]
        num_classes = max(m.num_classes for m in own)
    return {
        name: label_map(
            source.label_map or {},
            manifests[name],
            where=f"dataset {name!r}",
            unannotated=source.unannotated,
            num_classes=num_classes,
            ignore=ignore,
        )
        for name, source in sources.items()
    }


def _one_ignore_label(manifests: Mapping[str, Any]) -> int | None:
    """The sources' ignore label: one for all, else refused naming two that differ."""
    labels = {name: m.mask.ignore_label for name, m in manifests.items()}
    (first, label), *rest = labels.items()
    for name, other in rest:
        if other != label:
            raise OptionsError(
                f"datasets {first!r} and {name!r} declare different ignore labels ({label} "
                f"and {other}): masks read together need one; convert one of them again "
                "with the other's --ignore-label"
            )
    return label


def check_distinct(shards: Mapping[str, Any]) -> None:
    """Sources' splits (SplitShards): one split given twice would share its cache entry
    and its records, so it is refused (read, Pairs and the report alike)."""
    seen: dict[tuple[str, str], str] = {}
    for name, split in shards.items():
        key = (shard_cache_key(split.manifest), split.split)
        if key in seen:
            raise OptionsError(
                f"datasets {seen[key]!r} and {name!r} are the same split of one dataset; "
                "give it once (a larger weight shows it more often)"
            )
        seen[key] = name


def check_alike(manifests: Mapping[str, Any]) -> None:
    """Sources read into one batch: the same channels, pixel type and encodings, else
    refused naming both."""
    (first, manifest), *rest = manifests.items()

    def traits(m) -> dict[str, Any]:
        return {
            "image channels": m.image.channels,
            "image dtype": getattr(m.image, "dtype", "uint8"),
            "image encoding": m.image.encoding,
            "mask encoding": m.mask.encoding,
            "mask dtype": getattr(m.mask, "dtype", "uint8"),
        }

    ours = traits(manifest)
    for name, other in rest:
        for trait, value in traits(other).items():
            if value != ours[trait]:
                raise OptionsError(
                    f"datasets {first!r} and {name!r} differ in {trait} ({ours[trait]} and "
                    f"{value}): one batch holds pairs of one kind; convert one of them "
                    "again to match the other"
                )


def balanced_of(selections: Sequence[Selection]) -> ClassBalanced | None:
    """The ClassBalanced whose crop_fraction places a mix's class crops (one for all)."""
    balanced = [s.balanced for s in selections if s.balanced is not None]
    fractions = {b.crop_fraction for b in balanced}
    if len(fractions) > 1:
        raise OptionsError(
            f"the datasets' ClassBalanced samplings differ in crop_fraction "
            f"({sorted(fractions)}): a mix centres its crops with one"
        )
    return balanced[0] if balanced else None


class _Kind:
    def __init__(self, compressed: bool) -> None:
        self.compressed = compressed


def by_source(first: np.ndarray, indices: np.ndarray):
    """(source, positions in ``indices``, local indices) for each source present, where
    source ``s`` holds global indices ``first[s]`` on."""
    indices = np.asarray(indices, np.int64)
    source = np.searchsorted(first, indices, side="right") - 1
    for s in np.unique(source).tolist():
        positions = np.flatnonzero(source == s)
        yield s, positions, indices[positions] - first[s]


class MixedRecords:
    """The records of several splits by one global index (source ``s`` from
    ``first[s]`` on), with the SplitRecords interface the ordered reader uses."""

    def __init__(self, names: list[str], parts: list[Any]) -> None:
        self.names, self.parts = names, parts
        sizes = [len(part) for part in parts]
        self.first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.downloads = next((p.downloads for p in parts if p.downloads is not None), None)
        self.kind = _Kind(any(p.kind.compressed for p in parts))

    def __len__(self) -> int:
        return int(self.first[-1])

    def by_source(self, indices: np.ndarray):
        return by_source(self.first, indices)

    def read(self, indices) -> list[bytes]:
        out: list[bytes] = [b""] * len(indices)
        for s, positions, local in self.by_source(indices):
            for position, data in zip(positions, self.parts[s].read(local), strict=True):
                out[position] = data
        return out

    def read_each(self, indices, read_one) -> None:
        for s, positions, local in self.by_source(indices):
            self.parts[s].read_each(local, lambda k, *rest, p=positions: read_one(p[k], *rest))

    def located(self, index: int) -> str:
        (s, _, local), *_ = self.by_source(np.array([index]))
        return f"dataset {self.names[s]!r}: {self.parts[s].located(int(local[0]))}"

    def prefetch(self, indices) -> None:
        for s, _, local in self.by_source(indices):
            self.parts[s].prefetch(local)

    def read_through_page_cache(self) -> None:
        for part in self.parts:
            part.read_through_page_cache()

    def close(self) -> None:
        for part in self.parts:
            part.close()
