"""The ReadPlan of a mixed read (mixing.py): each source planned as a read of it alone,
then joined: one virtual split (``MixedRecords``), one order (``MixOrder``), one cache
entry per source (``MixedStore``), the masks read through each source's label map."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from tfshards.errors import OptionsError
from tfshards.readers.mixing import (
    Mix,
    MixedRecords,
    Part,
    Source,
    balanced_of,
    by_source,
    check_alike,
    check_distinct,
    mix_digest,
    mix_epoch_size,
    mix_shares,
    naming,
    refuse_one_for_all,
    resolved_maps,
    shared_labels,
    sources_of,
)
from tfshards.readers.plan import Batching, ReadPlan, mapped_finishing, plan_read
from tfshards.readers.sampling import Selection
from tfshards.readers.selection import select
from tfshards.sources.pixel_batches import aligned_empty

PER_SOURCE = ("records", "sampling", "label_map")


def plan_mix(path: Mapping, **a: Any) -> ReadPlan:
    """The plan of ``read({name: path or Source}, weights=..., epoch_size=..., ...)``."""
    sources = sources_of(path)
    refuse_one_for_all({name: a.get(name) for name in PER_SOURCE})
    if a.get("service") is not None:
        raise OptionsError("several datasets cannot be read through the tf.data service")
    if a.get("normalize"):  # each dataset's statistics are its own; one set is not defined
        raise OptionsError(
            "normalize=True with several datasets: their per-channel statistics differ and "
            "a mix has none of its own; read float32 or uint16 and normalize in the model "
            "(e.g. keras.layers.Normalization with the statistics you choose)"
        )
    shares = mix_shares(a.get("weights"), list(sources))
    plans = _source_plans(sources, a)
    manifests = {name: plan.shards.manifest for name, plan in plans.items()}
    check_alike(manifests)
    check_distinct({name: plan.shards for name, plan in plans.items()})
    maps = resolved_maps(sources, manifests, a.get("num_classes"))
    plans = _alike_shapes(plans, a)
    parts = tuple(_part(name, source, plans[name], maps[name]) for name, source in sources.items())
    size = mix_epoch_size(a.get("epoch_size"), [part.plan.selection for part in parts], shares)
    selection = _mixed_selection(parts, shares, size)
    mix = Mix(parts, shares, size, selection)
    first = parts[0].plan
    labels = shared_labels(parts)
    return replace(
        first,
        finishing=mapped_finishing(first.shards, a, labels),
        records=_joined_records(parts),
        selection=selection,
        batching=Batching(first.batching.size, first.batching.drop_remainder, size),
        labels=labels,
        mix=mix,
    )


def _joined_records(parts: tuple[Part, ...]):
    """The sources' records by one index. Local shards of one compression are one split
    of all their shards (SplitRecords: a batch's reads cost what one dataset's do);
    otherwise each source's own SplitRecords behind MixedRecords."""
    from tfshards.readers.shards import SplitShards
    from tfshards.sources.records import SplitRecords

    plans = [part.plan for part in parts]
    kinds = {plan.shards.manifest.compression.type for plan in plans}
    if any(plan.shards.remote for plan in plans) or len(kinds) > 1:
        return MixedRecords([part.name for part in parts], [plan.records for plan in plans])
    first = plans[0]
    joined = SplitShards(
        first.shards.manifest,
        first.shards.split,
        sum((plan.shards.paths for plan in plans), ()),
        sum((plan.shards.shards for plan in plans), ()),
        first.shards.root,
    )
    options = first.options
    return SplitRecords.for_options(joined, options)


def _source_plans(sources: Mapping[str, Source], a: dict[str, Any]) -> dict[str, ReadPlan]:
    """Each source planned as a read of it alone (its errors named by the source)."""
    alone = {**a, "epoch_size": None, "num_classes": None, "weights": None}
    plans = {}
    for name, source in sources.items():
        arguments = {**alone, "path": source.path, "split": source.split or a["split"]}
        with naming(name):
            plans[name] = plan_read(**arguments)
    return plans


def _alike_shapes(plans: dict[str, ReadPlan], a: dict[str, Any]) -> dict[str, ReadPlan]:
    """Sources of different stored sizes: resized (``image_size``), or each record kept
    at its own size for ``crop_size``/``pad_to``/``batch_size=1``; else refused."""
    stored = {name: plan.decoder.stored for name, plan in plans.items()}
    if len(set(stored.values())) == 1:
        return plans
    (one, first), *others = stored.items()
    other, second = next((n, s) for n, s in others if s != first)
    plan = next(iter(plans.values()))
    if a["image_size"] is None and not plan.sizing.active and plan.batching.size != 1:
        raise OptionsError(
            f"datasets {one!r} and {other!r} differ in size ({_size(first)} and "
            f"{_size(second)}): pass crop_size=(h, w) to train on crops, pad_to or "
            "batch_size=1 to evaluate, or image_size=(h, w) to resize them all"
        )
    out = {}
    for name, plan in plans.items():
        decoder = replace(plan.decoder, stored=None)
        if a["image_size"] is None:
            decoder = replace(decoder, shape=(None, None, decoder.shape[2]))
        out[name] = replace(plan, decoder=decoder)
    return out


