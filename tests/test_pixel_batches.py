"""Records of one size decoded a batch at a time in Python (sources/pixel_batches.py): the
pixels of raw and deflate records, and each way a record can disagree named with its place."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write_pairs

import tfshards
from tfshards.readers.shards import split_shards
from tfshards.schemas import deflate
from tfshards.schemas.record import EncodedPair
from tfshards.schemas.tfrecord import RecordError, frame_record
from tfshards.sources import pixel_batches
from tfshards.sources.pixel_batches import (
    ALIGNMENT,
    PairDecodeError,
    PixelBatches,
    aligned_empty,
    batches_of,
)
from tfshards.sources.records import SplitRecords

SHAPE = (6, 5, 3)


def _pixels(seed: int, channels: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (*SHAPE[:2], channels), dtype=np.uint8)


ENCODE = {
    "raw": lambda p: p.tobytes(),
    "deflate": lambda p: deflate.compress(p, 1),
}


def _record(seed: int, fmt: str, **changes) -> bytes:
    image, mask = _pixels(seed, 3), _pixels(seed + 100, 1) % 4
    fields = dict(
        key=f"pair{seed}",
        image=ENCODE[fmt](image),
        image_format=fmt,
        height=SHAPE[0],
        width=SHAPE[1],
        channels=SHAPE[2],
        mask=ENCODE[fmt](mask),
        mask_format=fmt,
    )
    return EncodedPair(**{**fields, **changes}).to_example()


def _located(k: int) -> str:
    return f"shard-x.tfrecord: record {k}"


@pytest.mark.parametrize("fmt", ["raw", "deflate"])
def test_a_batch_holds_each_records_pixels_and_key(fmt):
    batches = PixelBatches(SHAPE, (fmt,), (fmt,), "data (split train)")
    images, masks, keys = batches.decode([_record(s, fmt) for s in range(4)], _located)
    assert images.shape == (4, *SHAPE) and masks.shape == (4, *SHAPE[:2], 1)
    for k in range(4):
        assert np.array_equal(images[k], _pixels(k, 3))
        assert np.array_equal(masks[k], _pixels(k + 100, 1) % 4)
    assert keys == ["pair0", "pair1", "pair2", "pair3"]
    assert images.ctypes.data % ALIGNMENT == 0 and masks.ctypes.data % ALIGNMENT == 0
    assert images.flags.writeable, "a DataLoader user may augment in place"


def test_png_and_jpeg_are_left_to_tensorflow():
    with pytest.raises(ValueError, match=r"\['jpeg', 'png'\] are not decoded a batch at a time"):
        PixelBatches(SHAPE, ("png", "jpeg"), ("raw",), "data (split train)")


def test_a_record_of_another_size_is_named_with_its_key_and_place():
    batches = PixelBatches(SHAPE, ("raw",), ("raw",), "data (split train)")
    bad = _record(1, "raw", height=3, image=bytes(3 * 5 * 3), mask=bytes(3 * 5))
    with pytest.raises(PairDecodeError) as caught:
        batches.decode([_record(0, "raw"), bad], _located)
    message = str(caught.value)
    assert "data (split train): record pair1 disagrees with the manifest" in message
    assert "it holds 3x5x3 (HxWxC) pixels, the manifest says 6x5 with 3 channels" in message
    assert "shard-x.tfrecord: record 1" in message


@pytest.mark.parametrize(
    ("changes", "cause"),
    [
        ({"image": bytes(7)}, "its raw pixels are 7 bytes where its size, 6x5x3 (HxWxC), makes 90"),
        ({"mask_format": "png"}, "its mask is stored as 'png', the manifest's encoding allows raw"),
        ({"image_format": "deflate"}, "its image is stored as 'deflate'"),
    ],
)
def test_pixels_that_do_not_decode_name_the_record_and_the_cause(changes, cause):
    batches = PixelBatches(SHAPE, ("raw",), ("raw",), "data (split train)")
    with pytest.raises(PairDecodeError) as caught:
        batches.decode([_record(0, "raw"), _record(1, "raw", **changes)], _located)
    assert str(caught.value).startswith("shard-x.tfrecord: record 1: ")
    assert cause in str(caught.value)


def test_a_corrupt_zlib_stream_is_named():
    batches = PixelBatches(SHAPE, ("deflate",), ("deflate",), "data (split train)")
    broken = _record(0, "deflate", image=b"x\x9c" + bytes(20))
    with pytest.raises(PairDecodeError, match=r"record 0: deflate stream is corrupt"):
        batches.decode([broken], _located)


def test_aligned_empty_is_aligned_whatever_numpy_gives():
    for size in (1, 63, 64, 1000, 6 * 2**20):
        array = aligned_empty((size,))
        assert array.shape == (size,) and array.ctypes.data % ALIGNMENT == 0


@pytest.mark.parametrize("fmt", ["raw", "deflate"])
def test_records_of_one_layout_decode_as_if_each_were_walked(fmt):
    """After the first record of a length is walked, the next of that length is placed by
    its layout: keys of other lengths, and sizes, formats or pixels that change the bytes
    between the values, are each still found."""
    batches = PixelBatches(SHAPE, (fmt,), (fmt,), "data (split train)")
    records = [_record(s, fmt, key=f"pair{s}" + "x" * (s % 3)) for s in range(9)]
    images, masks, keys = batches.decode(records, _located)
    assert keys == [f"pair{s}" + "x" * (s % 3) for s in range(9)]
    for k in range(9):
        assert np.array_equal(images[k], _pixels(k, 3))
        assert np.array_equal(masks[k], _pixels(k + 100, 1) % 4)
    assert {layout.length for layout in batches._layouts.values()} == {len(r) for r in records}


def test_a_record_that_fits_a_layouts_length_but_not_its_bytes_is_walked_and_checked():
    batches = PixelBatches(SHAPE, ("raw",), ("raw",), "data (split train)")
    good = _record(0, "raw")
    batches.decode([good], _located)
    # Same length: width 5 -> 7 is one varint byte either way, and "raw" -> "rgb".
    for changes, cause in (
        ({"width": 7}, r"it holds 6x7x3 \(HxWxC\) pixels"),
        ({"image_format": "rgb"}, "its image is stored as 'rgb'"),
    ):
        bad = _record(1, "raw", **changes)
        assert len(bad) == len(good)
        with pytest.raises(PairDecodeError, match=cause):
            batches.decode([good, bad], _located)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))


def _raw_split(tmp_path: Path, records: list[bytes] | None = None) -> SplitRecords:
    """A converted raw dataset of 24x32 pairs in one shard; ``records`` replace its own."""
    images, masks = write_pairs(tmp_path / "data", count=12)
    out = tmp_path / "shards"
    tfshards.convert(images, masks, out, encoding="raw", num_shards=1, progress=False)
    if records is not None:
        manifest = json.loads((out / "tfshards.json").read_text())
        split = manifest["splits"]["train"]
        shard = out / split["shards"][0]["file"]
        shard.write_bytes(b"".join(frame_record(record) for record in records))
        shard.with_suffix(".tfrecord.idx").unlink(missing_ok=True)
        split["shards"][0].update(
            bytes=shard.stat().st_size,
            sha256=hashlib.sha256(shard.read_bytes()).hexdigest(),
            records=len(records),
        )
        split["records"] = len(records)
        (out / "tfshards.json").write_text(json.dumps(manifest))
    return SplitRecords(split_shards(out, "train"))


def _raw_pair(key: str, height: int = 24, width: int = 32, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, 24 * 32 * 3, dtype=np.uint8).tobytes()
    mask = rng.integers(0, 3, 24 * 32, dtype=np.uint8).tobytes()
    return EncodedPair(key, image, "raw", height, width, 3, mask, "raw").to_example()


def test_a_raw_batch_read_into_its_rows_is_the_decoded_batch(tmp_path, monkeypatch):
    records = _raw_split(tmp_path, [_raw_pair(f"pair{k:02d}", seed=k) for k in range(12)])
    batches = batches_of(records.shards.manifest, "data (split train)")
    walks = []
    real_read_record = pixel_batches.read_record
    monkeypatch.setattr(
        pixel_batches, "read_record", lambda *a: walks.append(a) or real_read_record(*a)
    )
    indices = np.random.default_rng(0).permutation(12)
    for _ in range(2):
        images, masks, keys = batches.read(records, indices, str)
        expected_images, expected_masks, expected_keys = batches.decode(records.read(indices), str)
        np.testing.assert_array_equal(images, expected_images)
        np.testing.assert_array_equal(masks, expected_masks)
        assert keys == expected_keys == [f"pair{k:02d}" for k in indices]
    assert len(walks) == 1, "after the first record, each is read straight into its rows"
    assert images.ctypes.data % ALIGNMENT == 0


def test_a_record_of_the_layouts_length_but_another_size_is_refused_when_read(tmp_path):
    """32x24 has the bytes of 24x32 and the same length: only the bytes around tell."""
    records = _raw_split(tmp_path, [_raw_pair("pair00"), _raw_pair("pair01", 32, 24)])
    batches = batches_of(records.shards.manifest, "data (split train)")
    batches.read(records, np.array([0]), str)
    with pytest.raises(PairDecodeError, match=r"record pair01 disagrees with the manifest"):
        batches.read(records, np.array([0, 1]), str)


@pytest.mark.parametrize(
    ("where", "cause"), [(200, "data CRC mismatch"), (-200, "data CRC mismatch"), (3, "length CRC")]
)
def test_a_corrupt_record_read_into_its_rows_is_named(tmp_path, where, cause):
    records = _raw_split(tmp_path, [_raw_pair(f"pair{k:02d}", seed=k) for k in range(3)])
    batches = batches_of(records.shards.manifest, "data (split train)")
    batches.read(records, np.array([0]), str)  # the layout is known from here on
    shard = Path(records.shards.paths[0])
    data = bytearray(shard.read_bytes())
    length = len(data) // 3
    data[length + (where if where > 0 else length + where)] ^= 0x01  # in record 1
    shard.write_bytes(bytes(data))
    records = SplitRecords(split_shards(shard.parent, "train"))
    with pytest.raises(RecordError, match=rf"{shard.name}: record 1: {cause}"):
        batches.read(records, np.array([0, 1, 2]), str)
