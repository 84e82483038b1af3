"""--index: offset/length index files that DALI and the tfrecord package read."""

from __future__ import annotations

import pytest
from conftest import write_pairs

from tfshards import OptionsError, convert, verify

tfrecord_reader = pytest.importorskip("tfrecord.reader")


def test_index_files_let_the_tfrecord_package_shard_records_across_workers(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 25)
    out = tmp_path / "out"
    manifest = convert(images, masks, out, num_shards=3, index=True, workers=1, progress=False)
    assert manifest.compression["type"] == "none"
    seen = []
    for shard in manifest.splits["train"].shards:
        index = out / f"{shard.file}.idx"
        lines = index.read_text().splitlines()
        assert len(lines) == shard.records
        offsets = [tuple(map(int, line.split())) for line in lines]
        assert offsets[0][0] == 0 and sum(length for _, length in offsets) == shard.bytes
        for worker in range(2):  # two simulated data-loader workers
            loader = tfrecord_reader.tfrecord_loader(
                str(out / shard.file), str(index), {"key": "byte"}, shard=(worker, 2)
            )
            seen += [bytes(example["key"]).decode() for example in loader]
    assert sorted(seen) == [f"{i:03d}" for i in range(25)]
    assert verify(out).ok


def test_index_needs_uncompressed_shards(tmp_path):
    with pytest.raises(OptionsError, match="index files need uncompressed shards"):
        convert(tmp_path, tmp_path, tmp_path / "out", index=True, compression="gzip")


def test_raw_with_index_defaults_to_no_compression(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 4)
    manifest = convert(
        images, masks, tmp_path / "out", encoding="raw", index=True, workers=1, progress=False
    )
    assert manifest.compression["type"] == "none"
    assert len(list((tmp_path / "out").glob("*.idx"))) == 1
