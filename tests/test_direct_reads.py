"""Reads past the page cache (direct_reads.py): the same bytes as buffered reads, from any
offset and length, the end of a file, records checked as before, and reads in flight."""

from __future__ import annotations

import gc
import itertools
import os
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
from conftest import mixed_sizes, write_pairs

import tfshards
from tfshards import direct_reads
from tfshards.direct_reads import ALIGNMENT, in_flight, open_unbuffered, read_into, read_span
from tfshards.schemas.offsets import read_record, read_record_into, scan_offsets
from tfshards.schemas.tfrecord import RecordError

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this system")


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, bytes]:
    payload = np.random.default_rng(0).integers(0, 256, 5 * ALIGNMENT + 123, np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(payload)
    return path, payload


@pytest.fixture
def unbuffered_fd(data_file):
    fd = open_unbuffered(data_file[0])
    assert fd is not None, (
        "tmp_path's file system refuses O_DIRECT: these tests need one that takes it"
    )
    assert direct_reads.unbuffered(fd)
    yield fd
    os.close(fd)


@pytest.mark.parametrize(
    ("start", "length"),
    [
        (0, 10),
        (1, ALIGNMENT),
        (ALIGNMENT - 3, 7),
        (100, 3 * ALIGNMENT + 5),
        (0, 5 * ALIGNMENT + 123),
    ],
)
def test_a_span_anywhere_is_the_files_bytes(data_file, unbuffered_fd, start, length) -> None:
    _, payload = data_file
    assert bytes(read_span(unbuffered_fd, start, length)) == payload[start : start + length]


def test_a_span_past_the_end_is_cut_where_the_file_ends(data_file, unbuffered_fd) -> None:
    _, payload = data_file
    end = len(payload)
    assert bytes(read_span(unbuffered_fd, end - 50, 500)) == payload[-50:]
    assert bytes(read_span(unbuffered_fd, end + 10, 5)) == b""
    assert bytes(read_span(unbuffered_fd, end, 0)) == b""


def test_a_span_longer_than_the_kept_buffer_is_read_whole(data_file, unbuffered_fd, monkeypatch):
    _, payload = data_file
    monkeypatch.setattr(direct_reads, "KEPT_BUFFER_BYTES", ALIGNMENT)
    assert bytes(read_span(unbuffered_fd, 5, 3 * ALIGNMENT)) == payload[5 : 5 + 3 * ALIGNMENT]


@pytest.mark.parametrize("aligned", [True, False])
def test_read_into_an_aligned_or_unaligned_array(data_file, unbuffered_fd, aligned) -> None:
    _, payload = data_file
    memory = np.empty(3 * ALIGNMENT + ALIGNMENT, np.uint8)
    skip = -memory.ctypes.data % ALIGNMENT + (0 if aligned else 8)
    out = memory[skip : skip + 2 * ALIGNMENT]
    assert read_into(unbuffered_fd, out, ALIGNMENT) == 2 * ALIGNMENT
    assert out.tobytes() == payload[ALIGNMENT : 3 * ALIGNMENT]
    tail = np.zeros(2 * ALIGNMENT, np.uint8)  # aligned, but the file ends inside it
    got = read_into(unbuffered_fd, tail, 4 * ALIGNMENT)
    assert got == ALIGNMENT + 123
    assert tail[:got].tobytes() == payload[4 * ALIGNMENT :]


def test_a_buffered_descriptor_reads_the_same(data_file) -> None:
    path, payload = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        assert not direct_reads.unbuffered(fd)
        assert bytes(read_span(fd, 100, 3 * ALIGNMENT)) == payload[100 : 100 + 3 * ALIGNMENT]
        out = np.empty(1000, np.uint8)
        assert read_into(fd, out, 7) == 1000 and out.tobytes() == payload[7:1007]
    finally:
        os.close(fd)


def test_a_file_system_that_refuses_direct_reads_gets_buffered_ones(
    data_file, unbuffered_fd, monkeypatch
) -> None:
    _, payload = data_file
    calls = []
    real = os.preadv

    def refusing_once(fd, buffers, offset):
        if not calls:
            calls.append(offset)
            raise OSError(22, "Invalid argument")  # EINVAL, as some FUSE file systems do
        return real(fd, buffers, offset)

    monkeypatch.setattr(direct_reads.os, "preadv", refusing_once)
    assert bytes(read_span(unbuffered_fd, 10, 100)) == payload[10:110]
    assert not direct_reads.unbuffered(unbuffered_fd), "switched back to the page cache"


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    import tensorflow as tf

    path = tmp_path / "records.tfrecord"
    rng = np.random.default_rng(1)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for size in (5, 4096, 70_000, 4084, 1):
            writer.write(rng.integers(0, 256, size, np.uint8).tobytes())
    return path


def _records(shard: Path, fd: int) -> list[bytes]:
    offsets = scan_offsets(shard)
    spans = zip(offsets.starts, offsets.lengths, strict=True)
    return [read_record(fd, start, n, f"record {k}") for k, (start, n) in enumerate(spans)]


def test_records_read_direct_are_the_records(shard: Path) -> None:
    buffered, direct = os.open(shard, os.O_RDONLY), open_unbuffered(shard)
    try:
        assert _records(shard, direct) == _records(shard, buffered)
        offsets = scan_offsets(shard)
        start, length = int(offsets.starts[2]), int(offsets.lengths[2])
        parts = [np.empty(30_000, np.uint8), np.empty(40_000, np.uint8)]
        read_record_into(direct, start, length, "record 2", parts)
        assert b"".join(part.tobytes() for part in parts) == _records(shard, buffered)[2]
    finally:
        os.close(buffered)
        os.close(direct)


def test_a_flipped_byte_or_a_cut_record_read_direct_is_an_error(shard: Path) -> None:
    offsets = scan_offsets(shard)
    start, length = int(offsets.starts[2]), int(offsets.lengths[2])
    data = bytearray(shard.read_bytes())
    data[start + 12 + 5000] ^= 0x40
    shard.write_bytes(bytes(data))
    fd = open_unbuffered(shard)
    try:
        with pytest.raises(RecordError, match="record 2: data CRC mismatch"):
            read_record(fd, start, length, "record 2")
        with pytest.raises(RecordError, match="record 2: data CRC mismatch"):
            read_record_into(fd, start, length, "record 2", [np.empty(70_000, np.uint8)])
    finally:
        os.close(fd)
    os.truncate(shard, start + 1000)
    fd = open_unbuffered(shard)
    try:
        with pytest.raises(RecordError, match=r"record 2: truncated \(1000 of"):
            read_record(fd, start, length, "record 2")
        with pytest.raises(RecordError, match=r"record 2: truncated \(1000 of"):
            read_record_into(fd, start, length, "record 2", [np.empty(70_000, np.uint8)])
    finally:
        os.close(fd)


def test_pieces_in_flight_run_at_once_and_raise_the_first_error() -> None:
    met = threading.Barrier(direct_reads.READS_IN_FLIGHT, timeout=10)
    done = []

    def read(piece: int) -> None:
        met.wait()  # every piece must be running at once to pass
        done.append(piece)

    in_flight(read, list(range(direct_reads.READS_IN_FLIGHT)))
    assert sorted(done) == list(range(direct_reads.READS_IN_FLIGHT))

    def failing(piece: int) -> None:
        if piece:
            raise ValueError(f"piece {piece}")

    with pytest.raises(ValueError, match="piece 1"):
        in_flight(failing, [0, 1, 2])


def test_a_caller_reads_its_own_pieces_while_the_pool_is_busy() -> None:
    """tf.data runs several fetch calls at once: one that finds every worker taken reads
    its batch itself instead of queueing behind the others' reads."""
    release = threading.Event()
    busy = threading.Thread(target=in_flight, args=(lambda _: release.wait(10), range(64)))
    busy.start()  # holds every free worker, and its own thread
    try:
        done = []
        other = threading.Thread(target=in_flight, args=(done.append, [0, 1, 2, 3]))
        other.start()
        other.join(5)
        assert not other.is_alive() and sorted(done) == [0, 1, 2, 3]
    finally:
        release.set()
        busy.join(10)


def test_without_a_thread_to_start_the_caller_reads_every_piece(monkeypatch) -> None:
    """A process at its thread limit (or Python 3.12+ exiting) cannot start the pool's
    workers: the caller reads every piece itself, and a later call starts them."""
    pool = direct_reads._ReadPool(2)
    monkeypatch.setattr(direct_reads, "_pool", pool)

    def refused(self) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", refused)
        readers = []
        in_flight(lambda _: readers.append(threading.current_thread().name), range(6))
    assert readers == [threading.current_thread().name] * 6
    met = threading.Barrier(3, timeout=10)
    in_flight(lambda _: met.wait(), range(3))  # passes only with both workers reading


def test_without_a_thread_to_start_no_call_waits_for_one(monkeypatch) -> None:
    """Calls queued for workers that could not start waited for them with their batches'
    arrays: at a thread limit, every batch's memory for as long as the process ran."""
    monkeypatch.setattr(direct_reads, "_pool", direct_reads._ReadPool(2))

    def refused(self) -> None:
        raise RuntimeError("can't start new thread")

    class Batch:  # a piece that can be watched being freed
        pass

    monkeypatch.setattr(threading.Thread, "start", refused)
    pieces = [Batch() for _ in range(4)]
    freed = [weakref.ref(piece) for piece in pieces]
    in_flight(lambda _: None, pieces)
    del pieces
    gc.collect()
    assert not any(ref() for ref in freed), "a queued call keeps the pieces it was for"


def test_in_flight_from_a_pool_thread_reads_its_pieces_itself() -> None:
    done = []

    def outer(piece: int) -> None:
        in_flight(lambda inner: done.append((piece, inner)), [0, 1, 2])

    caller = threading.Thread(target=in_flight, args=(outer, list(range(8))))
    caller.start()
    caller.join(10)
    assert not caller.is_alive(), "a nested call waited for the pool it runs on"
    assert sorted(done) == [(p, i) for p in range(8) for i in range(3)]


def test_an_idle_worker_keeps_nothing_of_the_pieces_it_read(monkeypatch) -> None:
    """A worker waiting for the next call kept the last one, and with it that batch's
    arrays and its reader (open descriptors) until the next read, if ever."""
    monkeypatch.setattr(direct_reads, "_pool", direct_reads._ReadPool(1))

    class Batch:  # a piece that can be watched being freed
        pass

    met = threading.Barrier(2, timeout=10)  # the worker reads one of the two pieces
    pieces = [Batch(), Batch()]
    freed = [weakref.ref(piece) for piece in pieces]
    in_flight(lambda _: met.wait(), pieces)
    del pieces
    for _ in range(500):  # the worker may still be leaving the call: wait up to 5 s
        gc.collect()
        if not any(ref() for ref in freed):
            break
        time.sleep(0.01)
    assert not any(ref() for ref in freed), "an idle worker keeps the pieces it read"


def test_a_collection_during_a_read_in_flight_may_wait_for_other_reads_in_flight() -> None:
    """A garbage collection runs in whichever thread allocates, and may free a tf.data
    iterator whose destructor waits for that iterator's calls in flight: those calls must
    not wait for anything the collecting thread holds. concurrent.futures' submit held
    two locks while it allocated, and a read, a fork (which takes one of them) and an
    exit hung. Every collection here waits for another in_flight call, as a destructor
    would."""
    hung: list[str] = []
    collections = itertools.count()

    def wait_for_another_call(phase: str, info: dict) -> None:
        if phase != "start" or next(collections) >= 40:
            return
        other = threading.Thread(target=in_flight, args=(lambda _: None, range(4)), daemon=True)
        other.start()
        other.join(5)
        if other.is_alive():
            hung.append(threading.current_thread().name)

    kept: list[list[int]] = []  # freed objects would lower the count that starts a collection
    threshold = gc.get_threshold()
    gc.callbacks.append(wait_for_another_call)
    gc.set_threshold(1)  # a collection at nearly every allocation
    try:
        in_flight(lambda piece: kept.extend([piece] for _ in range(500)), range(16))
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(wait_for_another_call)
    assert not hung, f"a call in flight waited for a collecting thread: {hung}"
    assert next(collections) >= 40, "too few collections to show anything"


def test_a_forked_child_reads_in_flight_with_its_own_pool() -> None:
    in_flight(lambda piece: None, [0, 1])  # the parent's pool exists
    pid = os.fork()
    if pid == 0:
        try:
            out = []
            in_flight(out.append, [0, 1, 2])
            os._exit(0 if sorted(out) == [0, 1, 2] else 1)
        finally:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0


@pytest.fixture
def read_past_the_page_cache(monkeypatch):
    """Every split and disk cache taken as larger than the page cache, and worth reading
    direct whatever its records' size."""
    from tfshards.readers.cache import store
    from tfshards.sources import records

    def install() -> None:
        monkeypatch.setattr(records, "outgrows_page_cache", lambda nbytes: True)
        monkeypatch.setattr(store, "outgrows_page_cache", lambda nbytes: True)
        monkeypatch.setattr(direct_reads, "MIN_DIRECT_PIECE_BYTES", 0)

    return install


@pytest.fixture(scope="module", params=["raw", "deflate", "png"])
def rgb(tmp_path_factory, request) -> Path:
    """Raw records are read into their rows, deflate ones inflated, PNG ones decoded by
    TensorFlow: three ways records leave a direct read."""
    root = tmp_path_factory.mktemp("direct")
    images, masks = write_pairs(root / "data", 24, size=(40, 36), classes=3)
    out = root / "shards"
    options = dict(num_shards=3, workers=1, progress=False, encoding=request.param)
    tfshards.convert(images, masks, out, **options)
    return out


def _batches(dataset) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(image.numpy(), mask.numpy()) for image, mask in dataset]