def _size(stored: tuple[int, int, int] | None) -> str:
    return "records of many sizes" if stored is None else f"{stored[0]}x{stored[1]}"


def _part(name: str, source: Source, plan: ReadPlan, labels) -> Part:
    """A source with its selection (records=, sampling=), in the shared classes."""
    if source.records is None and source.sampling is None:
        count = plan.shards.records
        selection = Selection(records=count, subset=None, weights=None, epoch_size=count)
        return Part(name, replace(plan, selection=selection), labels)
    from tfshards.sources.record_tables import split_table

    shards = plan.shards
    table = split_table(shards, storage_options=plan.options.storage_options)
    if len(table) != shards.records:
        raise OptionsError(
            f"dataset {name!r}: its per-record table has {len(table)} rows but the split "
            f"holds {shards.records} records; run `tfshards verify` on {shards.root}"
        )
    table = table if labels is None else labels.table(table)
    try:
        selection = select(table, source.records, source.sampling, None)
    except OptionsError as exc:
        raise OptionsError(f"dataset {name!r}: {exc}") from exc
    return Part(name, replace(plan, selection=selection), labels, table)


def _mixed_selection(parts: tuple[Part, ...], shares: np.ndarray, size: int) -> Selection:
    """The whole mix as one Selection over the joined records: each record's expected
    copies (its source's share of ``size``, spread as the source's selection spreads
    its own), the digest, and what class-balanced crops need."""
    weights = []
    for part, share in zip(parts, shares, strict=True):
        expected = part.plan.selection.expected()
        weights.append(expected * (share / expected.sum()))
    joined = np.concatenate(weights)
    balanced = balanced_of([part.plan.selection for part in parts])
    table = None
    if balanced is not None:
        table = _joined_table(parts)
    return Selection(
        records=len(joined),
        subset=None,
        weights=joined / joined.max(),
        epoch_size=size,
        digest=mix_digest(parts, shares, size),
        balanced=balanced,
        table=table,
    )


def _joined_table(parts: tuple[Part, ...]):
    """The sources' tables one after another, in the shared classes (class crops)."""
    from tfshards.schemas.record_table import RecordTable
    from tfshards.sources.record_tables import split_table

    tables = []
    for part in parts:
        table = part.table
        if table is None:
            shards = part.plan.shards
            table = split_table(shards, storage_options=part.plan.options.storage_options)
            table = table if part.labels is None else part.labels.table(table)
        tables.append(table)
    return RecordTable.concatenated(tables, max(t.num_classes for t in tables))


class MixedStore:
    """One cache entry per source, addressed by global record index (None for a source
    of weight 0: never read, so never cached, and not waited for)."""

    def __init__(self, first: np.ndarray, stores: list[Any], rows: list[Any]) -> None:
        self.first, self.stores, self.rows = first, stores, rows

    @property
    def ready(self) -> bool:
        return all(store.ready for store in self.stores if store is not None)

    def _rows(self, s: int, local: np.ndarray) -> np.ndarray:
        return local if self.rows[s] is None else self.rows[s][local]

    def read(self, indices: np.ndarray):
        images = masks = None
        for s, positions, local in by_source(self.first, indices):
            some_images, some_masks = self.stores[s].read(self._rows(s, local))
            if isinstance(some_images, list):  # records of many sizes: lists
                images = images or [None] * len(indices)
                masks = masks or [None] * len(indices)
            elif images is None:
                images = aligned_empty((len(indices), *some_images.shape[1:]))
                masks = aligned_empty((len(indices), *some_masks.shape[1:]))
            for k, position in enumerate(positions.tolist()):
                images[position], masks[position] = some_images[k], some_masks[k]
        return images, masks

    def write(self, indices: np.ndarray, images, masks) -> None:
        for s, positions, local in by_source(self.first, indices):
            if isinstance(images, list):
                some = [images[p] for p in positions], [masks[p] for p in positions]
            else:
                some = images[positions], masks[positions]
            self.stores[s].write(self._rows(s, local), *some)


def mixed_store(plan: ReadPlan) -> MixedStore | None:
    """The cache of a mixed read: each source's entry, as a read of it alone keeps it."""
    from tfshards.readers.ordered import store_rows
    from tfshards.readers.pipeline import pair_store

    if plan.cache.kind == "none":
        return None
    parts, shares = plan.mix.parts, plan.mix.shares
    stores = [
        pair_store(part.plan) if share > 0 else None
        for part, share in zip(parts, shares, strict=True)
    ]
    rows = [store_rows(part.plan.selection) for part in parts]
    return MixedStore(plan.mix.offsets, stores, rows)
