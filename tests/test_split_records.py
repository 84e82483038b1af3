"""SplitRecords: records by global index, fork-safe, refusing a dataset replaced under it."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_pairs
from s3_server import upload_folder

import tfshards
from tfshards.errors import DatasetChangedError, OptionsError
from tfshards.readers.shards import split_shards
from tfshards.schemas import Manifest
from tfshards.schemas.format import compression
from tfshards.schemas.tfrecord import RecordError, iter_records
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


def test_a_split_larger_than_the_page_cache_asks_for_each_batchs_records_at_once(
    dataset: Path, tmp_path: Path, monkeypatch
) -> None:
    from tfshards.sources import records as records_module

    expected = _all_records(dataset)
    asked: list[tuple[int, int]] = []
    real_fadvise = os.posix_fadvise

    def counted(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            asked.append((offset, length))
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(records_module.os, "posix_fadvise", counted)
    monkeypatch.setattr(records_module, "outgrows_page_cache", lambda nbytes: True)
    large = SplitRecords(split_shards(dataset, "train"), offsets_folder=tmp_path / "o")
    order = np.random.default_rng(1).permutation(11)
    assert large.read(order) == [expected[i] for i in order]
    assert len(asked) == 11, "each record once, before it is read"
    assert sorted(length for _, length in asked) == sorted(len(r) + 16 for r in expected)
    asked.clear()
    monkeypatch.setattr(records_module, "outgrows_page_cache", lambda nbytes: False)
    small = SplitRecords(split_shards(dataset, "train"), offsets_folder=tmp_path / "o")
    assert small.read(order) == [expected[i] for i in order]
    assert asked == [], "a split that stays in the page cache is not asked for"


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


# ---------------------------------------------------------------- gzip/zlib shards


def _compressed(tmp_path: Path, kind: str) -> Path:
    images, masks = write_pairs(tmp_path / "data", count=9)
    out = tmp_path / f"shards-{kind}"
    options = tfshards.ConvertOptions(num_shards=2, compression=kind, encoding="raw")
    tfshards.convert(images, masks, out, options=options, progress=False)
    return out


def _records_through_stream(out: Path) -> list[bytes]:
    manifest = Manifest.load(out)
    kind = compression(manifest.compression.type)
    records = []
    for shard in manifest.splits["train"].shards:
        with kind.open(out / shard.file) as stream:
            records += list(iter_records(stream))
    return records


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_compressed_shards_are_inflated_once_into_the_user_cache(tmp_path: Path, kind: str) -> None:
    out = _compressed(tmp_path, kind)
    before = sorted(p.name for p in out.iterdir())
    inflated = tmp_path / "inflated"
    records = SplitRecords(
        split_shards(out, "train"), offsets_folder=tmp_path / "o", inflated_folder=inflated
    )
    expected = _records_through_stream(out)
    order = np.random.default_rng(1).permutation(len(expected))
    assert records.read(order) == [expected[i] for i in order]
    shards = Manifest.load(out).splits["train"].shards
    copies = sorted(inflated.glob("*.tfrecord"))
    assert [p.name for p in copies] == sorted(f"{s.sha256}.tfrecord" for s in shards)
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written beside the shards
    made = [p.stat().st_mtime_ns for p in copies]
    again = SplitRecords(split_shards(out, "train"), inflated_folder=inflated)
    assert again.read([0, len(expected) - 1]) == [expected[0], expected[-1]]
    assert [p.stat().st_mtime_ns for p in copies] == made  # read, not inflated again


def test_prefetch_inflates_ahead_of_the_read(tmp_path: Path) -> None:
    out = _compressed(tmp_path, "gzip")
    inflated = tmp_path / "inflated"
    records = SplitRecords(split_shards(out, "train"), inflated_folder=inflated)
    records.prefetch([len(records) - 1])  # the last shard only
    last = Manifest.load(out).splits["train"].shards[-1]
    assert [p.name for p in inflated.glob("*.tfrecord")] == [f"{last.sha256}.tfrecord"]


def test_a_corrupt_compressed_shard_is_named_and_no_copy_is_kept(tmp_path: Path) -> None:
    out = _compressed(tmp_path, "gzip")
    shard = out / Manifest.load(out).splits["train"].shards[0].file
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(0, 0))  # keep the size; the identity taken at open sees this file
    inflated = tmp_path / "inflated"
    records = SplitRecords(split_shards(out, "train"), inflated_folder=inflated)
    with pytest.raises(RecordError, match=rf"{shard.name}: (corrupt gzip|its sha256)"):
        records.read([0])
    assert list(inflated.glob("*.tfrecord")) == []
    assert [p for p in inflated.iterdir() if p.name.startswith(".inflating-")] == []


# ---------------------------------------------------------------- a dataset in a bucket


def _cached_shards(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*/*.tfrecord"))


def test_a_bucket_is_read_through_the_shard_cache_and_prefetched(
    dataset: Path, s3_bucket: str, tmp_path: Path
) -> None:
    upload_folder(dataset, s3_bucket)
    cache = tmp_path / "cache"
    records = SplitRecords(split_shards(s3_bucket, "train"), shard_cache=cache)
    files = [s.file for s in Manifest.load(dataset).splits["train"].shards]
    records.prefetch([len(records) - 1])
    assert _cached_shards(cache) == [files[-1]]
    pid = os.fork()
    if pid == 0:  # a worker downloads through a helper process of its own
        os._exit(0 if records.read([0]) == _all_records(dataset)[:1] else 1)
    assert os.waitpid(pid, 0)[1] == 0
    expected = _all_records(dataset)
    order = np.random.default_rng(2).permutation(len(expected))
    assert records.read(order) == [expected[i] for i in order]  # the parent's helper still works
    assert _cached_shards(cache) == sorted(files)


def test_a_gzip_dataset_in_a_bucket_is_downloaded_then_inflated(
    tmp_path: Path, s3_bucket: str
) -> None:
    out = _compressed(tmp_path, "gzip")
    upload_folder(out, s3_bucket)
    records = SplitRecords(
        split_shards(s3_bucket, "train"),
        shard_cache=tmp_path / "cache",
        inflated_folder=tmp_path / "inflated",
    )
    expected = _records_through_stream(out)
    assert records.read(range(len(expected))[::-1]) == expected[::-1]
    assert len(list((tmp_path / "inflated").glob("*.tfrecord"))) == 2


def test_a_shard_cache_limit_is_kept_and_too_small_a_limit_is_refused(
    tmp_path: Path, s3_bucket: str
) -> None:
    images, masks = write_pairs(tmp_path / "data", count=24)
    out = tmp_path / "shards"
    tfshards.convert(images, masks, out, num_shards=8, encoding="raw", progress=False)
    upload_folder(out, s3_bucket)
    largest = max(s.bytes for s in Manifest.load(out).splits["train"].shards)
    with pytest.raises(OptionsError, match="holds 2 of this dataset's shards"):
        SplitRecords(split_shards(s3_bucket, "train"), shard_cache_limit=2 * largest + 1)
    cache = tmp_path / "cache"
    records = SplitRecords(
        split_shards(s3_bucket, "train"), shard_cache=cache, shard_cache_limit=4 * largest
    )
    expected = _all_records(out)
    for index in np.random.default_rng(3).permutation(len(expected)):
        assert records.read([index]) == [expected[index]]
        assert sum(p.stat().st_size for p in cache.rglob("*.tfrecord")) <= 4 * largest


def test_a_downloaded_copy_damaged_while_in_use_is_downloaded_again(
    dataset: Path, s3_bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    upload_folder(dataset, s3_bucket)
    cache = tmp_path / "cache"
    records = SplitRecords(
        split_shards(s3_bucket, "train"), shard_cache=cache, offsets_folder=tmp_path / "o"
    )
    expected = _all_records(dataset)
    assert records.read(range(11)) == expected  # checked once, trusted since
    copy = next(cache.glob("*/" + Manifest.load(dataset).splits["train"].shards[1].file))
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same file, changed under the open reader
    copy.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="tfshards"):
        assert records.read(range(11)) == expected
    assert f"{copy}: this copy in the user cache folder is damaged" in caplog.text
    assert f"{copy}: this copy in the shard cache differs from the manifest's" in caplog.text
    assert copy.read_bytes() == (dataset / copy.name).read_bytes()  # downloaded again


def test_reading_compressed_shards_and_the_shard_cache_import_no_tensorflow(
    tmp_path: Path,
) -> None:
    out = _compressed(tmp_path, "zlib")
    program = (
        "import sys\n"
        "import tfshards.readers.shard_cache\n"
        "from tfshards.readers.shards import split_shards\n"
        "from tfshards.sources import SplitRecords\n"
        f"records = SplitRecords(split_shards({str(out)!r}, 'train'),"
        f" inflated_folder=__import__('pathlib').Path({str(tmp_path / 'i')!r}))\n"
        "assert len(records.read(range(len(records)))) == 9\n"
        "print('tensorflow' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"


def test_threads_reading_beyond_the_open_file_limit_never_lose_a_descriptor(dataset, tmp_path):
    """A descriptor in use by one thread is never closed by another opening a shard."""
    from concurrent.futures import ThreadPoolExecutor

    records = SplitRecords(split_shards(dataset, "train"), offsets_folder=tmp_path / "o")
    records.open_files = 1  # every shard opened closes another, unless it is in use
    expected = _all_records(dataset)
    rng = np.random.default_rng(0)
    batches = [rng.permutation(11)[:5] for _ in range(300)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(records.read, batches))
    assert all(
        got == [expected[i] for i in batch] for got, batch in zip(results, batches, strict=True)
    )
    assert len(records._files) <= 1