def _same(left, right) -> bool:
    return len(left) == len(right) and all(
        np.array_equal(a, c) and np.array_equal(b, d)
        for (a, b), (c, d) in zip(left, right, strict=True)
    )


@pytest.mark.parametrize("image_dtype", ["uint8", "float32"])
def test_a_read_past_the_page_cache_delivers_the_same_batches(
    rgb, tmp_path, read_past_the_page_cache, image_dtype
) -> None:
    options = dict(batch_size=5, seed=3, image_dtype=image_dtype)
    streamed = _batches(tfshards.read(rgb, **options))
    read_past_the_page_cache()
    dataset = tfshards.read(rgb, **options)
    assert _same(_batches(dataset), streamed)
    opened = dataset._tfshards_reader.records._files.values()
    assert opened and all(direct_reads.unbuffered(fd) for fd in opened)
    cache = tmp_path / "cache"
    building = tfshards.read(rgb, **options, cache=cache)
    assert _same(_batches(building), streamed)
    opened = building._tfshards_reader.records._files.values()
    assert opened and not any(map(direct_reads.unbuffered, opened)), "built from the page cache"
    warm = tfshards.read(rgb, **options, cache=cache)
    assert _same(_batches(warm), streamed)  # reads the ready entry, direct
    assert all(direct_reads.unbuffered(fd) for fd in warm._tfshards_reader.store._published)


