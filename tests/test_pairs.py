"""tfshards.Pairs: every pair by its index as NumPy arrays, the values tfshards.read gives,
without TensorFlow in the process."""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import write_pairs

import tfshards
from tfshards.schemas import Manifest
from tfshards.schemas.record import EncodedPair
from tfshards.schemas.tfrecord import RecordError, frame_record, iter_records, parse_example

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))


def _convert(tmp_path: Path, *, count: int = 10, channels: int = 3, **options) -> Path:
    fmt = "jpeg" if options.get("encoding") == "jpeg" else "png"
    images, masks = write_pairs(tmp_path / "data", count=count, channels=channels, image_format=fmt)
    out = tmp_path / "shards"
    tfshards.convert(images, masks, out, num_shards=3, progress=False, **options)
    return out


def _through_read(out: Path) -> tuple[np.ndarray, np.ndarray]:
    batches = tfshards.read(out, batch_size=1, image_dtype="uint8", shuffle=False, cache=False)
    images, masks = zip(*((i.numpy()[0], m.numpy()[0]) for i, m in batches), strict=True)
    return np.stack(images), np.stack(masks)


@pytest.mark.parametrize(
    ("encoding", "channels", "compression"),
    [
        ("deflate", 3, "none"),
        ("raw", 1, "none"),
        ("png", 4, "none"),
        ("jpeg", 3, "none"),
        ("keep", 3, "none"),
        ("deflate", 3, "gzip"),
        ("raw", 3, "zlib"),
    ],
)
def test_every_pair_equals_what_read_gives(
    tmp_path: Path, encoding: str, channels: int, compression: str
) -> None:
    out = _convert(tmp_path, channels=channels, encoding=encoding, compression=compression)
    pairs = tfshards.Pairs(out, split="train")
    images, masks = _through_read(out)
    if encoding == "jpeg":  # Pillow's decoder is the reference, as read() is being changed to
        images = _jpeg_as_pillow_decodes(out)
    assert len(pairs) == len(images) == 10
    for index in range(len(pairs)):
        image, mask = pairs[index]
        assert image.dtype == np.uint8 and image.shape == images[index].shape
        assert mask.dtype == np.uint8 and mask.shape == masks[index].shape  # [H, W, 1]
        np.testing.assert_array_equal(image, images[index])
        np.testing.assert_array_equal(mask, masks[index])
    assert not any(name.endswith((".npz", ".idx")) for name in os.listdir(out))


def _jpeg_as_pillow_decodes(out: Path) -> np.ndarray:
    """TensorFlow's INTEGER_ACCURATE JPEG decoder: Pillow's (libjpeg's islow) pixels."""
    import tensorflow as tf

    encoded = []
    for shard in Manifest.load(out).splits["train"].shards:
        with open(out / shard.file, "rb") as stream:
            encoded += [parse_example(r)["image/encoded"] for r in iter_records(stream)]
    return np.stack(
        [tf.io.decode_jpeg(e, channels=3, dct_method="INTEGER_ACCURATE").numpy() for e in encoded]
    )


def test_keys_negative_indices_and_batched_reads(tmp_path: Path) -> None:
    out = _convert(tmp_path, encoding="raw")
    pairs = tfshards.Pairs(out, with_keys=True)
    keys = [pairs[i][2] for i in range(len(pairs))]
    assert sorted(keys) == [f"{i:03d}" for i in range(10)]
    assert [pairs.key(i) for i in range(len(pairs))] == keys
    assert pairs[-1][2] == keys[-1] and pairs[np.int64(2)][2] == keys[2]
    batch = pairs.__getitems__([7, 0, 7, 3])
    assert [k for _, _, k in batch] == [keys[7], keys[0], keys[7], keys[3]]
    with pytest.raises(IndexError, match="pair index 10 out of range for 10 pairs"):
        pairs[10]
    with pytest.raises(TypeError, match="integers"):
        pairs["a"]


def test_offsets_are_scanned_once_and_kept_outside_the_dataset(tmp_path: Path) -> None:
    out = _convert(tmp_path, encoding="raw")
    before = sorted(os.listdir(out))
    os.chmod(out, 0o555)  # a read-only dataset (root may still write: the listing checks)
    try:
        pairs = tfshards.Pairs(out)
        assert [pairs[i][0].shape for i in range(len(pairs))] == [(24, 32, 3)] * 10
    finally:
        os.chmod(out, 0o755)
    assert sorted(os.listdir(out)) == before
    kept = sorted((tmp_path / "user-cache" / "tfshards" / "offsets").glob("*.npz"))
    shards = Manifest.load(out).splits["train"].shards
    assert [p.stem for p in kept] == sorted(s.sha256 for s in shards)


def test_index_files_are_used_when_present(tmp_path: Path) -> None:
    out = _convert(tmp_path, encoding="raw", index=True)
    assert len(list(out.glob("*.idx"))) == 3
    images, _ = _through_read(out)
    pairs = tfshards.Pairs(out)
    np.testing.assert_array_equal(pairs[9][0], images[9])
    assert not (tmp_path / "user-cache" / "tfshards" / "offsets").exists()


