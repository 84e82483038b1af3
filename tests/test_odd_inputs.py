"""No input crashes a conversion: every Pillow mode and format, mutated files, and retries
after a failed or interrupted conversion."""

from __future__ import annotations

import io
import os
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import write_pairs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import tfshards
from tfshards import ConvertOptions, OutputError, PairError
from tfshards.converters.pairing import Pair
from tfshards.converters.shard_job import _encoded
from tfshards.converters.tiling import PairRecord
from tfshards.converters.validation import prepare_pair
from tfshards.schemas.format import decode_pixels
from tfshards.schemas.tfrecord import parse_example

MODES = ["1", "L", "P", "PA", "LA", "La", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr",
         "LAB", "HSV", "I", "I;16", "I;16B", "F"]  # fmt: skip
FORMATS = ["PNG", "JPEG", "TIFF", "GIF", "BMP", "WEBP", "PPM", "ICO"]
IMAGE_REFUSED = {"I", "I;16", "I;16B", "F"}  # 16-bit and float images
MASK_REFUSED = {"CMYK", "YCbCr", "LAB", "HSV", "La", "F"}


def saved(mode: str, fmt: str, pixels: np.ndarray) -> bytes | None:
    """The file Pillow writes for ``mode`` in ``fmt``, or None where it cannot."""
    image = None
    for route in ((), ("RGBA",), ("LA",), ("RGB",)):
        try:
            image = Image.fromarray(pixels, "L")
            for step in (*route, mode):
                image = image.convert(step)
            break
        except ValueError:
            image = None
    if image is None:
        return None
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            image.save(buffer, format=fmt, **({"sizes": [(16, 16)]} if fmt == "ICO" else {}))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return buffer.getvalue()


def pillow_mode(data: bytes) -> str | None:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.mode
    except Exception:  # noqa: BLE001 - any failure: Pillow cannot read its own file
        return None


def prepared(tmp_path: Path, image: bytes, mask: bytes, **options):
    (tmp_path / "i").write_bytes(image)
    (tmp_path / "m").write_bytes(mask)
    pair = Pair("k", tmp_path / "i", tmp_path / "m")
    opts = ConvertOptions(**options)
    return prepare_pair(pair, opts, 3), pair, opts


GRAY = (np.arange(16 * 16).reshape(16, 16) % 3).astype(np.uint8)  # class indices 0..2
# Every (mode, format) Pillow can write; the others (e.g. CMYK as PNG) cannot reach us.
WRITABLE = [(m, f) for m in MODES for f in FORMATS if saved(m, f, GRAY) is not None]


def test_the_mode_format_grid_is_wide():
    assert len(WRITABLE) >= 60 and {m for m, _ in WRITABLE} == set(MODES) - {"La"}


@pytest.mark.parametrize(("mode", "fmt"), WRITABLE)
def test_every_mode_and_format_converts_or_is_refused_with_a_reason(tmp_path, mode, fmt):
    gray = GRAY
    data = saved(mode, fmt, gray * 60)
    plain_mask = saved("L", "PNG", gray)
    plain_image = saved("RGB", "PNG", np.full((16, 16), 7, np.uint8))
    # as an image
    try:
        pair, _, _ = prepared(tmp_path, data, plain_mask)
        assert pair.image.shape == (16, 16, 3) and pair.image.dtype == np.uint8
    except PairError as exc:
        assert exc.field == "image" and exc.reason
        decoded = pillow_mode(data)  # None: Pillow wrote a file it cannot read back
        assert decoded is None or decoded in IMAGE_REFUSED or "cannot" in exc.reason, exc.reason
    # as a mask: class indices survive, or a reason says why not
    mask_data = saved(mode, fmt, gray)
    try:
        pair, _, _ = prepared(tmp_path, plain_image, mask_data)
        as_gray = np.asarray(Image.open(io.BytesIO(mask_data)).convert("L"))
        if Image.open(io.BytesIO(mask_data)).mode not in ("P", "PA") and np.array_equal(
            as_gray, gray
        ):  # the file holds the classes: they must survive
            assert np.array_equal(pair.mask, gray), (mode, fmt)
    except PairError as exc:
        assert exc.field == "mask" and exc.reason
        decoded = pillow_mode(mask_data)
        assert decoded is None or decoded in MASK_REFUSED or "colour" in exc.reason, exc.reason