def test_a_changed_byte_read_past_the_page_cache_stops_the_read(
    rgb, tmp_path, read_past_the_page_cache
) -> None:
    import shutil

    import tensorflow as tf

    shards = tmp_path / "shards"
    shutil.copytree(rgb, shards)
    options = dict(batch_size=4, seed=0, image_dtype="uint8", cache=tmp_path / "cache")
    read_past_the_page_cache()
    expected = _batches(tfshards.read(shards, **options))  # builds the entry
    (entry,) = tfshards.list_caches(tmp_path / "cache")
    pixels = entry.path / "ready" / "pairs.image"
    data = bytearray(pixels.read_bytes())
    data[7 * 40 * 36 * 3 + 100] ^= 0x10  # pair 7's image
    pixels.write_bytes(bytes(data))
    with pytest.raises(tf.errors.OpError, match="pair 7 does not match its checksum"):
        _batches(tfshards.read(shards, **options))
    assert _same(_batches(tfshards.read(shards, **options)), expected)  # built again
    first = sorted(shards.glob("train-*.tfrecord"))[0]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))
    with pytest.raises(tf.errors.OpError, match="CRC mismatch"):
        _batches(tfshards.read(shards, batch_size=4, seed=0))


@pytest.mark.parametrize("compression", ["none", "gzip"])  # joined, or read apart
def test_a_mix_building_its_caches_reads_every_dataset_through_the_page_cache(
    rgb, tmp_path, read_past_the_page_cache, compression
) -> None:
    images, masks = write_pairs(tmp_path / "data", 12, size=(40, 36), classes=3, seed=1)
    other = tmp_path / "other"
    from tfshards.schemas import Manifest

    encoding = Manifest.load(rgb).image.encoding  # a mix is of one encoding
    options = dict(num_shards=2, workers=1, progress=False, encoding=encoding)
    tfshards.convert(images, masks, other, compression=compression, **options)
    read_past_the_page_cache()
    sources = {"a": rgb, "b": other}
    options = dict(weights={"a": 1, "b": 1}, batch_size=4, seed=0, image_dtype="uint8")
    streamed = tfshards.read(sources, **options)
    expected = _batches(streamed)
    assert all(_reads_direct(streamed)), "a mix streams past the page cache"
    building = tfshards.read(sources, **options, cache=tmp_path / "cache")
    assert _same(_batches(building), expected)
    assert not any(_reads_direct(building))