def test_a_corrupt_record_names_its_shard_and_record(tmp_path: Path) -> None:
    out = _convert(tmp_path, encoding="raw", index=True)
    shard = out / Manifest.load(out).splits["train"].shards[1].file
    starts = [
        int(line.split()[0]) for line in shard.with_suffix(".tfrecord.idx").read_text().splitlines()
    ]
    data = bytearray(shard.read_bytes())
    data[starts[1] + 40] ^= 0x01  # inside record 1's data
    shard.write_bytes(bytes(data))
    pairs = tfshards.Pairs(out)
    first = Manifest.load(out).splits["train"].shards[0].records
    with pytest.raises(RecordError, match=rf"{shard.name}: record 1: data CRC mismatch"):
        pairs[first + 1]
    assert pairs[first][0].shape == (24, 32, 3)  # its neighbours still read


def test_a_record_whose_pixels_do_not_decode_names_shard_record_and_cause(
    tmp_path: Path,
) -> None:
    out = _convert(tmp_path, encoding="raw")
    bad = EncodedPair("bad", b"\0" * 7, "raw", 24, 32, 3, b"\0" * (24 * 32), "raw")
    shard = out / Manifest.load(out).splits["train"].shards[0].file
    shard.write_bytes(frame_record(bad.to_example()))
    _update_manifest(out, shard)
    with pytest.raises(tfshards.PairDecodeError, match=rf"{shard.name}: record 0 .*7 bytes"):
        tfshards.Pairs(out)[0]


def _update_manifest(out: Path, shard: Path) -> None:
    manifest = json.loads((out / "tfshards.json").read_text())
    for entry in manifest["splits"]["train"]["shards"]:
        if entry["file"] == shard.name:
            entry["bytes"] = shard.stat().st_size
            entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
            entry["records"] = 1
    manifest["splits"]["train"]["records"] = sum(
        e["records"] for e in manifest["splits"]["train"]["shards"]
    )
    (out / "tfshards.json").write_text(json.dumps(manifest))


def test_importing_tfshards_and_reading_pairs_imports_no_tensorflow(tmp_path: Path) -> None:
    out = _convert(tmp_path, encoding="deflate", compression="gzip")
    program = (
        "import sys, pickle, tfshards\n"
        f"pairs = tfshards.Pairs({str(out)!r}, with_keys=True)\n"
        "pairs = pickle.loads(pickle.dumps(pairs))\n"
        "assert len(pairs.__getitems__(range(len(pairs)))) == 10\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_install_without_tensorflow_lists_every_other_dependency() -> None:
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    needed = {
        Requirement(r).name
        for r in requires("tfshards")
        if "extra ==" not in r and Requirement(r).name != "tensorflow"
    }
    command = "pip install numpy pillow tqdm google-crc32c isal fsspec"
    assert set(command.split()[2:]) == needed
    assert command in (ROOT / "docs" / "frameworks.md").read_text()
    in_ci = command.replace("pip install", "python -m pip install --quiet")
    assert in_ci in (ROOT / ".ci" / "run").read_text()


# ---------------------------------------------------------------- forks while another thread reads


_HANG_SECONDS = 120.0  # far beyond a child's few reads; only a child stuck on a lock gets here


def _fork_reading(pairs: tfshards.Pairs, expected: list[np.ndarray]) -> int:
    """A forked child that reads every pair and exits 0 if each image is ``expected``."""
    pid = os.fork()
    if pid == 0:
        faulthandler.dump_traceback_later(_HANG_SECONDS * 0.9)  # where a hung child waits
        code = 1
        try:
            got = [pairs[i][0] for i in range(len(pairs))]
            code = 0 if all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True)) else 1
        finally:
            os._exit(code)
    return pid


def _exit_codes(pids: list[int]) -> list[int | str]:
    """Each child's exit code; "hung" for one still running at the deadline (then killed)."""
    deadline = time.monotonic() + _HANG_SECONDS
    codes: dict[int, int | str] = {}
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in set(pids) - set(codes):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for pid in set(pids) - set(codes):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        codes[pid] = "hung"
    return [codes[pid] for pid in pids]


def _held_in_a_thread(hold) -> tuple[threading.Event, threading.Thread]:
    """A thread inside ``with hold():`` until the returned event is set."""
    held, release = threading.Event(), threading.Event()

    def run() -> None:
        with hold():
            held.set()
            release.wait()

    thread = threading.Thread(target=run)
    thread.start()
    held.wait()
    return release, thread


def test_a_child_forked_while_a_thread_holds_the_readers_lock_reads(tmp_path: Path) -> None:
    out = _convert(tmp_path, encoding="raw")
    pairs = tfshards.Pairs(out)
    expected = [pairs[i][0] for i in range(len(pairs))]
    release, thread = _held_in_a_thread(lambda: pairs.records._lock)
    pid = _fork_reading(pairs, expected)  # the child's copy of the lock is held
    release.set()
    thread.join()
    assert _exit_codes([pid]) == [0]


