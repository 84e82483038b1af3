"""What read() promises beyond streaming: the pixels conversion checked, the dtypes asked
for, arguments checked by tfshards, manifests that agree with their records (issue 28)."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import write_pairs
from PIL import Image

import tfshards
from tfshards import OptionsError, convert
from tfshards.checks.shard_io import shard_examples
from tfshards.schemas.record import decode_record


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("promises")
    images, masks = write_pairs(root / "data", 10, size=(16, 12))
    convert(images, masks, root / "shards", num_shards=2, workers=1, progress=False)
    return root / "shards"


# Issue 28 point 8.
@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"cache": ""}, r"cache='' is neither 'memory' nor a folder"),
        ({"cache": "Memory"}, r"cache='Memory' is neither 'memory' nor a folder"),
        ({"cache": "disk"}, r"cache='disk' is neither"),
        ({"image_size": 20}, r"image_size must be \(height, width\), two positive .*got 20"),
        ({"image_size": (20, 0)}, r"image_size must be .*got \(20, 0\)"),
        ({"crop_size": 16}, r"crop_size must be \(height, width\), two positive .*got 16"),
        ({"pad_to": (16.5, 12)}, r"pad_to must be .*got \(16.5, 12\)"),
        ({"batch_size": 2.5}, r"batch_size must be an integer in \[1, 2\*\*31\), got 2.5"),
        ({"batch_size": True}, r"batch_size must be an integer in \[1, 2\*\*31\), got True"),
        ({"seed": 1.5}, r"seed must be an integer in \[0, 2\*\*63\) or None, got 1.5"),
        ({"seed": "1"}, r"seed must be an integer in \[0, 2\*\*63\) or None, got '1'"),
    ],
)
def test_bad_arguments_are_refused_by_tfshards(small, tmp_path, monkeypatch, arguments, match):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptionsError, match=match):
        tfshards.read(small, **arguments)
    assert list(tmp_path.iterdir()) == [], "nothing is written into the current folder"


# Issue 28 point 8.
def test_numpy_integers_and_a_folder_named_like_a_keyword_are_accepted(small, tmp_path):
    ds = tfshards.read(small, batch_size=np.int64(4), seed=np.int32(1), image_size=(8, 8))
    assert next(iter(ds))[0].shape == (4, 8, 8, 3)
    tfshards.read(small, batch_size=4, cache=tmp_path / "Memory")  # a Path is a folder


# Issue 28 point 5.
def test_pad_to_smaller_than_fixed_size_records_says_so_at_read(small):
    with pytest.raises(OptionsError, match=r"a record is larger than pad_to=\(8, 12\).*16x12"):
        tfshards.read(small, pad_to=(8, 12))
    images, _ = next(iter(tfshards.read(small, pad_to=(20, 12), batch_size=2)))
    assert images.shape == (2, 20, 12, 3)


def _flipped_or_same(batch: np.ndarray, plain: np.ndarray) -> list[bool]:
    """For each element: True when mirrored left-right, False when unchanged; else fails."""
    out = []
    for moved, original in zip(batch, plain, strict=True):
        assert np.array_equal(moved, original) or np.array_equal(moved, original[:, ::-1])
        out.append(not np.array_equal(moved, original))
    return out


# Issue 28 point 2.
@pytest.mark.parametrize("sequential", [False, True])
def test_uint8_asked_is_uint8_delivered_through_a_keras_layer(small, sequential):
    import keras

    flip = keras.layers.RandomFlip("horizontal", seed=1)
    layer = keras.Sequential([flip]) if sequential else flip
    plain = tfshards.read(small, batch_size=8, shuffle=False, image_dtype="uint8")
    moved = tfshards.read(small, batch_size=8, shuffle=False, image_dtype="uint8", augment=layer)
    assert moved.element_spec[0].dtype == tf.uint8
    (images, masks), (moved_images, moved_masks) = next(iter(plain)), next(iter(moved))
    assert moved_images.dtype == tf.uint8 and moved_masks.dtype == tf.int32
    flipped = _flipped_or_same(moved_images.numpy(), images.numpy())
    assert flipped == _flipped_or_same(moved_masks.numpy(), masks.numpy())
    assert any(flipped) and not all(flipped), flipped


JAX_SCRIPT = """
import sys
import keras, numpy as np
import tfshards
assert keras.backend.backend() == "jax", keras.backend.backend()
shards = sys.argv[1]
augment = keras.Sequential([keras.layers.RandomFlip("horizontal", seed=1)])
train = tfshards.read(shards, batch_size=4, seed=0, augment=augment)
images, masks = next(iter(train))
assert images.shape == (4, 16, 12, 3) and masks.shape == (4, 16, 12, 1), images.shape
inputs = keras.Input((16, 12, 3))
model = keras.Model(inputs, keras.layers.Conv2D(3, 1, activation="softmax")(inputs))
model.compile("adam", "sparse_categorical_crossentropy")
model.fit(train, epochs=1, verbose=0)
functional = keras.Model(inputs, keras.layers.RandomFlip(seed=1)(inputs))
try:
    tfshards.read(shards, augment=functional)