def _reads_direct(dataset) -> list[bool]:
    """Each dataset's: local ones are joined into one SplitRecords, others kept apart."""
    records = dataset._tfshards_reader.records
    return [part.reads_direct for part in getattr(records, "parts", [records])]


def test_read_options_choose_direct_reads_or_not(rgb, tmp_path, read_past_the_page_cache):
    expected = _batches(tfshards.read(rgb, batch_size=5, seed=3))
    chosen = tfshards.read(
        rgb, batch_size=5, seed=3, options=tfshards.ReadOptions(direct_reads=True)
    )
    assert _same(_batches(chosen), expected)
    assert all(_reads_direct(chosen)), "True: direct whatever the split's size"
    read_past_the_page_cache()  # the split now counts as too large for the page cache
    never = tfshards.ReadOptions(direct_reads=False)
    for cache in (None, tmp_path / "cache", tmp_path / "cache"):  # stream, build, read
        dataset = tfshards.read(rgb, batch_size=5, seed=3, cache=cache, options=never)
        assert _same(_batches(dataset), expected)
        opened = dataset._tfshards_reader.records._files.values()
        assert not any(map(direct_reads.unbuffered, opened))
        store = dataset._tfshards_reader.store
        assert store is None or not any(map(direct_reads.unbuffered, store._published))
    with pytest.raises(tfshards.OptionsError, match="direct_reads"):
        tfshards.ReadOptions(direct_reads="yes")