def test_unexpected_decoder_errors_are_per_pair_errors(tmp_path, monkeypatch):
    images, masks = write_pairs(tmp_path / "data", 6)
    real_convert = Image.Image.convert

    def odd_convert(self, mode=None, *args, **kwargs):
        if self.mode == "RGBA":
            raise RuntimeError("decoder state lost")  # nothing validation expects
        return real_convert(self, mode, *args, **kwargs)

    broken = next(images.iterdir())
    Image.fromarray(np.zeros((24, 32, 4), np.uint8), "RGBA").save(broken)
    monkeypatch.setattr(Image.Image, "convert", odd_convert)
    manifest = tfshards.convert(
        images, masks, tmp_path / "out", on_error="skip", workers=1, progress=False
    )
    assert manifest.total_records == 5
    (skipped,) = manifest.skipped
    assert skipped.file == str(broken) and "RuntimeError: decoder state lost" in skipped.reason
    with pytest.raises(PairError, match=r"RuntimeError: decoder state lost"):
        tfshards.convert(images, masks, tmp_path / "fail", workers=1, progress=False)
    assert not (tmp_path / "fail" / "tfshards.json").exists()


# ---- fuzz: mutated files ----------------------------------------------------------------

FUZZ_EXAMPLES = int(os.environ.get("TFSHARDS_FUZZ_EXAMPLES", "300"))


def _seed_files() -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    files = {}
    for fmt in ("PNG", "JPEG", "TIFF", "GIF", "WEBP"):
        buffer = io.BytesIO()
        image = Image.fromarray(pixels)
        (image.convert("P") if fmt == "GIF" else image).save(buffer, format=fmt)
        files[fmt] = buffer.getvalue()
    return files


SEEDS = _seed_files()
MASK = (np.arange(120).reshape(12, 10) % 2).astype(np.uint8)


def _mutated(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for op, where, value in ops:
        if not out:
            break
        at = where % len(out)
        if op == "flip":
            out[at] ^= 1 << (value % 8)
        elif op == "set":
            out[at] = value % 256
        elif op == "truncate":
            del out[at:]
        elif op == "insert":
            out[at:at] = bytes([value % 256]) * (value % 64 + 1)
        elif op == "length":  # a 4-byte big-endian length or size field gone wrong
            out[at : at + 4] = (value * 7919 % 2**32).to_bytes(4, "big")
    return bytes(out)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "truncate", "insert", "length"]),
        st.integers(0, 10**6),
        st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=20_000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fmt=st.sampled_from(sorted(SEEDS)), ops=OPS, as_mask=st.booleans())
def test_mutated_files_never_crash_and_never_write_a_bad_record(tmp_path, fmt, ops, as_mask):
    data = _mutated(SEEDS[fmt], ops)
    mask = io.BytesIO()
    Image.fromarray(MASK).save(mask, format="PNG")
    image_bytes, mask_bytes = (SEEDS["PNG"], data) if as_mask else (data, mask.getvalue())
    (tmp_path / "i").write_bytes(image_bytes)
    (tmp_path / "m").write_bytes(mask_bytes)
    pair = Pair("k", tmp_path / "i", tmp_path / "m")
    try:
        result = prepare_pair(pair, ConvertOptions(), 3)
        record = _encoded(pair, PairRecord(result, "k"), ConvertOptions(), 3)
    except PairError as exc:
        assert exc.reason and exc.field in ("image", "mask")
        return
    features = parse_example(record)  # what a reader gets back decodes to what was checked
    h, w = features["image/height"], features["image/width"]
    fmt_of = features["image/format"].decode()
    assert np.array_equal(decode_pixels(features["image/encoded"], fmt_of, h, w, 3), result.image)
    mask_fmt = features["mask/format"].decode()
    decoded_mask = decode_pixels(features["mask/encoded"], mask_fmt, h, w, 1)[:, :, 0]
    assert np.array_equal(decoded_mask, result.mask)


