"""Shared fixtures: tiny synthetic datasets written into tmp_path, and the real membrane data."""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

pytest_plugins = ["s3_server"]

MEMBRANE = Path(__file__).resolve().parents[2] / "shared" / "data" / "membrane"
# A session whose process has not ended this long after its last test is hung at exit.
EXIT_HANG_SECONDS = 120


def pytest_unconfigure(config: pytest.Config) -> None:
    """A hang at exit (a thread that never ends, a lock never released) prints every
    thread's stack and fails the run, instead of waiting for CI's time limit: pytest-timeout
    only watches the tests, and one such hang cost a whole CI run (issue 44)."""
    faulthandler.dump_traceback_later(EXIT_HANG_SECONDS, exit=True)


def write_pairs(
    root: Path,
    count: int = 12,
    *,
    size: tuple[int, int] = (24, 32),
    channels: int = 3,
    classes: int = 3,
    image_format: str = "png",
    mask_mode: str = "L",
    seed: int = 0,
) -> tuple[Path, Path]:
    """Write ``count`` random pairs to root/images and root/masks; return both folders."""
    rng = np.random.default_rng(seed)
    images, masks = root / "images", root / "masks"
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    height, width = size
    suffix = "jpg" if image_format == "jpeg" else image_format
    for index in range(count):
        # Smooth content plus mild noise: realistic for JPEG, still exact for lossless checks.
        coarse = rng.integers(0, 256, size=(4, 4, channels), dtype=np.uint8)
        smooth = np.asarray(
            Image.fromarray(coarse[:, :, 0] if channels == 1 else coarse).resize(
                (width, height), Image.Resampling.BILINEAR
            )
        )
        noise = rng.integers(0, 8, size=smooth.shape, dtype=np.uint8)
        pixels = np.clip(smooth.astype(int) + noise, 0, 255).astype(np.uint8)
        pixels = pixels.reshape(height, width, channels)
        image = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
        image.save(images / f"{index:03d}.{suffix}")
        labels = rng.integers(0, classes, size=(height, width), dtype=np.uint8)
        mask = Image.fromarray(labels)
        if mask_mode == "P":
            mask = mask.convert("P")
            mask.putpalette([(37 * i) % 256 for i in range(768)])
        mask.save(masks / f"{index:03d}.png")
    return images, masks


@pytest.fixture
def pairs_dir(tmp_path: Path) -> tuple[Path, Path]:
    return write_pairs(tmp_path / "data")


def read_records(out: Path, split: str = "train") -> list[dict]:
    """Every record of a split, parsed and decoded with plain TensorFlow, in manifest order."""
    import tensorflow as tf

    from tfshards.schemas import Manifest
    from tfshards.schemas.format import COMPRESSIONS, PIXEL_FORMATS
    from tfshards.schemas.record import tf_feature_spec

    manifest = Manifest.load(out)
    compression = COMPRESSIONS[manifest.compression.type].tf_name
    files = [str(out / shard.file) for shard in manifest.splits[split].shards]
    records = []
    for serialized in tf.data.TFRecordDataset(files, compression_type=compression):
        tf.train.Example.FromString(serialized.numpy())  # a plain tf.train.Example
        parsed = tf.io.parse_single_example(serialized, tf_feature_spec())
        h, w, c = (int(parsed[f"image/{k}"]) for k in ("height", "width", "channels"))
        image_format = PIXEL_FORMATS[parsed["image/format"].numpy().decode()]
        mask_format = PIXEL_FORMATS[parsed["mask/format"].numpy().decode()]
        records.append(
            {
                "key": parsed["key"].numpy().decode(),
                "image_format": parsed["image/format"].numpy().decode(),
                "mask_format": parsed["mask/format"].numpy().decode(),
                "image": image_format.tf_decode(parsed["image/encoded"], h, w, c).numpy(),
                "mask": mask_format.tf_decode(parsed["mask/encoded"], h, w, 1).numpy()[:, :, 0],
            }
        )
    return records


def shard_bytes(out: Path) -> dict[str, bytes]:
    """Every shard file, per-record table and the manifest, by name (for byte-identity
    checks)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(out.iterdir())
        if p.name.endswith((".tfrecord", ".gz", ".zz", ".json", ".records"))
        and not p.name.startswith(".")
    }


def convert_args(images: Path, masks: Path, out: Path) -> list[str]:
    """The start of a quiet `tfshards convert` command line, for CLI tests."""
    return ["-q", "convert", "--images", str(images), "--masks", str(masks), "--out", str(out)]


def run_json_script(code: str, *args: object, timeout: int = 240):
    """Run ``code`` in a fresh Python with this checkout first on the path; the JSON its
    last line of output holds (tests that resume an iterator in a new process)."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def mixed_sizes(root: Path) -> Path:
    """Shards of 12 records of four sizes; each mask is 1 where the image is bright."""
    import tfshards

    rng = np.random.default_rng(2)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for index, (height, width) in enumerate([(20, 32), (40, 24), (12, 12), (32, 48)] * 3):
        cells = rng.integers(0, 2, (height // 4, width // 4), dtype=np.uint8)
        blocks = np.kron(cells, np.ones((4, 4), np.uint8))
        Image.fromarray(blocks * 255).save(root / "images" / f"{index:02d}.png")
        Image.fromarray(blocks).save(root / "masks" / f"{index:02d}.png")
    out = root / "shards"
    tfshards.convert(
        root / "images", root / "masks", out, num_classes=2, num_shards=2, workers=1,
        progress=False,
    )  # fmt: skip
    assert tfshards.Manifest.load(out).image_shape is None
    return out