def test_pairs_read_direct_give_the_same_pairs_here_and_in_a_forked_worker(rgb) -> None:
    """tfshards.Pairs under a DataLoader's forked workers: each reads its own descriptors
    and its own pool."""
    buffered = tfshards.Pairs(rgb, options=tfshards.ReadOptions(direct_reads=False))
    direct = tfshards.Pairs(rgb, options=tfshards.ReadOptions(direct_reads=True))
    order = list(np.random.default_rng(2).permutation(len(buffered)))

    def same(left, right) -> bool:
        return all(
            np.array_equal(a, c) and np.array_equal(b, d)
            for (a, b), (c, d) in zip(left, right, strict=True)
        )

    expected = buffered.__getitems__(order)
    assert same(direct.__getitems__(order), expected)
    assert same([direct[i] for i in order[:3]], expected[:3])
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if same(direct.__getitems__(order[::-1]), expected[::-1]) else 1)
        finally:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0
    assert all(map(direct_reads.unbuffered, direct.records._files.values()))


def test_a_forked_child_reads_into_a_buffer_of_its_own(data_file, unbuffered_fd) -> None:
    """A DataLoader's forked workers inherit the thread's kept buffer: a shared mapping
    would let a child's read overwrite the bytes its parent is about to copy out."""
    _, payload = data_file
    assert bytes(read_span(unbuffered_fd, 0, 10)) == payload[:10]  # the buffer exists
    ready = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            read_span(unbuffered_fd, ALIGNMENT, 10)  # the child's read, at the parent's spot
            os.write(ready[1], b"x")
            os._exit(0)
        finally:
            os._exit(2)
    os.close(ready[1])
    span = read_span(unbuffered_fd, 0, 10)
    os.read(ready[0], 1)  # the child has read (or ended)
    os.close(ready[0])
    assert os.waitpid(pid, 0)[1] == 0
    assert bytes(span) == payload[:10]