def test_a_child_forked_while_a_thread_inflates_a_shard_waits_for_it_then_reads(
    tmp_path: Path,
) -> None:
    from tfshards.sources.folders import held_exclusively

    out = _convert(tmp_path, encoding="raw", compression="gzip")
    expected = [image for image, _ in tfshards.Pairs(out, split="train")]  # inflates, checks
    inflated = tmp_path / "user-cache" / "tfshards" / "inflated"
    for copy in inflated.glob("*.tfrecord"):
        copy.unlink()
    pairs = tfshards.Pairs(out)
    first = Manifest.load(out).splits["train"].shards[0]
    # As a thread of this process inflating shard 0 holds its lock file at the fork: the
    # child's copy of that descriptor must not keep the lock once this process lets go.
    lock = inflated / f".{first.sha256}.lock"
    release, thread = _held_in_a_thread(lambda: held_exclusively(lock))
    pid = _fork_reading(pairs, expected)
    release.set()
    thread.join()
    assert _exit_codes([pid]) == [0]


def test_forty_children_forked_while_a_thread_reads_pairs_all_read_and_exit(
    tmp_path: Path,
) -> None:
    out = _convert(tmp_path, encoding="raw")
    pairs = tfshards.Pairs(out)
    expected = [pairs[i][0] for i in range(len(pairs))]
    pairs.records.open_files = 1  # every change of shard closes and opens under the lock
    stop = threading.Event()

    def read_in_a_loop() -> None:
        rng = np.random.default_rng(0)
        while not stop.is_set():
            pairs.__getitems__(rng.integers(0, len(pairs), 4).tolist())

    reader = threading.Thread(target=read_in_a_loop)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the reader is often caught inside its lock at a fork
    reader.start()
    try:
        pids = []
        for _ in range(40):
            time.sleep(0.002)
            pids.append(_fork_reading(pairs, expected))
    finally:
        stop.set()
        reader.join()
        sys.setswitchinterval(switch)
    codes = _exit_codes(pids)
    assert codes == [0] * 40, f"{codes.count('hung')} of 40 children hung"


# ---------------------------------------------------------------- damage in the user cache folder


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


def _cut(path: Path, size: int) -> None:
    with open(path, "r+b") as stream:
        stream.truncate(size)


def _images(pairs: tfshards.Pairs) -> list[np.ndarray]:
    return [pairs[i][0] for i in range(len(pairs))]


def _assert_same(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "another shard's"])
def test_damaged_kept_offsets_are_named_and_scanned_again(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    out = _convert(tmp_path, count=11, encoding="raw")  # shards of 4, 4 and 3 records
    expected = _images(tfshards.Pairs(out))
    shards = Manifest.load(out).splits["train"].shards
    folder = tmp_path / "user-cache" / "tfshards" / "offsets"
    kept = {p.stem: p for p in folder.iterdir()}  # by shard sha256
    first, last = kept[shards[0].sha256], kept[shards[-1].sha256]
    if damage == "flipped byte":
        _flip(first, first.stat().st_size - 5)
    elif damage == "truncated":
        _cut(first, first.stat().st_size // 2)
    else:
        first.write_bytes(last.read_bytes())
    with caplog.at_level("WARNING", logger="tfshards"):
        _assert_same(_images(tfshards.Pairs(out)), expected)
    assert first.name in caplog.text and "not at fault" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tfshards"):
        _assert_same(_images(tfshards.Pairs(out)), expected)
    assert caplog.text == ""  # kept again, whole


def _records_of(copy: Path) -> np.ndarray:
    from tfshards.schemas.offsets import scan_offsets

    return scan_offsets(copy).starts


@pytest.mark.parametrize("damage", ["flipped byte", "cut mid-record", "cut at a record's end"])
@pytest.mark.parametrize("reader", ["next run", "same reader"])
def test_a_damaged_inflated_copy_is_made_again_and_the_read_goes_on(
    tmp_path: Path, damage: str, reader: str, caplog: pytest.LogCaptureFixture
) -> None:
    out = _convert(tmp_path, count=11, encoding="raw", compression="gzip")
    pairs = tfshards.Pairs(out)
    expected = _images(pairs)
    shard = Manifest.load(out).splits["train"].shards[1]
    copy = tmp_path / "user-cache" / "tfshards" / "inflated" / f"{shard.sha256}.tfrecord"
    whole = copy.read_bytes()
    starts = _records_of(copy)
    if damage == "flipped byte":
        _flip(copy, int(starts[2]) + 100)  # inside record 2's pixels
    elif damage == "cut mid-record":
        _cut(copy, int(starts[-1]) + 50)
    else:
        _cut(copy, int(starts[-1]))  # one record fewer than the manifest says
    if reader == "next run":
        pairs = tfshards.Pairs(out)
    with caplog.at_level("WARNING", logger="tfshards"):
        _assert_same(_images(pairs), expected)
    assert f"{copy}: this copy in the user cache folder is damaged" in caplog.text
    assert "manifest was edited" not in caplog.text
    assert copy.read_bytes() == whole
