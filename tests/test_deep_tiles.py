"""Tiles of 16-bit and multi-band images (issue 46, points 1 and 2 together): windows of
tiled TIFFs of many bands, memory-mapped ``.npy`` files (bands first or last) and
multi-page TIFFs, each tile the source's window bit for bit, stitched back whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

import tfshards
from tfshards.converters.pairing import Pair
from tfshards.converters.validation import image_layout

RUN = {"workers": 1, "progress": False}
HEIGHT, WIDTH, BANDS = 70, 100, 13


def _scene(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 65536, (HEIGHT, WIDTH, BANDS), np.uint16)


def _labels(scene: np.ndarray) -> np.ndarray:
    return (scene[:, :, 3] // 22000).astype(np.uint8)  # 3 classes


def _write(root: Path, kind: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Three pairs whose images are stored as ``kind``; {key: (image [H, W, C], mask)}."""
    (root / "images").mkdir(parents=True), (root / "masks").mkdir(parents=True)
    sources = {}
    for index in range(3):
        key, scene = f"{index:03d}", _scene(index)
        if kind == "tiled tiff":
            tifffile.imwrite(root / f"images/{key}.tif", scene, tile=(16, 16),
                             photometric="minisblack", planarconfig="contig",
                             compression="zlib")  # fmt: skip
        elif kind == "planar tiff":
            tifffile.imwrite(root / f"images/{key}.tif", np.moveaxis(scene, -1, 0),
                             photometric="minisblack", planarconfig="separate")  # fmt: skip
        elif kind == "multi-page tiff":
            with tifffile.TiffWriter(root / f"images/{key}.tif") as tiff:
                for band in range(BANDS):
                    tiff.write(scene[:, :, band], photometric="minisblack", metadata=None)
        elif kind == "bands-first npy":
            np.save(root / f"images/{key}.npy", np.moveaxis(scene, -1, 0))
        else:
            np.save(root / f"images/{key}.npy", scene)
        Image.fromarray(_labels(scene)).save(root / f"masks/{key}.png")
        sources[key] = (scene, _labels(scene))
    return sources


@pytest.mark.parametrize(
    "kind", ["tiled tiff", "planar tiff", "multi-page tiff", "bands-first npy", "npy"]
)
def test_tiles_of_multi_band_16_bit_images_are_their_windows(tmp_path, kind):
    sources = _write(tmp_path / "data", kind)
    out = tmp_path / "out"
    manifest = tfshards.convert(tmp_path / "data/images", tmp_path / "data/masks", out,
                                tile_size=32, tile_overlap=8, num_classes=3, val_fraction=0.0,
                                **RUN)  # fmt: skip
    assert (manifest.image.channels, manifest.image.dtype) == (BANDS, "uint16")
    assert manifest.splits["train"].records == 3 * 3 * 4
    for key, (scene, labels) in sources.items():
        tiles = tfshards.tiles(out, source=key)
        stitcher = tfshards.Stitcher(tiles.height, tiles.width, classes=3)
        for tile in tiles:
            assert tile.image.dtype == np.uint16
            assert np.array_equal(tile.image, scene[tile.window.slices])
            stitcher.add(tile.window, tile.mask)
        assert np.array_equal(stitcher.finish(), labels)
    batch, _ = next(iter(tfshards.read(out, batch_size=4, image_dtype="uint16")))
    assert batch.dtype == "uint16" and tuple(batch.shape) == (4, 32, 32, BANDS)
    assert tfshards.verify(out).ok


def test_a_large_tiffs_bands_and_type_come_from_its_tags_not_its_pixels(tmp_path):
    """The first image's layout is read from its tags: a slide is not decoded for it (here
    every compressed tile is overwritten with zeros, and the layout is still found)."""
    path = tmp_path / "scene.tif"
    tifffile.imwrite(path, _scene(0), tile=(16, 16), photometric="minisblack",
                     planarconfig="contig", compression="zlib")  # fmt: skip
    with tifffile.TiffFile(path) as tiff:
        page = tiff.pages.first
        segments = list(zip(page.dataoffsets, page.databytecounts, strict=True))
    data = bytearray(path.read_bytes())
    for offset, count in segments:
        data[offset : offset + count] = bytes(count)
    path.write_bytes(bytes(data))
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever zlib says of zeros
        tifffile.imread(path)
    pair = Pair("scene", path, tmp_path / "mask.png")
    assert image_layout(pair) == (BANDS, "uint16")


def test_a_pyramids_reduced_levels_are_not_read_as_bands(tmp_path):
    """A slide's reduced levels (pages of other sizes after the first) are not bands: the
    first page is tiled by windows, and the levels are never decoded."""
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True), (root / "masks").mkdir()
    rgb = np.random.default_rng(0).integers(0, 256, (HEIGHT, WIDTH, 3), np.uint8)
    with tifffile.TiffWriter(root / "images/slide.tif") as tiff:
        tiff.write(rgb, tile=(16, 16), photometric="rgb", metadata=None)
        tiff.write(rgb[::2, ::2], tile=(16, 16), photometric="rgb", metadata=None)
        tiff.write(rgb[::4, ::4], photometric="rgb", metadata=None)
    labels = (rgb[:, :, 0] // 100).astype(np.uint8)
    Image.fromarray(labels).save(root / "masks/slide.png")
    out = tmp_path / "out"
    limit = HEIGHT * WIDTH  # under the first page's 3 bytes a pixel: it must be read by windows
    tfshards.convert(root / "images", root / "masks", out, tile_size=32, tile_overlap=8,
                     num_classes=3, val_fraction=0.0, decode_limit=limit, **RUN)  # fmt: skip
    tiles = tfshards.tiles(out, source="slide")
    assert (tiles.height, tiles.width, len(tiles)) == (HEIGHT, WIDTH, 12)
    for tile in tiles:
        assert np.array_equal(tile.image, rgb[tile.window.slices])