def test_ctrl_c_in_flight_stops_the_reads_and_is_raised_first() -> None:
    """Ctrl-C (KeyboardInterrupt) during a batch read in flight: the other pieces are
    not read, and no other piece's error takes its place."""
    interrupted, done = threading.Event(), []

    def read(piece: int) -> None:
        if piece == 0:
            interrupted.set()
            raise KeyboardInterrupt
        interrupted.wait(10)
        done.append(piece)

    with pytest.raises(KeyboardInterrupt):
        in_flight(read, list(range(200)))
    assert len(done) < 100

    def failing(piece: int) -> None:
        if piece == 1:
            raise ValueError("a record's error")
        if piece == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        in_flight(failing, [0, 1, 2, 3])


def test_ctrl_c_between_the_callers_pieces_stops_the_workers_too(monkeypatch) -> None:
    """A Ctrl-C lands between any two bytecodes: one raised in the caller outside a read
    (here, while it counts a piece) left the workers reading the rest of the batch after
    in_flight had raised."""
    monkeypatch.setattr(direct_reads, "_pool", direct_reads._ReadPool(1))
    caller, interrupted, done = threading.current_thread(), threading.Event(), []
    by_caller: list[int] = []

    class Pieces(list):
        def __len__(self) -> int:
            if by_caller and not interrupted.is_set():  # the caller's piece is being counted
                interrupted.set()
                raise KeyboardInterrupt
            return super().__len__()

    def read(piece: int) -> None:
        if threading.current_thread() is caller:
            by_caller.append(piece)
        else:
            interrupted.wait(10)
        done.append(piece)

    with pytest.raises(KeyboardInterrupt):
        in_flight(read, Pieces(range(50)))
    idle = threading.Event()
    direct_reads._pool.submit(idle.set)  # runs once the worker has left in_flight's call
    assert idle.wait(10)
    assert len(done) <= 2, f"{len(done)} pieces read, after the interruption"


def test_a_truncated_disk_cache_read_direct_is_a_tfshards_error_naming_its_file(
    rgb, tmp_path, read_past_the_page_cache
) -> None:
    import re

    import tensorflow as tf

    options = dict(batch_size=4, seed=0, image_dtype="uint8", cache=tmp_path / "cache")
    options["options"] = tfshards.ReadOptions(direct_reads=True)
    _batches(tfshards.read(rgb, **options))  # builds the entry
    (entry,) = tfshards.list_caches(tmp_path / "cache")
    pixels = entry.path / "ready" / "pairs.image"
    dataset = tfshards.read(rgb, **options)
    assert all(map(direct_reads.unbuffered, dataset._tfshards_reader.store._published))
    os.truncate(pixels, pixels.stat().st_size // 2)  # while it is being read
    with pytest.raises(tf.errors.OpError) as caught:
        _batches(dataset)
    named = f"CacheDamagedError: disk cache file {re.escape(str(pixels))} ended at byte"
    assert re.search(named, caught.value.message)


def test_a_truncated_native_size_disk_cache_is_a_tfshards_error_naming_its_file(tmp_path):
    """The store of pairs at their own sizes (native.py) reads its rows the same way, and
    names the whole path of a file cut short too (it named only ``pairs.image``)."""
    import re

    import tensorflow as tf

    shards = mixed_sizes(tmp_path / "mixed")
    options = dict(batch_size=1, seed=0, cache=tmp_path / "cache")
    _batches(tfshards.read(shards, **options))  # builds the entry
    (entry,) = tfshards.list_caches(tmp_path / "cache")
    pixels = entry.path / "ready" / "pairs.image"
    dataset = tfshards.read(shards, **options)
    os.truncate(pixels, pixels.stat().st_size // 2)
    with pytest.raises(tf.errors.OpError) as caught:
        _batches(dataset)
    named = f"CacheDamagedError: disk cache file {re.escape(str(pixels))} ended at byte"
    assert re.search(named, caught.value.message)
