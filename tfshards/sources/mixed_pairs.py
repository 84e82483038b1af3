"""``tfshards.Pairs({name: path or Source}, weights=..., epoch_size=..., seed=...)``: several
datasets by index, for PyTorch and Grain, with the epochs ``tfshards.read`` draws.

Pair ``i`` is record ``i`` of the datasets' splits joined in the mapping's order (the
global index of ``read``'s mix), each mask read through its dataset's label map.
``epoch(e)`` is epoch ``e`` of the mix as global indices, the same as ``read`` with the
same arguments and seed: a sampler for PyTorch's ``DataLoader`` (``sampler=``), or the
indices a Grain ``MapDataset`` maps over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfshards.errors import OptionsError
from tfshards.readers.mixing import (
    MixOrder,
    check_alike,
    check_distinct,
    mix_epoch_size,
    mix_order,
    mix_shares,
    naming,
    resolved_maps,
    sources_of,
)
from tfshards.readers.order import group_shards
from tfshards.readers.sampling import Selection
from tfshards.readers.selection import select
from tfshards.sources.pairs import Pairs, _index


class MixedPairs(Pairs):
    """Several datasets' pairs by one index (see the module docstring)."""

    def __init__(
        self,
        path: Mapping,
        split: str = "train",
        *,
        transform=None,
        with_keys: bool = False,
        options=None,
        records: Any = None,
        label_map: Any = None,
        weights: Any = None,
        epoch_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if records is not None or label_map is not None:
            raise OptionsError(
                "records= and label_map= with several datasets are given to each: "
                "tfshards.Source(path, records=..., label_map=...)"
            )
        sources = sources_of(path)
        self.names = list(sources)
        self.shares = mix_shares(weights, self.names)
        self.parts = []
        for name, s in sources.items():
            with naming(name):
                pairs = Pairs(s.path, s.split or split, with_keys=True, options=options)
            self.parts.append(pairs)
        manifests = dict(zip(self.names, (p.manifest for p in self.parts), strict=True))
        check_alike(manifests)  # as read() refuses them: pairs of one kind
        check_distinct(dict(zip(self.names, (p.records.shards for p in self.parts), strict=True)))
        maps = resolved_maps(sources, manifests, None)
        for part, name in zip(self.parts, self.names, strict=True):
            part.labels = maps[name]
        self.transform, self.with_keys, self.split = transform, with_keys, split
        self.labels = None  # each part reads its masks through its own map
        selections = [
            _selection(part, source, name)
            for part, source, name in zip(self.parts, sources.values(), self.names, strict=True)
        ]
        size = mix_epoch_size(epoch_size, selections, self.shares)
        self.order = _order(self.parts, selections, self.shares, size, seed, shuffle, options)
        self.first = np.concatenate([[0], np.cumsum([len(p.records) for p in self.parts])])

    def __len__(self) -> int:
        return int(self.first[-1])

    def __repr__(self) -> str:
        return f"Pairs({self.names}, split={self.split!r}): {len(self)} pairs"

    def epoch(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch`` of the mix: global pair indices, as ``tfshards.read`` reads it."""
        return self.order.records(epoch)

    def record_index(self, index: int) -> int:
        return _index(index, len(self))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        indices = np.asarray([self.record_index(i) for i in indices], np.int64)
        source = np.searchsorted(self.first, indices, side="right") - 1
        out: list[Any] = [None] * len(indices)
        for s in np.unique(source).tolist():
            positions = np.flatnonzero(source == s)
            local = (indices[positions] - self.first[s]).tolist()
            for position, pair in zip(positions, self.parts[s].__getitems__(local), strict=True):
                out[position] = self._finish(pair)
        return out

    def key(self, index: int) -> str:
        return self.__getitems__([index])[0][2] if self.with_keys else self._key(index)

    def _key(self, index: int) -> str:
        index = self.record_index(index)
        s = int(np.searchsorted(self.first, index, side="right") - 1)
        return self.parts[s].key(index - int(self.first[s]))

    def prefetch(self, indices: Sequence[int]) -> None:
        for index in indices:
            index = self.record_index(index)  # a negative one counts from the end
            s = int(np.searchsorted(self.first, index, side="right") - 1)
            self.parts[s].prefetch([index - int(self.first[s])])

    def close(self) -> None:
        for part in self.parts:
            part.close()


def _selection(pairs: Pairs, source, name: str) -> Selection:
    """What a source's epochs draw from: all its records, or its records=/sampling=."""
    count = len(pairs.records)
    if source.records is None and source.sampling is None:
        return Selection(records=count, subset=None, weights=None, epoch_size=count)
    from tfshards.sources.record_tables import split_table

    table = split_table(pairs.records.shards)
    table = table if pairs.labels is None else pairs.labels.table(table)
    try:
        return select(table, source.records, source.sampling, None)
    except OptionsError as exc:
        raise OptionsError(f"dataset {name!r}: {exc}") from exc


def _order(parts, selections, shares, size, seed, shuffle, options) -> MixOrder:
    """The mix's order, with the shard groups ``read`` uses for local datasets."""
    shard_records, groups = [], []
    for part in parts:
        shards = part.records.shards
        shard_records.append(tuple(shard.records for shard in shards.shards))
        sizes = [shard.bytes for shard in shards.shards]
        cycle = getattr(options, "cycle_length", None)
        groups.append(group_shards(sizes, cycle, remote=shards.remote))
    return mix_order(shard_records, groups, selections, shares, size, seed, shuffle)
