"""Record offsets: .idx files, header scans, and reads by offset with CRCs checked."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import write_pairs

import tfshards
from tfshards.schemas import Manifest
from tfshards.schemas.offsets import (
    RecordOffsets,
    load_index,
    read_record,
    scan_offsets,
    shard_offsets,
)
from tfshards.schemas.tfrecord import RecordError, iter_records


@pytest.fixture
def indexed(tmp_path: Path) -> Path:
    images, masks = write_pairs(tmp_path / "data", count=9)
    out = tmp_path / "shards"
    tfshards.convert(images, masks, out, options=tfshards.ConvertOptions(num_shards=2, index=True))
    return out


def _shards(out: Path) -> list[Path]:
    return [out / shard.file for shard in Manifest.load(out).splits["train"].shards]


def test_scan_matches_index_and_reads_every_record(indexed: Path) -> None:
    for path in _shards(indexed):
        size = path.stat().st_size
        scanned, listed = scan_offsets(path), load_index(Path(f"{path}.idx"), size)
        assert np.array_equal(scanned.starts, listed.starts)
        assert np.array_equal(scanned.lengths, listed.lengths)
        with open(path, "rb") as stream:
            expected = list(iter_records(stream))
        fd = os.open(path, os.O_RDONLY)
        try:
            got = [
                read_record(fd, s, n, f"{path.name} record {i}")
                for i, (s, n) in enumerate(zip(scanned.starts, scanned.lengths, strict=True))
            ]
        finally:
            os.close(fd)
        assert got == expected


def test_scanned_offsets_are_kept_outside_the_dataset(indexed: Path, tmp_path: Path) -> None:
    path = _shards(indexed)[0]
    os.remove(f"{path}.idx")
    keep = tmp_path / "kept"
    shard = Manifest.load(indexed).splits["train"].shards[0]
    first = shard_offsets(path, shard.sha256, shard.bytes, keep)
    assert (keep / f"{shard.sha256}.npz").is_file()
    again = shard_offsets(path, shard.sha256, shard.bytes, keep)
    assert np.array_equal(first.starts, again.starts)
    assert sorted(p.name for p in indexed.iterdir() if p.name.endswith(".npz")) == []


def test_corrupt_record_names_where(indexed: Path) -> None:
    path = _shards(indexed)[0]
    offsets = scan_offsets(path)
    data = bytearray(path.read_bytes())
    data[int(offsets.starts[1]) + 40] ^= 0xFF
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(RecordError, match="record 1: data CRC mismatch"):
            read_record(fd, offsets.starts[1], offsets.lengths[1], f"{path.name}: record 1")
    finally:
        os.close(fd)


def test_index_of_another_shard_version_is_refused(indexed: Path) -> None:
    path = _shards(indexed)[0]
    with pytest.raises(RecordError, match="belongs to another version"):
        load_index(Path(f"{path}.idx"), path.stat().st_size + 10)


def test_truncated_shard_scan_fails(indexed: Path) -> None:
    path = _shards(indexed)[0]
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(RecordError, match="truncated"):
        scan_offsets(path)


def test_from_starts_lengths_reach_the_end() -> None:
    offsets = RecordOffsets.from_starts(np.array([0, 10, 25]), 40)
    assert offsets.lengths.tolist() == [10, 15, 15]


def test_kept_offsets_that_disagree_with_the_shard_are_named_and_scanned_again(
    indexed: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shards = Manifest.load(indexed).splits["train"].shards
    paths = _shards(indexed)
    for path in paths:
        os.remove(f"{path}.idx")
    keep = tmp_path / "kept"
    first = shard_offsets(paths[0], shards[0].sha256, shards[0].bytes, keep)
    shard_offsets(paths[1], shards[1].sha256, shards[1].bytes, keep)
    kept = keep / f"{shards[0].sha256}.npz"
    kept.write_bytes((keep / f"{shards[1].sha256}.npz").read_bytes())  # another shard's
    with caplog.at_level("WARNING", logger="tfshards"):
        again = shard_offsets(
            paths[0], shards[0].sha256, shards[0].bytes, keep, records=shards[0].records
        )
    assert np.array_equal(again.starts, first.starts) and len(again) == shards[0].records
    assert f"{kept}: kept offsets are those of a file of {shards[1].bytes} bytes" in caplog.text
    assert "not at fault" in caplog.text
    assert np.array_equal(np.load(kept)["starts"], first.starts)  # kept again, right
