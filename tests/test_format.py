"""The format module: every encoding round-trips with NumPy and TensorFlow; names; manifest."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from tfshards.errors import ManifestError, OptionsError
from tfshards.schemas import format as fmt
from tfshards.schemas.manifest import Manifest

tf = pytest.importorskip("tensorflow")


def pixels(channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (7, 5, channels), dtype=np.uint8)


NO_SOURCE = fmt.SourceFile(b"", "png", reusable=False)


@pytest.mark.parametrize("name", sorted(fmt.ENCODINGS))
@pytest.mark.parametrize("channels", [1, 3])
def test_each_encoding_decodes_alike_in_numpy_and_tensorflow(name, channels):
    encoding = fmt.ENCODINGS[name]
    original = pixels(channels)
    data, stored_as = encoding.encode(original, NO_SOURCE)
    assert stored_as in encoding.formats
    with_numpy = fmt.decode_pixels(data, stored_as, 7, 5, channels)
    with_tf = encoding.tf_decode(tf.constant(data), 7, 5, channels).numpy()
    if encoding.lossless:
        assert np.array_equal(with_numpy, original) and np.array_equal(with_tf, original)
    else:  # libjpeg builds differ in rounding; both decode near the original
        assert np.abs(with_numpy.astype(int) - with_tf).mean() < 4
        assert np.abs(with_numpy.astype(int) - original).mean() < 40


@pytest.mark.parametrize("name", [n for n, e in fmt.ENCODINGS.items() if e.batchable])
def test_batchable_encodings_decode_a_whole_batch(name):
    encoding = fmt.ENCODINGS[name]
    batch = [pixels(3, seed) for seed in range(4)]
    encoded = tf.constant([encoding.encode(p, NO_SOURCE)[0] for p in batch])
    decoded = encoding.tf_decode(encoded, 7, 5, 3).numpy()
    assert decoded.shape == (4, 7, 5, 3) and np.array_equal(decoded, np.stack(batch))


def test_deflate_is_a_plain_zlib_stream_of_the_raw_pixels():
    original = pixels(3)
    data, _ = fmt.ENCODINGS["deflate"].encode(original, NO_SOURCE)
    assert zlib.decompress(data) == original.tobytes()
    with pytest.raises(ValueError, match="deflate stream is corrupt"):
        fmt.decode_pixels(data[:-5] + b"xxxxx", "deflate", 7, 5, 3)
    with pytest.raises(ValueError, match="raw pixels are 105 bytes, expected 35"):
        fmt.decode_pixels(data, "deflate", 7, 5, 1)


def test_masks_refuse_lossy_encodings_and_unknown_names_list_the_valid_ones():
    with pytest.raises(OptionsError, match="'jpeg' is refused: it is lossy"):
        fmt.mask_encoding("jpeg")
    with pytest.raises(OptionsError, match="valid encodings: deflate, keep, png, raw"):
        fmt.mask_encoding("webp")
    with pytest.raises(OptionsError, match="valid compressions: none, gzip, zlib"):
        fmt.compression("lz4")
    assert fmt.auto_mask_encoding("deflate") == "deflate"
    assert fmt.auto_mask_encoding("jpeg") == "keep"


@pytest.mark.parametrize("name", list(fmt.COMPRESSIONS))
def test_each_compression_round_trips_in_python_and_tensorflow(tmp_path, name):
    from tfshards.converters.writer import ShardWriter

    path = tmp_path / fmt.shard_file_name("train", 0, 1, name)
    records = [bytes([i]) * (100 + i) for i in range(5)]
    with ShardWriter(path, compression=name) as writer:
        for record in records:
            writer.write(record)
    assert path.name.endswith(".tfrecord" + fmt.COMPRESSIONS[name].suffix)
    compression = fmt.COMPRESSIONS[name]
    read_back = tf.data.TFRecordDataset(str(path), compression_type=compression.tf_name)
    assert [r.numpy() for r in read_back] == records
    with compression.open(path) as stream:  # framed records, uncompressed
        assert len(stream.read()) == sum(len(r) + 16 for r in records)


def test_file_names_are_recognised_as_our_own():
    for name in fmt.COMPRESSIONS:
        shard = Path(fmt.shard_file_name("val", 3, 12, name))
        assert shard.name.startswith("val-00003-of-00012.tfrecord")
        for own in (shard, fmt.temporary_path(shard), fmt.index_path(shard)):
            assert fmt.OWN_FILE.match(own.name), own.name
        assert fmt.SHARD_LIKE.search(shard.name)
    assert not fmt.OWN_FILE.match("notes.txt") and not fmt.SHARD_LIKE.search("notes.txt")
    journal = fmt.journal_entry(Path("out"), "train-00000-of-00001.tfrecord")
    assert journal == Path("out", fmt.WORK_NAME, fmt.JOURNAL_DONE, journal.name)


def _manifest_body() -> dict:
    return {
        "format": "tfshards",
        "schema_version": 1,
        "image": {"encoding": "deflate", "channels": 3, "height": 4, "width": 4},
        "mask": {"encoding": "deflate", "num_classes": None, "mask_map": []},
        "compression": {"type": "none", "level": 1},
        "seed": 0,
        "options": {},
        "source": {},
        "splits": {},
    }


@pytest.mark.parametrize(
    ("section", "field", "value", "message"),
    [
        ("image", "encoding", "webp", "image.encoding is 'webp'"),
        ("image", "channels", 65, "image.channels is 65"),
        ("image", "channels", 0, "image.channels is 0"),
        ("image", "dtype", "float32", "image.dtype is 'float32'"),
        ("image", "height", None, r"image.height/width is \(None, 4\)"),
        ("mask", "num_classes", 0, "mask.num_classes is 0"),
        ("compression", "type", "lz4", "compression.type is 'lz4'"),
        ("compression", "bogus", 1, "manifest section compression: .*bogus"),
    ],
)
def test_manifest_sections_are_typed_and_errors_name_the_field(section, field, value, message):
    body = _manifest_body()
    Manifest.from_json(json.dumps(body), where="m.json")  # valid as made
    body[section][field] = value
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(json.dumps(body), where="m.json")
    body[section] = "text"
    with pytest.raises(ManifestError, match=f"manifest field {section} is 'text'"):
        Manifest.from_json(json.dumps(body), where="m.json")


@pytest.fixture(params=["isal", "zlib"])
def backend(request, monkeypatch):
    """The deflate module as installed (ISA-L) and as it falls back without isal."""
    from tfshards.schemas import deflate

    if request.param == "isal":
        pytest.importorskip("isal")
    else:
        monkeypatch.setattr(deflate, "isal_zlib", None)
        monkeypatch.setattr(deflate, "igzip", None)
    return request.param


def test_deflate_records_are_standard_zlib_streams(backend):
    original = np.random.default_rng(3).integers(0, 40, (64, 48, 3), dtype=np.uint8)
    data, stored_as = fmt.ENCODINGS["deflate"].encode(original, NO_SOURCE)
    assert stored_as == "deflate" and len(data) < original.nbytes
    assert zlib.decompress(data) == original.tobytes()
    inflated = tf.io.decode_compressed(tf.constant(data), compression_type="ZLIB")
    assert inflated.numpy() == original.tobytes()


@pytest.mark.parametrize("name", ["gzip", "zlib"])
@pytest.mark.parametrize("level", [0, 1, 5, 9])
def test_shard_streams_read_with_zlib_and_tensorflow(tmp_path, backend, name, level):
    import gzip

    from tfshards.converters.writer import ShardWriter

    records = [bytes(range(i % 7, 200)) * (i + 1) for i in range(20)]
    path = tmp_path / fmt.shard_file_name("train", 0, 1, name)
    with ShardWriter(path, compression=name, level=level) as writer:
        for record in records:
            writer.write(record)
    data = path.read_bytes()
    plain = gzip.decompress(data) if name == "gzip" else zlib.decompress(data)
    framed = b"".join(fmt_frame(r) for r in records)
    assert plain == framed
    compression = fmt.COMPRESSIONS[name]
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression.tf_name)]
    assert read == records
    with compression.open(path) as stream:
        assert stream.read() == framed


def fmt_frame(record: bytes) -> bytes:
    from tfshards.schemas.tfrecord import frame_record

    return frame_record(record)


def test_every_zlib_level_but_0_is_written_by_isal_level_3():
    from tfshards.schemas import deflate

    if deflate.isal_zlib is None:
        pytest.skip("isal has no wheel for this platform")
    pixels = (np.arange(5000, dtype=np.uint32) * 7919 % 13).astype(np.uint8)
    level_3 = deflate.isal_zlib.compress(pixels, 3)
    assert level_3 != deflate.isal_zlib.compress(pixels, 1), "pick data the levels tell apart"
    assert [deflate.compress(pixels, level) for level in range(1, 10)] == [level_3] * 9
    assert deflate.compress(pixels, 0) == zlib.compress(pixels, 0)
    stream = deflate.compressobj(6, deflate.ZLIB_WBITS)
    assert stream.compress(pixels) + stream.flush() == level_3


def test_compressions_state_their_properties():
    none, gzip_, zlib_ = (fmt.COMPRESSIONS[n] for n in ("none", "gzip", "zlib"))
    assert not none.compressed and none.index_seekable and none.tfds_readable
    assert none.levels == range(0) and none.default_level is None and none.compressor() is None
    for shards in (gzip_, zlib_):
        assert shards.compressed and not shards.index_seekable and not shards.tfds_readable
        assert shards.default_level in shards.levels and list(shards.levels) == list(range(10))
    assert fmt.resolved_compression(fmt.AUTO) == fmt.NO_COMPRESSION
    assert fmt.ENCODINGS["deflate"].level == 1 and fmt.ENCODINGS["jpeg"].quality == 95
    assert {e.tfds_form for e in fmt.ENCODINGS.values()} == {fmt.TFDS_IMAGE, "ZLIB", "BYTES"}
