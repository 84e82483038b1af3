"""--index: offset/length index files that DALI and the tfrecord package read."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import write_pairs

from tfshards import OptionsError, convert, verify

# The tfrecord package bundles its own copy of TensorFlow's example.proto, which cannot
# share a process with TensorFlow's, so it reads in a subprocess (as a PyTorch loader would).
READER = """
import json, sys
from tfrecord.reader import tfrecord_loader
keys = []
for data, index in json.loads(sys.argv[1]):
    for worker in range(2):  # two simulated data-loader workers
        loader = tfrecord_loader(data, index, {"key": "byte"}, shard=(worker, 2))
        keys += [bytes(example["key"]).decode() for example in loader]
print(json.dumps(keys))
"""


@pytest.mark.skipif(importlib.util.find_spec("tfrecord") is None, reason="needs tfrecord")
def test_index_files_let_the_tfrecord_package_shard_records_across_workers(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 25)
    out = tmp_path / "out"
    manifest = convert(images, masks, out, num_shards=3, index=True, workers=1, progress=False)
    assert manifest.compression.type == "none"
    files = []
    for shard in manifest.splits["train"].shards:
        index = out / f"{shard.file}.idx"
        lines = index.read_text().splitlines()
        assert len(lines) == shard.records
        offsets = [tuple(map(int, line.split())) for line in lines]
        assert offsets[0][0] == 0 and sum(length for _, length in offsets) == shard.bytes
        files.append([str(out / shard.file), str(index)])
    done = subprocess.run(
        [sys.executable, "-c", READER, json.dumps(files)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert sorted(json.loads(done.stdout)) == [f"{i:03d}" for i in range(25)]
    assert verify(out).ok


def test_index_needs_uncompressed_shards(tmp_path):
    with pytest.raises(OptionsError, match="index files need uncompressed shards"):
        convert(tmp_path, tmp_path, tmp_path / "out", index=True, compression="gzip")


def test_raw_with_index_defaults_to_no_compression(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 4)
    manifest = convert(
        images, masks, tmp_path / "out", encoding="raw", index=True, workers=1, progress=False
    )
    assert manifest.compression.type == "none"
    assert len(list((tmp_path / "out").glob("*.idx"))) == 1
