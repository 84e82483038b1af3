"""The shard planner and split assignment are pure: tested without I/O, with properties."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfshards.converters.pairing import Pair
from tfshards.converters.planning import plan_shards, shard_bounds, shard_counts, split_of
from tfshards.errors import OptionsError

keys = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=200, unique=True)


@given(st.integers(1, 5000), st.integers(1, 200))
def test_shard_bounds_cover_everything_evenly(records, shards):
    shards = min(shards, records)
    bounds = shard_bounds(records, shards)
    sizes = [end - start for start, end in bounds]
    assert sum(sizes) == records
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))


def test_shard_bounds_refuse_empty_shards():
    with pytest.raises(OptionsError, match="non-empty"):
        shard_bounds(3, 4)


@given(keys, st.integers(0, 2**31), st.floats(0, 0.45), st.floats(0, 0.45))
def test_each_key_lands_in_one_split_stably(names, seed, val, test):
    first = {k: split_of(k, seed, val, test) for k in names}
    assert set(first.values()) <= {"train", "val", "test"}
    # Adding keys never moves existing ones.
    more = {k: split_of(k, seed, val, test) for k in names + [f"new-{i}" for i in range(50)]}
    assert all(more[k] == first[k] for k in names)


def test_split_fractions_are_respected_on_average():
    splits = [split_of(f"{i:06d}", 0, 0.1, 0.2) for i in range(20000)]
    assert splits.count("val") / 20000 == pytest.approx(0.1, abs=0.01)
    assert splits.count("test") / 20000 == pytest.approx(0.2, abs=0.01)


def _pairs(names):
    return [Pair(k, Path(f"{k}.png"), Path(f"{k}.m.png")) for k in names]


@given(keys, st.integers(0, 100), st.one_of(st.none(), st.integers(1, 40)))
def test_plan_puts_every_pair_in_exactly_one_shard(names, seed, num_shards):
    arguments = dict(
        seed=seed,
        val_fraction=0.2,
        test_fraction=0.1,
        compression="gzip",
        num_shards=num_shards,
        shard_size=1000,
        pair_bytes=[100] * len(names),
    )
    splits = {split_of(name, seed, 0.2, 0.1) for name in names}
    if splits != {"train", "val", "test"}:  # a split asked for would be empty: refused
        with pytest.raises(OptionsError, match="split would be empty"):
            plan_shards(_pairs(names), **arguments)
        return
    specs = plan_shards(_pairs(names), **arguments)
    planned = [p.key for s in specs for p in s.pairs]
    assert sorted(planned) == sorted(names)
    for split in {s.split for s in specs}:
        sizes = [len(s.pairs) for s in specs if s.split == split]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        assert all(s.count == len(sizes) for s in specs if s.split == split)


def test_plan_is_shuffled_and_deterministic():
    names = [f"{i:04d}" for i in range(500)]
    a = plan_shards(
        _pairs(names),
        seed=1,
        val_fraction=0,
        test_fraction=0,
        compression="none",
        num_shards=4,
        shard_size=1,
        pair_bytes=[1] * len(names),
    )
    b = plan_shards(
        _pairs(reversed(names)),
        seed=1,
        val_fraction=0,
        test_fraction=0,
        compression="none",
        num_shards=4,
        shard_size=1,
        pair_bytes=[1] * len(names),
    )
    assert a == b
    order = [p.key for s in a for p in s.pairs]
    assert order != sorted(order)
    assert [s.file_name for s in a] == [f"train-0000{i}-of-00004.tfrecord" for i in range(4)]


def test_shard_counts_by_size_and_by_number():
    # size rules: 10 GB / 128 MiB = 74.5 -> 75 shards; 100 MB -> 1, but 100 records -> 1
    assert shard_counts(
        {"train": 1000, "val": 100},
        {"train": 10**10, "val": 10**8},
        num_shards=None,
        shard_size=128 * 2**20,
    ) == {"train": 75, "val": 1}
    # small bytes: one shard per 100 records, up to 16
    assert shard_counts(
        {"train": 1000}, {"train": 10**6}, num_shards=None, shard_size=128 * 2**20
    ) == {"train": 10}
    assert shard_counts(
        {"train": 900, "val": 100}, {"train": 1, "val": 1}, num_shards=16, shard_size=1
    ) == {"train": 16, "val": 2}
    # small data still gets some shards for parallelism, but never more than records
    assert shard_counts(
        {"train": 250, "val": 3}, {"train": 1, "val": 1}, num_shards=None, shard_size=2**27
    ) == {"train": 3, "val": 1}


def test_a_shard_sent_to_a_worker_carries_only_its_pairs():
    import pickle

    from tfshards.converters.pair_table import PairTable

    names = [f"folder/{i:06d}" for i in range(20000)]
    table = PairTable.from_pairs(_pairs(names))
    specs = plan_shards(
        table,
        seed=0,
        val_fraction=0.1,
        test_fraction=0,
        compression="none",
        num_shards=20,
        shard_size=1,
        pair_bytes=[1] * len(names),
    )
    whole = len(pickle.dumps(table))
    for spec in specs[:3]:
        sent = pickle.loads(pickle.dumps(spec))
        assert sent == spec and len(sent.pairs) == len(spec.pairs)
        assert len(pickle.dumps(spec)) < 3 * whole / len(specs)
    assert specs[0].pairs.keys is table.keys  # in the launching process: a view, no copy


def test_pair_table_keeps_odd_names_and_python_order():
    from tfshards.converters.pair_table import Strings

    names = ["b", "a\udcff", "a", "é", "z", "a\U0001f600", "\ud800x", ""]
    strings = Strings.from_list(names)
    assert [strings[i] for i in range(len(names))] == names
    fixed = np.array([n.encode("utf-8", "surrogatepass") for n in names], dtype=bytes)
    by_bytes = Strings.from_fixed(np.sort(fixed[:-1]))  # no empty names among files
    assert [by_bytes[i] for i in range(len(names) - 1)] == sorted(names[:-1])
    taken = strings.take(np.array([4, 0, 1]))
    assert [taken[i] for i in range(3)] == ["z", "b", "a\udcff"]
