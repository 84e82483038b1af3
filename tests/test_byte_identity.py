"""The same inputs and seed give the same shards, byte for byte, across versions of tfshards.

The hashes below were computed by the code as it was before the compact plan and ISA-L
(issue 19). Whatever the plan holds in memory, the split of each pair, the order of the
records and the cut into shards must not change. Compressed bytes depend on the
compressor: with ISA-L installed the deflate and gzip streams differ from zlib's, so those
are pinned by what they decode to (the records, inflated), and byte for byte with zlib.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tfshards import Manifest, convert
from tfshards.checks.shard_io import shard_examples
from tfshards.schemas import deflate
from tfshards.schemas.format import PIXEL_FORMATS


def _write_tree(root: Path) -> tuple[Path, Path]:
    """Pairs in nested folders, one orphan image, one non-image file."""
    rng = np.random.default_rng(19)
    images, masks = root / "images", root / "masks"
    for index in range(90):
        folder = ("a", "b/c", "")[index % 3]
        for base in (images, masks):
            (base / folder).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(8, 6, 3), dtype=np.uint8)
        labels = rng.integers(0, 4, size=(8, 6), dtype=np.uint8)
        stem = f"{folder}/{index:04d}" if folder else f"{index:04d}"
        Image.fromarray(pixels).save(images / f"{stem}.png")
        Image.fromarray(labels).save(masks / f"{stem}.png")
    Image.fromarray(pixels).save(images / "orphan.png")
    (masks / "notes.txt").write_text("not an image")
    return images, masks


def _convert(tmp_path: Path, name: str, **options) -> Path:
    images, masks = _write_tree(tmp_path / "data")
    out = tmp_path / name
    convert(
        images,
        masks,
        out,
        val_fraction=0.2,
        test_fraction=0.1,
        seed=7,
        allow_unpaired=True,
        workers=1,
        progress=False,
        **options,
    )
    return out


def _shard_hashes(out: Path) -> dict[str, str]:
    manifest = Manifest.load(out)
    found = {}
    for split in manifest.splits.values():
        for shard in split.shards:
            digest = hashlib.sha256((out / shard.file).read_bytes()).hexdigest()
            assert digest == shard.sha256
            found[shard.file] = digest[:32]
    return found


def _record_hashes(out: Path) -> dict[str, str]:
    """Per shard: a hash of its records' keys and decoded pixels, in record order."""
    manifest = Manifest.load(out)
    found = {}
    for split in manifest.splits.values():
        for shard in split.shards:
            digest = hashlib.sha256()
            for features in shard_examples(out / shard.file, manifest.compression.type):
                h, w, c = (features[f"image/{k}"] for k in ("height", "width", "channels"))
                image = PIXEL_FORMATS[features["image/format"].decode()].np_decode(
                    features["image/encoded"], h, w, c
                )
                mask = PIXEL_FORMATS[features["mask/format"].decode()].np_decode(
                    features["mask/encoded"], h, w, 1
                )
                digest.update(features["key"] + b"\0" + image.tobytes() + mask.tobytes())
            found[shard.file] = digest.hexdigest()[:32]
    return found