def test_a_folder_of_mutated_files_converts_the_rest_with_skip(tmp_path):
    rng = random.Random(0)
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    for index in range(40):
        fmt = rng.choice(sorted(SEEDS))
        ops = [(rng.choice(["flip", "truncate", "insert", "length"]), rng.randrange(10**6), 9)]
        suffix = {"JPEG": "jpg"}.get(fmt, fmt.lower())
        (images / f"{index:02d}.{suffix}").write_bytes(_mutated(SEEDS[fmt], ops))
        Image.fromarray(MASK).save(masks / f"{index:02d}.png")
    manifest = tfshards.convert(
        images, masks, tmp_path / "out", on_error="skip", workers=2, progress=False
    )
    assert manifest.total_records + len(manifest.skipped) == 40
    assert all(s.reason for s in manifest.skipped)
    assert tfshards.verify(tmp_path / "out").ok


# ---- retries ------------------------------------------------------------------------------


def test_a_failed_conversion_never_blocks_the_obvious_retry(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 12, classes=3)
    out = tmp_path / "out"
    with pytest.raises(PairError, match="not below --num-classes 2"):
        tfshards.convert(images, masks, out, num_classes=2, workers=1, progress=False)
    assert not (out / "tfshards.json").exists()
    # the same command with the option fixed just works, without --resume or --overwrite
    tfshards.convert(images, masks, out, num_classes=3, workers=1, progress=False)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("train-")) == [
        "tfshards.json",
        "train.records",
    ], "a finished folder holds the shards, the table and the manifest, no lock or work folder"
    # a finished dataset is still protected from a plain rerun
    with pytest.raises(OutputError, match="holds a complete dataset"):
        tfshards.convert(images, masks, out, num_classes=3, workers=1, progress=False)


def test_resume_after_a_failure_with_unchanged_inputs(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 12)
    out = tmp_path / "out"
    reference = tfshards.convert(images, masks, tmp_path / "ref", workers=1, progress=False)
    (out / ".tfshards-work" / "done").mkdir(parents=True)  # as a killed run leaves it
    tfshards.convert(images, masks, out, resume=True, workers=1, progress=False)
    assert tfshards.Manifest.load(out).splits == reference.splits
    assert not (out / ".tfshards.lock").exists()


def test_memory_error_ends_the_job_and_resume_finishes_it(tmp_path, monkeypatch):
    from tfshards.converters import shard_job

    images, masks = write_pairs(tmp_path / "data", 12)
    out = tmp_path / "out"
    reference = tfshards.convert(images, masks, tmp_path / "ref", num_shards=3, workers=1,
                                 progress=False)  # fmt: skip
    real, calls = shard_job.prepare_pair, []

    def runs_out_of_memory(pair, options, channels, storage_options=None):
        calls.append(pair.key)
        if len(calls) == 6:  # in the second shard
            raise MemoryError("out of memory")
        return real(pair, options, channels, storage_options)

    monkeypatch.setattr(shard_job, "prepare_pair", runs_out_of_memory)
    with pytest.raises(MemoryError):  # not turned into a skipped pair
        tfshards.convert(images, masks, out, num_shards=3, on_error="skip", workers=1,
                         progress=False)  # fmt: skip
    assert not (out / "tfshards.json").exists() and not list(out.glob(".*.tmp"))
    monkeypatch.setattr(shard_job, "prepare_pair", real)
    resumed = tfshards.convert(images, masks, out, num_shards=3, on_error="skip", resume=True,
                               workers=1, progress=False)  # fmt: skip
    assert resumed.splits == reference.splits and not resumed.skipped
