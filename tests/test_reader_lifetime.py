"""A read() dataset's caches live as long as the dataset (or an iterator of it), not as
long as the program: TensorFlow keeps py_function bodies until the program ends."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from pathlib import Path

import pytest
import tensorflow as tf
from conftest import write_pairs

import tfshards


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lifetime")
    images, masks = write_pairs(root / "data", 10, size=(16, 12))
    tfshards.convert(images, masks, root / "shards", num_shards=2, workers=1, progress=False)
    return root / "shards"


def open_files_under(folder: Path) -> list[str]:
    opened = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since listed
            continue
        if target.startswith(str(folder)):
            opened.append(target)
    return opened


def pairs_in(dataset) -> int:
    return sum(int(image.shape[0]) for image, _ in dataset)


@pytest.mark.parametrize("encoding", ["deflate", "png"])
def test_a_dropped_dataset_closes_its_disk_cache_files(small, tmp_path, encoding):
    shards = small
    if encoding == "png":
        shards = tmp_path / "png"
        tfshards.convert(
            small.parent / "data" / "images",
            small.parent / "data" / "masks",
            shards,
            num_shards=2,
            workers=1,
            encoding="png",
            progress=False,
        )
    cache = tmp_path / "cache"
    for _ in range(2):  # the pass that builds the cache, then one that reads it
        dataset = tfshards.read(shards, batch_size=4, seed=0, cache=cache)
        assert pairs_in(dataset) == 10
        assert open_files_under(cache), "the ready cache is open while the dataset lives"
        del dataset
        gc.collect()
        assert open_files_under(cache) == []


def test_a_dropped_dataset_frees_its_memory_cache(small):
    dataset = tfshards.read(small, batch_size=4, seed=0, cache="memory")
    assert pairs_in(dataset) == 10
    store = weakref.ref(dataset._tfshards_reader.store)
    assert store().ready
    del dataset
    gc.collect()
    assert store() is None, "the decoded pairs in RAM went with the dataset"


def test_an_iterator_reads_on_after_its_dataset_is_dropped(small, tmp_path):
    iterator = iter(tfshards.read(small, batch_size=4, seed=0, cache=tmp_path / "cache"))
    first = int(next(iterator)[0].shape[0])
    gc.collect()
    assert first + pairs_in(iterator) == 10


def test_a_dataset_made_inside_a_tf_function_reads_each_call(small):
    @tf.function
    def pairs_counted() -> tf.Tensor:
        count = tf.constant(0)
        for image, _ in tfshards.read(small, batch_size=4, seed=0, cache="memory"):
            count += tf.shape(image)[0]
        return count

    assert int(pairs_counted()) == 10
    gc.collect()  # the Python dataset is gone; its graph still runs
    assert int(pairs_counted()) == 10


def test_a_build_dropped_before_its_end_is_removed(small, tmp_path):
    cache = tmp_path / "cache"
    iterator = iter(tfshards.read(small, batch_size=4, seed=0, cache=cache))
    next(iterator)
    building = list(cache.rglob(".building-*"))
    assert building and open_files_under(cache)
    del iterator
    gc.collect()
    assert open_files_under(cache) == []
    assert not any(folder.exists() for folder in building), "nobody can finish it"
    again = tfshards.read(small, batch_size=4, seed=0, cache=cache)
    assert pairs_in(again) == 10 and pairs_in(again) == 10  # built, then read


def test_a_build_is_flushed_in_the_background_while_it_is_written(small, tmp_path, monkeypatch):
    from tfshards.readers.cache import store

    flushed_by = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        flushed_by.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(store, "WRITE_BEHIND_BYTES", 1)  # every batch
    monkeypatch.setattr(store, "UNFLUSHED_MAX_BYTES", 0)  # as if larger than memory allows
    monkeypatch.setattr(store.os, "fdatasync", counted)
    cache = tmp_path / "cache"
    streamed = [pair for pair in tfshards.read(small, batch_size=4, seed=0)]
    built = [pair for pair in tfshards.read(small, batch_size=4, seed=0, cache=cache)]
    assert set(flushed_by) == {"tfshards-cache-flush"}, "never by the reading threads"
    assert len(flushed_by) >= 2  # both files, at least once
    (entry,) = [e for e in tfshards.list_caches(cache) if e.state == "ready"]
    read_back = [pair for pair in tfshards.read(small, batch_size=4, seed=0, cache=cache)]
    for (image, mask), (built_image, built_mask), (cached_image, cached_mask) in zip(
        streamed, built, read_back, strict=True
    ):
        assert (image.numpy() == built_image.numpy()).all()
        assert (image.numpy() == cached_image.numpy()).all()
        assert (mask.numpy() == built_mask.numpy()).all()
        assert (mask.numpy() == cached_mask.numpy()).all()


def test_a_build_small_beside_memory_is_left_to_the_page_cache_until_published(
    small, tmp_path, monkeypatch
):
    from tfshards.readers.cache import store

    flushes: list[str] = []
    monkeypatch.setattr(store, "WRITE_BEHIND_BYTES", 1)  # would flush every batch
    monkeypatch.setattr(store.os, "fdatasync", lambda fd: flushes.append("fdatasync"))
    cache = tmp_path / "cache"

    def flush_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "tfshards-cache-flush"}

    earlier = flush_threads()  # another test's, if any: not this build's
    streamed = [pair for pair in tfshards.read(small, batch_size=4, seed=0)]
    built = [pair for pair in tfshards.read(small, batch_size=4, seed=0, cache=cache)]
    assert flushes == [], "no write-behind for an entry this small"
    assert flush_threads() <= earlier, "no flush thread started for it"
    (entry,) = [e for e in tfshards.list_caches(cache) if e.state == "ready"]  # fsynced
    read_back = [pair for pair in tfshards.read(small, batch_size=4, seed=0, cache=cache)]
    for (image, mask), built_pair, cached_pair in zip(streamed, built, read_back, strict=True):
        for other_image, other_mask in (built_pair, cached_pair):
            assert (image.numpy() == other_image.numpy()).all()
            assert (mask.numpy() == other_mask.numpy()).all()


def test_which_builds_are_flushed_while_they_are_written(monkeypatch):
    from tfshards.readers.cache import store

    monkeypatch.setattr(store, "usable_memory", lambda: 16 * 2**30)
    assert not store.flushed_while_built(2**30)  # under a tenth of memory: the page cache
    assert store.flushed_while_built(2 * 2**30)  # over a tenth
    monkeypatch.setattr(store, "usable_memory", lambda: 256 * 2**30)
    assert store.flushed_while_built(3 * 2**30)  # over 2 GiB, however large the memory
    monkeypatch.setattr(store, "usable_memory", lambda: None)
    assert store.flushed_while_built(1), "memory unknown: flushed"


def test_which_files_are_read_with_a_batchs_pieces_asked_for_at_once(monkeypatch):
    from tfshards.readers import memory_limits

    monkeypatch.setattr(memory_limits, "usable_memory", lambda: 16 * 2**30)
    assert not memory_limits.outgrows_page_cache(8 * 2**30)  # half: stays in the page cache
    assert memory_limits.outgrows_page_cache(8 * 2**30 + 1)
    monkeypatch.setattr(memory_limits, "usable_memory", lambda: None)
    assert memory_limits.outgrows_page_cache(1), "memory unknown: read from the disk"


def test_a_cache_larger_than_memory_asks_for_each_batchs_pairs_and_reads_them_right(
    small, tmp_path, monkeypatch
):
    from tfshards.readers.cache import store

    cache = tmp_path / "cache"
    streamed = _pairs(tfshards.read(small, batch_size=4, seed=0))
    assert _same(_pairs(tfshards.read(small, batch_size=4, seed=0, cache=cache)), streamed)
    asked: list[tuple[int, int, int]] = []
    real_fadvise = store.os.posix_fadvise

    def counted(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == store.os.POSIX_FADV_WILLNEED:
            asked.append((fd, offset, length))
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(store.os, "posix_fadvise", counted)
    monkeypatch.setattr(store, "outgrows_page_cache", lambda nbytes: True)
    assert _same(_pairs(tfshards.read(small, batch_size=4, seed=0, cache=cache)), streamed)
    assert len(asked) == 2 * 10, "each pair of the epoch, in both files, once"
    for fd in {fd for fd, _, _ in asked}:  # the image file and the mask file
        lengths = {length for f, _, length in asked if f == fd}
        offsets = sorted(offset for f, offset, _ in asked if f == fd)
        (length,) = lengths
        assert offsets == [index * length for index in range(10)]
    asked.clear()
    monkeypatch.setattr(store, "outgrows_page_cache", lambda nbytes: False)
    assert _same(_pairs(tfshards.read(small, batch_size=4, seed=0, cache=cache)), streamed)
    assert asked == [], "an entry that stays in the page cache is not asked for"


def test_an_augment_function_with_python_control_flow_is_converted_by_autograph(small):
    def flip_sometimes(image, mask):
        if tf.random.uniform(()) > 0.5:  # a tensor in a Python `if`: AutoGraph's job
            image, mask = tf.image.flip_left_right(image), tf.image.flip_left_right(mask)
        return image, mask

    dataset = tfshards.read(small, batch_size=4, seed=0, augment=flip_sometimes)
    assert pairs_in(dataset) == 10


def _pairs(dataset) -> list[tuple]:
    return [(image.numpy(), mask.numpy()) for image, mask in dataset]


def _same(left: list[tuple], right: list[tuple]) -> bool:
    return len(left) == len(right) and all(
        (a == c).all() and (b == d).all() for (a, b), (c, d) in zip(left, right, strict=True)
    )


def _publisher_fsync(monkeypatch, publishing_fsync) -> None:
    """os.fsync calls from the cache's publishing thread go to ``publishing_fsync``."""
    from tfshards.readers.cache import store

    real = os.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread().name == "tfshards-cache-publish":
            publishing_fsync(fd)
        real(fd)

    monkeypatch.setattr(store.os, "fsync", fsync)


