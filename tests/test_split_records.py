"""SplitRecords: records by global index, fork-safe, refusing a dataset replaced under it."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write_pairs

import tfshards
from tfshards.errors import DatasetChangedError
from tfshards.readers.shards import split_shards
from tfshards.schemas import Manifest
from tfshards.schemas.tfrecord import iter_records
from tfshards.sources import SplitRecords


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    images, masks = write_pairs(tmp_path / "data", count=11)
    out = tmp_path / "shards"
    tfshards.convert(images, masks, out, options=tfshards.ConvertOptions(num_shards=3))
    return out


def _all_records(out: Path) -> list[bytes]:
    records = []
    for shard in Manifest.load(out).splits["train"].shards:
        with open(out / shard.file, "rb") as stream:
            records += list(iter_records(stream))
    return records


def test_read_by_global_index_in_any_order(dataset: Path, tmp_path: Path) -> None:
    records = SplitRecords(split_shards(dataset, "train"), offsets_folder=tmp_path / "o")
    expected = _all_records(dataset)
    assert len(records) == len(expected) == 11
    order = np.random.default_rng(0).permutation(11)
    assert records.read(order) == [expected[i] for i in order]
    with pytest.raises(IndexError):
        records.read([11])


def test_pickled_and_forked_copies_open_their_own_files(dataset: Path, tmp_path: Path) -> None:
    records = SplitRecords(split_shards(dataset, "train"), offsets_folder=tmp_path / "o")
    first = records.read([0])
    copy = pickle.loads(pickle.dumps(records))
    assert copy.read([0]) == first
    pid = os.fork()
    if pid == 0:  # the child reads through its own descriptors
        os._exit(0 if records.read([0, 10]) == [first[0], _all_records(dataset)[10]] else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_a_shard_replaced_while_reading_stops_the_read(dataset: Path, tmp_path: Path) -> None:
    records = SplitRecords(split_shards(dataset, "train"), offsets_folder=tmp_path / "o")
    records.read([0])  # shard 0 open: it keeps reading the old file
    last = dataset / Manifest.load(dataset).splits["train"].shards[-1].file
    shutil.copy(last, tmp_path / "copy")
    os.replace(tmp_path / "copy", last)  # same bytes, another file
    assert records.read([1]) == _all_records(dataset)[1:2]
    with pytest.raises(DatasetChangedError, match="replaced while it was being read"):
        records.read([10])