except tfshards.OptionsError as exc:
    print("refused:", exc)
print("fit ok")
"""


# Issue 28 point 3.
def test_a_keras_sequential_augments_under_the_jax_backend(small):
    import subprocess
    import sys

    import jax  # noqa: F401  (the test extra installs jax[cpu]: a missing one fails here)

    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT, str(small)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "fit ok" in run.stdout
    assert "refused: augment=Functional (a keras.Model) cannot run inside tf.data on the jax" in (
        run.stdout
    )
    assert "keras.layers.Pipeline" in run.stdout


def python_records(out: Path, split: str = "train") -> list:
    """Every record of a split decoded by the pure-Python decoder (Pillow), in manifest order."""
    manifest = tfshards.Manifest.load(out)
    compression = manifest.compression.type
    return [
        (features, decode_record(features))
        for shard in manifest.splits[split].shards
        for features in shard_examples(out / shard.file, compression)
    ]


def assert_read_equals_python_decoder(out: Path) -> int:
    """read()'s uint8 pixels against decode_record's, record by record; the records."""
    expected = python_records(out)
    got = tfshards.read(out, batch_size=5, shuffle=False, image_dtype="uint8")
    pairs = [
        (i, m) for images, masks in got for i, m in zip(images.numpy(), masks.numpy(), strict=True)
    ]
    assert len(pairs) == len(expected)
    for (image, mask), (features, record) in zip(pairs, expected, strict=True):
        assert np.array_equal(image, record.image), (record.key, features["image/format"])
        assert np.array_equal(mask[:, :, 0], record.mask), (record.key, features["mask/format"])
    return len(expected)


def jpeg_masks(masks: Path, classes: int = 4) -> None:
    """Replace each PNG mask by a grayscale JPEG whose labels (as Pillow decodes them) stay
    below ``classes``, with edges where JPEG decoders round differently."""
    for path in sorted(masks.glob("*.png")):
        labels = np.asarray(Image.open(path))
        height, width = labels.shape
        ramp = (np.arange(width)[None, :] * classes // width + np.arange(height)[:, None] % 2) % 4
        for quality in (95, 90, 85, 80, 75, 60):
            buffer = io.BytesIO()
            Image.fromarray(ramp.astype(np.uint8)).save(buffer, format="JPEG", quality=quality)
            if np.asarray(Image.open(buffer)).max() < classes:
                break
        else:
            raise AssertionError("no JPEG quality keeps the labels below the class count")
        path.with_suffix(".jpg").write_bytes(buffer.getvalue())
        path.unlink()


# Issue 28 point 1.
@pytest.mark.parametrize(
    ("encoding", "image_format", "channels"),
    [
        ("raw", "png", 3),
        ("deflate", "png", 1),
        ("png", "jpeg", 3),
        ("jpeg", "png", 3),
        ("jpeg", "png", 1),
        ("keep", "png", 3),
        ("keep", "jpeg", 3),
        ("keep", "jpeg", 1),
    ],
)
def test_read_gives_the_pixels_the_python_decoder_gives(tmp_path, encoding, image_format, channels):
    images, masks = write_pairs(
        tmp_path / "data", 12, size=(37, 41), channels=channels, image_format=image_format
    )
    out = tmp_path / "out"
    convert(images, masks, out, encoding=encoding, num_shards=2, workers=1, progress=False)
    assert assert_read_equals_python_decoder(out) == 12


# Issue 28 point 1.
def test_jpeg_masks_are_stored_as_png_of_the_labels_validated(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 10, size=(40, 40), image_format="jpeg")
    jpeg_masks(masks)
    sources = {p.stem: np.asarray(Image.open(p)) for p in masks.glob("*.jpg")}
    out = tmp_path / "out"
    convert(images, masks, out, encoding="keep", num_classes=4, workers=1, progress=False)
    records = python_records(out)
    assert {features["mask/format"] for features, _ in records} == {b"png"}
    assert {features["image/format"] for features, _ in records} == {b"jpeg"}  # kept
    for _, record in records:
        assert np.array_equal(record.mask, sources[record.key]), record.key
    assert assert_read_equals_python_decoder(out) == 10


@pytest.fixture(scope="module")
def square(tmp_path_factory) -> dict[str, Path]:
    """32x32 RGB datasets, deflate (decoded a batch at a time) and PNG (one at a time)."""
    root = tmp_path_factory.mktemp("square")
    images, masks = write_pairs(root / "data", 16, size=(32, 32))
    out = {}
    for encoding in ("deflate", "png"):
        out[encoding] = root / encoding
        convert(images, masks, out[encoding], encoding=encoding, num_shards=2, workers=1,
                progress=False)  # fmt: skip
    return out


def edited_copy(dataset: Path, target: Path, edit) -> Path:
    shutil.copytree(dataset, target, ignore=shutil.ignore_patterns(".tfshards-cache"))
    body = json.loads((target / "tfshards.json").read_text())
    edit(body)
    (target / "tfshards.json").write_text(json.dumps(body))
    return target


def _height(body):
    body["image"]["height"] = 16


def _channels(body):
    body["image"]["channels"] = 1


HEIGHT_SAYS = r"it holds 32x32x3 \(HxWxC\) pixels, the manifest says 16x32"
CHANNELS_SAYS = r"it holds 32x32x3 .*the manifest says 32x32 with 1 channels and masks 1"


# Issue 28 point 7.
@pytest.mark.parametrize("encoding", ["deflate", "png"])
@pytest.mark.parametrize("cache", [None, "memory"])
@pytest.mark.parametrize(("edit", "says"), [(_height, HEIGHT_SAYS), (_channels, CHANNELS_SAYS)])
def test_a_manifest_that_disagrees_with_its_records_stops_the_read(
    square, tmp_path, encoding, cache, edit, says
):
    edited = edited_copy(square[encoding], tmp_path / "edited", edit)
    where = rf"{edited} \(split train\): record \d+ disagrees with the manifest: {says}"
    with pytest.raises(tf.errors.InvalidArgumentError, match=where):
        for _ in tfshards.read(edited, batch_size=8, seed=0, image_dtype="uint8", cache=cache):
            pytest.fail("a batch was delivered before the error")


def _shard_counts(delta: int):
    def edit(body):
        split = body["splits"]["train"]
        split["records"] += delta
        split["shards"][0]["records"] += delta

    return edit


# Issue 28 point 7.
@pytest.mark.parametrize("encoding", ["deflate", "png"])
def test_record_counts_other_than_the_manifests_stop_the_read_in_tfshards_words(
    square, tmp_path, encoding
):
    # The ordered reader finds every shard's records by their offsets, so a count that
    # disagrees stops the read when the shard is first opened, naming it.
    message = r"train-0000\d-of-00002\.tfrecord: \d+ records, but the manifest says \d+"
    more = edited_copy(square[encoding], tmp_path / "more", _shard_counts(5))
    with pytest.raises(tf.errors.OpError, match=message):
        list(tfshards.read(more, batch_size=4, seed=0))
    with pytest.raises(tf.errors.OpError, match=message):
        list(tfshards.read(more, batch_size=5, seed=0, drop_remainder=True))
    fewer = edited_copy(square[encoding], tmp_path / "fewer", _shard_counts(-5))
    batches = []
    with pytest.raises(tf.errors.OpError, match=message):
        for batch in tfshards.read(fewer, batch_size=4, shuffle=False):
            batches.append(batch)
    assert len(batches) <= 3, "stopped at the first batch of the shard"


# Issue 28 point 7.
def test_a_record_whose_byte_count_disagrees_with_its_size_is_refused():
    from tfshards.schemas.format import PIXEL_FORMATS

    decode = PIXEL_FORMATS["raw"].tf_decode
    assert decode(tf.constant(bytes(24)), 2, 4, 3).shape == (2, 4, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"are 48 bytes where its size, 2x4x3"):
        decode(tf.constant([bytes(48)]), 2, 4, 3)


def read_only(dataset: Path, monkeypatch) -> None:
    """The dataset folder made read-only (root writes anyway: its writability check lies)."""
    dataset.chmod(0o555)
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: Path(path) != dataset)


# Issue 28 point 6.
def test_cache_cli_sees_and_clears_the_cache_of_a_read_only_dataset(
    small, tmp_path, monkeypatch, capsys
):
    from tfshards.cli import main

    dataset = shutil.copytree(small, tmp_path / "dataset")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    read_only(dataset, monkeypatch)
    try:
        assert sum(int(i.shape[0]) for i, _ in tfshards.read(dataset, cache=True)) == 10
        assert not (dataset / ".tfshards-cache").exists()
        (entry,) = tfshards.list_caches(dataset)
        assert entry.state == "ready" and str(entry.path).startswith(str(tmp_path / "xdg"))
        assert main(["-q", "cache", "list", str(dataset)]) == 0
        assert f"{entry.path}  ready" in capsys.readouterr().out
        monkeypatch.setattr(shutil, "rmtree", _refused)
        assert main(["-q", "cache", "clear", str(dataset)]) == 1
        err = capsys.readouterr().err
        assert f"cannot remove the cache entry {entry.path}: Permission denied" in err
        monkeypatch.undo()
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        read_only(dataset, monkeypatch)
        assert main(["-q", "cache", "clear", str(dataset)]) == 0
        assert f"{entry.bytes / 2**20:.1f} MiB freed" in capsys.readouterr().out
        assert entry.bytes > 0 and tfshards.list_caches(dataset) == []
    finally:
        dataset.chmod(0o755)


def _refused(path, *args, **kwargs):
    raise PermissionError(13, "Permission denied", str(path))


# Issue 28 point 6.
def test_an_unwritable_user_cache_folder_is_named_with_the_cause(small, tmp_path, monkeypatch):
    dataset = shutil.copytree(small, tmp_path / "dataset")
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))
    read_only(dataset, monkeypatch)
    try:
        with pytest.raises(tfshards.TfshardsError, match=r"cannot write the disk cache in "
                           rf"{tmp_path}/file/cache/tfshards/\w+/\w+: Not a directory.*"
                           r"XDG_CACHE_HOME, pass cache='a/writable/folder'"):  # fmt: skip
            tfshards.read(dataset, cache=True)
    finally:
        dataset.chmod(0o755)


# Issue 28 point 7.
def test_image_pixels_of_another_size_than_their_record_says_are_refused():
    from tfshards.readers.decode import PairDecoder
    from tfshards.schemas.format import image_encoding, mask_encoding

    def png(height: int, width: int, channels: int) -> bytes:
        buffer = io.BytesIO()
        pixels = np.zeros((height, width, channels), np.uint8)
        Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels).save(buffer, format="PNG")
        return buffer.getvalue()

    decoder = PairDecoder((None, None, 3), None, image_encoding("png"), mask_encoding("png"),
                          where="d (split train)")  # fmt: skip
    features = {
        "key": tf.constant("k1"),
        "image/encoded": tf.constant(png(4, 6, 3)),
        "image/height": tf.constant(5, tf.int64),
        "image/width": tf.constant(6, tf.int64),
        "image/channels": tf.constant(3, tf.int64),
        "mask/encoded": tf.constant(png(5, 6, 1)),
        "mask/channels": tf.constant(1, tf.int64),
    }
    says = r"d \(split train\): record k1 says 5x6 \(HxW\) but its pixels decode to image 4x6"
    with pytest.raises(tf.errors.InvalidArgumentError, match=says):
        decoder.decode_one(features)
    image, mask = decoder.decode_one({**features, "image/encoded": tf.constant(png(5, 6, 3))})
    assert image.shape == (5, 6, 3) and mask.shape == (5, 6, 1)


@pytest.mark.parametrize("sizing", [{}, {"pad_to": (8, 8)}], ids=["ordered", "padded"])
def test_point_10_the_short_batch_is_last_in_every_unseeded_epoch(tmp_path, sizing):
    from conftest import write_pairs

    images, masks = write_pairs(tmp_path / "data", count=89, size=(8, 8))
    out = tmp_path / "shards"
    tfshards.convert(images, masks, out, options=tfshards.ConvertOptions(num_shards=4))
    ds = tfshards.read(out, batch_size=7, image_dtype="uint8", shuffle=True, **sizing)
    for _ in range(20):
        sizes = [int(images.shape[0]) for images, _ in ds]
        assert sizes == [7] * 12 + [5], sizes