RAW_SHARDS = {
    "train-00000-of-00003.tfrecord": "b5c6dead158dc339a7eaff3791cb5a84",
    "train-00001-of-00003.tfrecord": "08eb041a98e1be0be752e599390fbee4",
    "train-00002-of-00003.tfrecord": "6011cb0dfdd6392e2bba6db571539de9",
    "val-00000-of-00001.tfrecord": "9f2fae9871fc29701ddc63b29d160771",
    "test-00000-of-00001.tfrecord": "d90475162b80eff9cbc6b2d393d39c63",
}
DEFLATE_RECORDS = {
    "train-00000-of-00007.tfrecord": "de9e62653ac7302be939de29e0b27d85",
    "train-00001-of-00007.tfrecord": "ecae9c54fda93beb0f8b3bf922b08be8",
    "train-00002-of-00007.tfrecord": "8fd83209363a2a3c535961e4a4a35d7c",
    "train-00003-of-00007.tfrecord": "89be944a7d9b575cfda86fc4eb70180a",
    "train-00004-of-00007.tfrecord": "4c388f4173d218b56fd304fc2cac6942",
    "train-00005-of-00007.tfrecord": "8c5779503eea8903a8eb4d22b91a7f7f",
    "train-00006-of-00007.tfrecord": "27259708d8aa569d6bb0b65c4b83847d",
    "val-00000-of-00002.tfrecord": "d0e7606f798ba1c822264c5b67ec03b3",
    "val-00001-of-00002.tfrecord": "3e950e771a35df071c246a86607b62a2",
    "test-00000-of-00001.tfrecord": "832973fafe71e74666d2591cdadb3e9e",
}
DEFLATE_ZLIB_SHARDS = {
    "train-00000-of-00007.tfrecord": "9e4e69a6b378c3b7c6c6de28d2363fe0",
    "train-00001-of-00007.tfrecord": "aca6f72c34c68e907b70e445dae8a7f3",
    "train-00002-of-00007.tfrecord": "419fa6109059393050d83ba535c95871",
    "train-00003-of-00007.tfrecord": "e6b13312232f9d916df5121c1cfe3165",
    "train-00004-of-00007.tfrecord": "dcc200e76761685f6efac1b765b32627",
    "train-00005-of-00007.tfrecord": "565125179775fe6c38b21dcb0613e274",
    "train-00006-of-00007.tfrecord": "4ab08eaa4647733ba19bb91b7d95e59d",
    "val-00000-of-00002.tfrecord": "9450bd2f461b33fa424dedcec10247c3",
    "val-00001-of-00002.tfrecord": "e7207cbca00e206a0525550605f72bb5",
    "test-00000-of-00001.tfrecord": "a05396409499b2e4fede6e0ac1ff433d",
}
GZIP_RECORDS = {
    "train-00000-of-00008.tfrecord.gz": "ac36b124b840e6add08b023a330c9ea6",
    "train-00001-of-00008.tfrecord.gz": "7f2a33684b831313dc41c1d891de6f05",
    "train-00002-of-00008.tfrecord.gz": "95f9d690bcb7af3e5e9bb491ede1e888",
    "train-00003-of-00008.tfrecord.gz": "cd65cb05332ab209a1f8c525f400d295",
    "train-00004-of-00008.tfrecord.gz": "95552ed5d14b6e425db42b0f7368385b",
    "train-00005-of-00008.tfrecord.gz": "be50e66f469632f6c5a9f58553af46db",
    "train-00006-of-00008.tfrecord.gz": "9484db17066a60551c8f3c102e7242a7",
    "train-00007-of-00008.tfrecord.gz": "3c3c6e5a7a2a7d8038e16cc886d2551f",
    "val-00000-of-00002.tfrecord.gz": "d0e7606f798ba1c822264c5b67ec03b3",
    "val-00001-of-00002.tfrecord.gz": "3e950e771a35df071c246a86607b62a2",
    "test-00000-of-00001.tfrecord.gz": "832973fafe71e74666d2591cdadb3e9e",
}


def test_raw_shards_are_byte_identical(tmp_path):
    out = _convert(tmp_path, "raw", encoding="raw", num_shards=3)
    assert _shard_hashes(out) == RAW_SHARDS


def test_deflate_records_are_identical(tmp_path):
    out = _convert(tmp_path, "deflate", shard_size=2000)
    assert _record_hashes(out) == DEFLATE_RECORDS


def test_deflate_shards_with_zlib_are_byte_identical(tmp_path, monkeypatch):
    monkeypatch.setattr(deflate, "isal_zlib", None)  # as on a platform without isal wheels
    out = _convert(tmp_path, "deflate", shard_size=2000)
    assert _shard_hashes(out) == DEFLATE_ZLIB_SHARDS


def test_the_zlib_option_gives_zlibs_bytes_where_isal_is_installed(tmp_path):
    if deflate.isal_zlib is None:
        pytest.skip("isal has no wheel for this platform")
    out = _convert(tmp_path, "deflate", shard_size=2000, deflate_library="zlib")
    assert _shard_hashes(out) == DEFLATE_ZLIB_SHARDS
    assert Manifest.load(out).options["deflate_library"] == "zlib"


def test_the_deflate_library_is_chosen_per_thread_and_restored():
    pixels = np.arange(4096, dtype=np.uint8) % 7
    with deflate.library("zlib"):
        assert deflate.compress(pixels, 1) == zlib.compress(pixels, 1)
    if deflate.isal_zlib is not None:  # after the block: ISA-L again
        assert deflate.compress(pixels, 1) == deflate.isal_zlib.compress(pixels, deflate.ISAL_LEVEL)
    with pytest.raises(ValueError, match="one of auto, isal, zlib"), deflate.library("zstd"):
        pass


def test_gzip_shards_hold_identical_records(tmp_path):
    out = _convert(tmp_path, "gzip", encoding="keep", compression="gzip", shard_size=3000)
    assert _record_hashes(out) == GZIP_RECORDS
