"""Reading a dataset from a bucket through the local shard cache, against a real S3 API
(moto's server on 127.0.0.1), never a mocked client."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from s3_server import (
    FAKE_SECRET,
    s3_environment,
    s3_objects,
    start_moto,
    upload_folder,
)

import tfshards
from tfshards import ReadOptions, convert, storage
from tfshards.readers.order import group_shards
from tfshards.readers.shard_cache import ShardCheckError

pytestmark = pytest.mark.timeout(300)
SHARDS = 16


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("remote")
    tfshards.synth(root / "data", count=64, size=24, classes=3, seed=5)
    convert(
        root / "data" / "images",
        root / "data" / "masks",
        root / "shards",
        num_shards=SHARDS,
        encoding="raw",
        progress=False,
    )
    return root / "shards"


@pytest.fixture
def logged_server(tmp_path, monkeypatch):
    """A moto server of this test's own, its request log in a file (to count GETs)."""
    log = tmp_path / "requests.log"
    server = start_moto(log=log)
    for name, value in s3_environment(server.endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("tfshards-remote")
    yield server, log
    server.stop()


def uploaded(local: Path, url: str) -> str:
    upload_folder(local, url)
    return url


def shard_gets(log: Path) -> dict[str, int]:
    """GET requests per shard file, from the server's request log."""
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        if '"GET ' in line and ".tfrecord" in line:
            name = line.split('"GET ', 1)[1].split()[0].rsplit("/", 1)[-1].split("?")[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


def digests(batches) -> list[str]:
    return [
        hashlib.sha1(image.tobytes() + mask.tobytes()).hexdigest()
        for images, masks in batches
        for image, mask in zip(images.numpy(), masks.numpy(), strict=True)
    ]


def ordered(path, options: ReadOptions | None = None, **kwargs):
    return tfshards.read(
        path, batch_size=5, image_dtype="uint8", shuffle=False, options=options, **kwargs
    )


def test_cold_then_warm_shard_cache_reads_the_local_records(local_dataset, logged_server, tmp_path):
    _, log = logged_server
    url = uploaded(local_dataset, "s3://tfshards-remote/ds")
    options = ReadOptions(shard_cache=tmp_path / "shards")
    expected = digests(ordered(local_dataset))
    assert digests(ordered(url, options)) == expected  # cold: every shard downloaded
    gets = shard_gets(log)
    assert len(gets) == SHARDS and set(gets.values()) == {1}, gets
    assert digests(ordered(url, options)) == expected  # warm: nothing downloaded again
    shuffled = tfshards.read(url, batch_size=5, image_dtype="uint8", seed=3, options=options)
    assert sorted(digests(shuffled)) == sorted(expected)
    assert shard_gets(log) == gets


def test_a_limit_of_a_quarter_streams_every_epoch_within_it(local_dataset, s3_bucket, tmp_path):
    url = uploaded(local_dataset, f"{s3_bucket}/ds")
    total = sum(p.stat().st_size for p in local_dataset.glob("*.tfrecord"))
    limit = total // 4
    folder = tmp_path / "shards"
    options = ReadOptions(shard_cache=folder, shard_cache_limit=limit)
    ds = tfshards.read(url, batch_size=3, image_dtype="uint8", seed=0, options=options)
    expected = sorted(digests(ordered(local_dataset)))
    for _ in range(3):
        seen, peak = [], 0
        for images, masks in ds:
            seen += digests([(images, masks)])
            peak = max(peak, _complete_bytes(folder))
        assert sorted(seen) == expected, "each record once per epoch"
        assert 0 < peak <= limit


def _complete_bytes(folder: Path) -> int:
    """Bytes of the complete shards now; one evicted between listing and stat counts 0."""
    total = 0
    for path in folder.rglob("*.tfrecord"):
        if not path.name.startswith("."):
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
    return total


def test_limit_too_small_for_three_shards_is_refused(local_dataset, s3_bucket, tmp_path):
    url = uploaded(local_dataset, f"{s3_bucket}/ds")
    largest = max(p.stat().st_size for p in local_dataset.glob("*.tfrecord"))
    options = ReadOptions(shard_cache=tmp_path / "c", shard_cache_limit=2 * largest)
    with pytest.raises(tfshards.OptionsError, match="holds 2 of this dataset's shards"):
        tfshards.read(url, options=options)
    with pytest.raises(tfshards.OptionsError, match="not understood"):
        ReadOptions(shard_cache_limit="lots")


def test_two_processes_share_the_cache_and_download_each_shard_once(
    local_dataset, logged_server, tmp_path
):
    server, log = logged_server
    url = uploaded(local_dataset, "s3://tfshards-remote/ds")
    script = textwrap.dedent(f"""
        import tfshards
        options = tfshards.ReadOptions(shard_cache={str(tmp_path / "shards")!r})
        ds = tfshards.read({url!r}, batch_size=4, image_dtype="uint8", seed=1, options=options)
        print(sum(int(images.shape[0]) for images, _ in ds))
    """)
    env = {**os.environ, **s3_environment(server.endpoint)}
    readers = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    counts = [reader.communicate(timeout=240)[0].strip() for reader in readers]
    assert [r.returncode for r in readers] == [0, 0]
    train = tfshards.Manifest.load(local_dataset).splits["train"].records
    assert counts == [str(train)] * 2
    gets = shard_gets(log)
    assert len(gets) == SHARDS and set(gets.values()) == {1}, gets


def test_a_manifest_without_crc32c_is_read_with_downloads_checked_by_sha256(
    local_dataset, s3_bucket, tmp_path
):
    url = uploaded(local_dataset, f"{s3_bucket}/ds")
    body = json.loads((local_dataset / "tfshards.json").read_text())
    for shard in body["splits"]["train"]["shards"]:
        del shard["crc32c"]
    storage.write_bytes(f"{url}/tfshards.json", json.dumps(body).encode())
    options = ReadOptions(shard_cache=tmp_path / "shards")
    assert digests(ordered(url, options)) == digests(ordered(local_dataset, options))


@pytest.mark.parametrize("checked_by", ["crc32c", "sha256"])
def test_a_flipped_byte_is_named_and_never_read(
    local_dataset, s3_bucket, tmp_path, caplog, checked_by
):
    url = uploaded(local_dataset, f"{s3_bucket}/ds")
    if checked_by == "sha256":  # a manifest written before tfshards recorded CRC-32Cs
        body = json.loads((local_dataset / "tfshards.json").read_text())
        for shard in body["splits"]["train"]["shards"]:
            del shard["crc32c"]
        storage.write_bytes(f"{url}/tfshards.json", json.dumps(body).encode())
    victim = sorted(p.name for p in local_dataset.glob("train-*.tfrecord"))[0]
    data = bytearray(s3_objects(url)[victim])
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(f"{url}/{victim}", bytes(data))
    folder = tmp_path / "shards"
    options = ReadOptions(shard_cache=folder)  # the secret comes from the environment
    with caplog.at_level(logging.DEBUG, logger="tfshards"), pytest.raises(Exception) as raised:
        digests(ordered(url, options))
    assert f"{url}/{victim}" in str(raised.value) and checked_by in str(raised.value)
    assert not list(folder.rglob(victim)), "the corrupt shard never reaches the cache"
    assert "attempt 1 of 2" in caplog.text  # downloaded once more before failing
    assert FAKE_SECRET not in str(raised.value) + caplog.text


def test_shard_check_error_is_raised_by_the_cache_itself(local_dataset, s3_bucket, tmp_path):
    from tfshards.readers.shard_cache import ShardCache

    url = uploaded(local_dataset, f"{s3_bucket}/ds")
    (tmp_path / "c").mkdir()
    abandoned = tmp_path / "c" / ".download-999999999-train-00000-of-00016.tfrecord"
    abandoned.write_bytes(b"partial")
    shard = tfshards.Manifest.load(local_dataset).splits["train"].shards[0]
    storage.write_bytes(f"{url}/{shard.file}", b"truncated")
    cache = ShardCache(tmp_path / "c", url)
    assert not abandoned.exists(), "a dead process's partial download is removed"
    with pytest.raises(ShardCheckError, match=r"downloaded 9 bytes but the manifest says"):
        cache.fetch(shard)
    assert cache.downloads == 2


def test_waiting_for_a_download_never_waits_for_a_reader_of_the_shard(
    local_dataset, tmp_path, monkeypatch
):
    """Two threads find a shard missing at once: one fetches it (and keeps it open, as a
    reader does), the other makes it present for a later read. The second must return
    while the first still holds the shard; it once waited for that reader to let go,
    and the reader, which needed it, hung (a hang seen in CI)."""
    from tfshards.sources import shard_cache as module

    shard = tfshards.Manifest.load(local_dataset).splits["train"].shards[0]
    cache = module.ShardCache(tmp_path / "c", os.fspath(local_dataset))
    both_looked = threading.Barrier(2, timeout=20)
    looked: set[str] = set()
    complete = module._complete

    def looks_together(path: Path, info) -> bool:
        found = complete(path, info)
        name = threading.current_thread().name
        if name not in looked:  # each thread's first look: both see it missing
            looked.add(name)
            both_looked.wait()
            if name == "fetch":
                # ensure() asks for the shard first, so fetch() gets it and downloads
                time.sleep(0.3)
        return found

    monkeypatch.setattr(module, "_complete", looks_together)
    fetched: list[str] = []
    threads = [
        threading.Thread(target=lambda: fetched.append(cache.fetch(shard)), name="fetch"),
        threading.Thread(target=cache.ensure, args=(shard,), name="ensure", daemon=True),
    ]
    for thread in threads:
        thread.start()
    threads[0].join(20)
    threads[1].join(20)
    assert fetched and not threads[1].is_alive(), "ensure() waited for the shard's reader"
    assert cache.downloads == 1, "one download for both"
    assert Path(fetched[0]).read_bytes() == (local_dataset / shard.file).read_bytes()
    cache.release(shard)


def test_readers_of_a_process_share_one_download_helper_that_exits_with_it(
    local_dataset, s3_bucket, tmp_path
):
    url = uploaded(local_dataset, f"{s3_bucket}/ds")
    script = textwrap.dedent(f"""
        from pathlib import Path
        import tfshards

        def helpers():
            return [pid for task in Path("/proc/self/task").iterdir()
                    for pid in (task / "children").read_text().split()
                    if b"tfshards.download_process" in Path(f"/proc/{{pid}}/cmdline").read_bytes()]

        for cache in ("a", "b"):  # two readers, two shard caches: every shard downloaded twice
            options = tfshards.ReadOptions(shard_cache={str(tmp_path)!r} + "/" + cache)
            ds = tfshards.read({url!r}, batch_size=8, image_dtype="uint8", options=options)
            print(sum(int(images.shape[0]) for images, _ in ds), *helpers(), flush=True)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=True
    )
    first, second = (line.split() for line in done.stdout.strip().splitlines())
    assert len(first) == 2 and first == second, "one helper, the same for both readers"
    helper = int(first[1])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{helper}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    gone = not Path(f"/proc/{helper}").exists() or "Z" in _state(helper)
    assert gone, "the helper exits with its process"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


class Proxy:
    """A TCP relay on 127.0.0.1 in front of the S3 server, stopped and started by a test:
    to the client, the server goes away (refused, reset) and comes back."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = _free_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            _close(self._listener)  # shutdown() wakes the thread blocked in accept()
            self._listener = None
        for sock in self._open:
            _close(sock)
        self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def proxied_bucket(s3_bucket, s3_server, monkeypatch):
    port = int(s3_server.endpoint.rsplit(":", 1)[1])
    proxy = Proxy(port)
    proxy.start()
    yield s3_bucket, proxy
    proxy.stop()


def _through(proxy: Proxy) -> ReadOptions:
    return {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}


def test_server_down_mid_epoch_then_back_finishes_the_epoch(
    local_dataset, proxied_bucket, tmp_path
):
    bucket, proxy = proxied_bucket
    url = uploaded(local_dataset, f"{bucket}/ds")
    options = ReadOptions(
        shard_cache=tmp_path / "shards", storage_options=_through(proxy), download_ahead=1
    )
    batches = iter(ordered(url, options))
    seen = digests([next(batches)])
    proxy.stop()  # the next shards cannot be downloaded now
    train = tfshards.Manifest.load(local_dataset).splits["train"].shards
    assert len(list((tmp_path / "shards").rglob("*.tfrecord"))) < len(train)
    threading.Timer(3.0, proxy.start).start()
    seen += digests(batches)
    assert seen == digests(ordered(local_dataset))


def test_server_gone_for_good_is_a_clear_error_in_bounded_time(
    local_dataset, proxied_bucket, tmp_path, monkeypatch
):
    bucket, proxy = proxied_bucket
    url = uploaded(local_dataset, f"{bucket}/ds")
    options = ReadOptions(shard_cache=tmp_path / "shards", storage_options=_through(proxy))
    ds = ordered(url, options)  # the manifest is read while the server is up
    proxy.stop()
    monkeypatch.setattr(storage, "RETRY_SECONDS", 4.0)
    started = time.monotonic()
    with pytest.raises(Exception, match=r"s3://.*train-\d{5}-of-\d{5}\.tfrecord.*cannot download"):
        digests(ds)
    assert time.monotonic() - started < 60


def test_input_pipelines_of_a_remote_dataset_read_disjoint_equal_parts(
    local_dataset, s3_bucket, tmp_path
):
    """The global order does not depend on the number of pipelines (elastic resume), so
    each pipeline reads its slice of every round from any shard: every host downloads
    the shards it needs, up to all of them."""
    import tensorflow as tf

    url = uploaded(local_dataset, f"{s3_bucket}/ds")
    parts = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline)
        ds = tfshards.read(
            url,
            batch_size=4,
            image_dtype="uint8",
            input_context=context,
            options=ReadOptions(shard_cache=tmp_path / f"shards{pipeline}"),
        )
        parts.append(digests(ds))
    assert len(parts[0]) == len(parts[1]) and not set(parts[0]) & set(parts[1])
    assert set(parts[0]) | set(parts[1]) <= set(digests(ordered(local_dataset)))


def test_decoded_cache_of_a_remote_dataset_lives_under_the_local_cache_root(
    local_dataset, s3_bucket, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    url = uploaded(local_dataset, f"{s3_bucket}/ds")
    expected = digests(ordered(local_dataset))
    assert digests(ordered(url, cache=True)) == expected
    assert digests(ordered(url, cache=True)) == expected  # from the decoded cache
    root = tmp_path / "xdg" / "tfshards"
    assert list((root / "shards").rglob("*.tfrecord"))
    entries = [e for d in (root / "decoded").iterdir() for e in tfshards.list_caches(d)]
    assert [e.state for e in entries] == ["ready"]
    shutil.rmtree(tmp_path / "xdg")


def test_a_dropped_reader_freed_on_fsspecs_loop_thread_does_not_hang(
    local_dataset, proxied_bucket, tmp_path, monkeypatch
):
    """A reader dropped in a reference cycle with downloads in flight, freed by the garbage
    collector on fsspec's event-loop thread: freeing it waits for those downloads, which
    must not need that thread (they hung forever when they ran on it)."""
    import gc

    import fsspec.asyn

    bucket, proxy = proxied_bucket
    url = uploaded(local_dataset, f"{bucket}/ds")
    monkeypatch.setattr(storage, "RETRY_SECONDS", 30.0)
    options = ReadOptions(shard_cache=tmp_path / "shards", storage_options=_through(proxy))
    batches = iter(ordered(url, options))
    next(batches)
    proxy.stop()  # the downloads ahead now retry, in flight
    gc.disable()  # so that only the collection below, on the loop thread, frees it
    cycle = [batches]
    cycle.append(cycle)
    del batches, cycle

    async def collect() -> None:
        gc.collect()

    freed = threading.Thread(
        target=fsspec.asyn.sync, args=(fsspec.asyn.get_loop(), collect), daemon=True
    )
    freed.start()
    threading.Timer(2.0, proxy.start).start()  # the downloads in flight can finish
    freed.join(timeout=90)
    gc.enable()
    assert not freed.is_alive(), "freeing the reader on fsspec's loop thread hung"


def test_a_dataset_at_a_url_mixes_smaller_groups_of_shards():
    """An epoch's first batch waits for its group's shards to download: 64 MiB, not 256."""
    sizes = [17 * 2**20] * 16
    assert group_shards(sizes, None) == 15
    assert group_shards(sizes, None, remote=True) == 3
    assert group_shards(sizes, 6, remote=True) == 6  # cycle_length decides when given
    assert group_shards([300 * 2**20] * 4, None, remote=True) == 1


_PAIR_DIGESTS = textwrap.dedent(
    """
    import hashlib, json, sys
    import tfshards
    pairs = tfshards.Pairs(sys.argv[1], options=tfshards.ReadOptions(shard_cache=sys.argv[2]))
    print(json.dumps([hashlib.sha1(pairs[i][0].tobytes()).hexdigest() for i in range(len(pairs))]))
    """
)


@pytest.mark.parametrize("swap", ["renamed", "rewritten in place"])
def test_two_same_size_copies_swapped_in_the_shard_cache_are_downloaded_again(
    local_dataset, logged_server, tmp_path, swap
):
    from conftest import run_json_script

    _, log = logged_server
    url = uploaded(local_dataset, "s3://tfshards-remote/ds")
    folder = tmp_path / "shards"
    expected = run_json_script(_PAIR_DIGESTS, local_dataset, folder)
    assert run_json_script(_PAIR_DIGESTS, url, folder) == expected  # every shard downloaded
    copies = sorted(folder.glob("*/train-*.tfrecord"))
    a, b = next((x, y) for x in copies for y in copies if x < y and _size(x) == _size(y))
    if swap == "renamed":
        os.replace(a, tmp_path / "a")
        os.replace(b, a)
        os.replace(tmp_path / "a", b)
    else:
        data_a, data_b = a.read_bytes(), b.read_bytes()
        a.write_bytes(data_b)
        b.write_bytes(data_a)
    assert run_json_script(_PAIR_DIGESTS, url, folder) == expected  # a later run
    gets = shard_gets(log)
    assert gets.pop(a.name) == gets.pop(b.name) == 2, "the two swapped copies, downloaded again"
    assert set(gets.values()) == {1}


def _size(path: Path) -> int:
    return path.stat().st_size