def test_the_epoch_that_builds_the_cache_does_not_wait_for_the_disk(small, tmp_path, monkeypatch):
    entered, released = threading.Event(), threading.Event()

    def slow_disk(fd: int) -> None:
        entered.set()
        released.wait(60)

    _publisher_fsync(monkeypatch, slow_disk)
    cache = tmp_path / "cache"
    stream = tfshards.read(small, batch_size=4, seed=0)
    streamed = [_pairs(stream), _pairs(stream)]  # epochs 0 and 1
    dataset = tfshards.read(small, batch_size=4, seed=0, cache=cache)
    built = _pairs(dataset)  # returns while the fsync before publishing still waits
    assert entered.wait(30) and not released.is_set()
    assert not list(cache.rglob("ready")), "published before it was on disk"
    read_again = _pairs(dataset)  # the second epoch, from the building files
    assert not list(cache.rglob("ready"))
    released.set()
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]  # waits for it
    from_disk = _pairs(tfshards.read(small, batch_size=4, seed=0, cache=cache))
    assert _same(streamed[0], built) and _same(streamed[1], read_again)
    assert _same(streamed[0], from_disk)


def test_a_build_whose_fsync_fails_is_not_published_and_is_read_on(
    small, tmp_path, monkeypatch, caplog
):
    import errno

    def failing_disk(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    _publisher_fsync(monkeypatch, failing_disk)
    cache = tmp_path / "cache"
    stream = tfshards.read(small, batch_size=4, seed=0)
    streamed = [_pairs(stream), _pairs(stream)]  # epochs 0 and 1
    dataset = tfshards.read(small, batch_size=4, seed=0, cache=cache)
    with caplog.at_level("WARNING", logger="tfshards"):
        built = _pairs(dataset)
        assert [e.state for e in tfshards.list_caches(cache)] == ["incomplete"]
    assert "not published: writing it to disk failed (Input/output error)" in caplog.text
    assert not list(cache.rglob(".building-*")), "the unpublished build is removed"
    assert _same(streamed[0], built) and _same(streamed[1], _pairs(dataset))
    del dataset
    gc.collect()
    assert open_files_under(cache) == []
    monkeypatch.undo()  # the disk works again: the next read builds and publishes it
    assert _same(streamed[0], _pairs(tfshards.read(small, batch_size=4, seed=0, cache=cache)))
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]


def test_a_program_that_ends_after_the_build_waits_for_it_to_be_published(small, tmp_path):
    import subprocess
    import sys

    cache = tmp_path / "cache"
    script = f"""
import os, threading, time
import tfshards
real = os.fsync
def slow_disk(fd):
    if threading.current_thread().name == "tfshards-cache-publish":
        time.sleep(2)
    real(fd)
os.fsync = slow_disk
dataset = tfshards.read({str(small)!r}, batch_size=4, seed=0, cache={str(cache)!r})
for _ in dataset:
    pass
print("epoch done", flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "epoch done" in done.stdout
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]
