"""Tiles at conversion, tfshards.tiles and the Stitcher (issue 46, points 2 and 4):
geometry, records holding their windows, TIFFs read by windows, errors naming the file,
crash safety and --resume, and stitching the tiles' own masks back bit for bit."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import tifffile
from conftest import MEMBRANE, shard_bytes, write_pairs
from PIL import Image

import tfshards
from tfshards.cli import main
from tfshards.converters import tiling
from tfshards.errors import (
    OptionsError,
    OutputError,
    PairError,
    RecordTableError,
    StitchError,
)
from tfshards.schemas.record import decode_record
from tfshards.schemas.tfrecord import parse_example
from tfshards.schemas.tiles import Window, axis_starts, grid_windows, tile_key, tile_position

RUN = {"workers": 1, "progress": False}


# -- geometry ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "tile", "overlap", "starts"),
    [
        (100, 32, 8, [0, 24, 48, 68]),  # the last shifted inward to end at the edge
        (70, 32, 8, [0, 24, 38]),
        (96, 32, 0, [0, 32, 64]),  # an exact fit: no shifted tile
        (32, 32, 8, [0]),
        (20, 32, 8, [0]),  # shorter than the tile: one tile of its own length
        (33, 32, 31, [0, 1]),
    ],
)
def test_axis_starts_cover_the_axis_and_shift_the_last_tile_inward(length, tile, overlap, starts):
    assert axis_starts(length, tile, overlap) == starts


@pytest.mark.parametrize(("height", "width", "tile", "overlap"), [(70, 100, 32, 8), (5, 300, 64, 0),
                         (257, 129, 64, 63), (1, 1, 8, 0)])  # fmt: skip
def test_grid_windows_cover_every_pixel_inside_the_image(height, width, tile, overlap):
    covered = np.zeros((height, width), np.int64)
    windows = grid_windows(height, width, tile, overlap)
    for window in windows:
        assert window.bottom <= height and window.right <= width
        assert (window.height, window.width) == (min(tile, height), min(tile, width))
        covered[window.slices] += 1
    assert covered.min() >= 1
    assert windows == sorted(windows, key=lambda w: (w.row, w.column))  # grid order


def test_tile_keys_name_their_source_and_window():
    window = Window(24, 68, 32, 32)
    assert tile_key("a/b@r1_c2", window) == "a/b@r1_c2@r24_c68"
    assert tile_position("a/b@r1_c2@r24_c68") == ("a/b@r1_c2", 24, 68)
    assert tile_position("a/b") is None


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"tile_size": 32, "tile_overlap": 32}, "tile_overlap must be smaller than tile_size"),
        ({"tile_size": 32, "tile_overlap": 40}, "overlap 40 for tiles of 32"),
        ({"tile_overlap": 8}, "needs a tile_size"),
        ({"tile_size": 0}, "tile_size must be an integer of at least 1"),
        ({"tile_size": 32, "tile_smaller": "pad"}, "tile_smaller must be one of keep, fail"),
        ({"tile_size": 32, "resize": (16, 16)}, "tile_size and resize exclude each other"),
        ({"decode_limit": 0}, "decode_limit must be"),
    ],
)
def test_tile_options_are_checked_before_anything_is_written(tmp_path, settings, match):
    images, masks = write_pairs(tmp_path / "data", 2, size=(70, 100))
    with pytest.raises(OptionsError, match=match):
        tfshards.convert(images, masks, tmp_path / "out", **settings, **RUN)
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_an_overlap_not_smaller_than_the_tile(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 2, size=(70, 100))
    argv = ["-q", "convert", "--images", str(images), "--masks", str(masks),
            "--out", str(tmp_path / "out"), "--tile", "32", "--overlap", "32"]  # fmt: skip
    assert main(argv) == 2
    assert "tile_overlap must be smaller than tile_size" in capsys.readouterr().err


# -- conversion ----------------------------------------------------------------------------


def _records(out: Path, split: str = "train") -> list[dict]:
    """Every record's features of a split, in manifest order (pure Python)."""
    from tfshards.schemas.manifest import Manifest
    from tfshards.schemas.tfrecord import iter_records

    found = []
    for shard in Manifest.load(out).splits[split].shards:
        with open(out / shard.file, "rb") as stream:
            found += [parse_example(data) for data in iter_records(stream)]
    return found


def _source(folder: Path, key: str) -> np.ndarray:
    path = next(folder.glob(f"{key}.*"))
    return tifffile.imread(path) if path.suffix == ".tif" else np.asarray(Image.open(path))


def _check_tiles_are_windows(out: Path, images: Path, masks: Path, tile: int, overlap: int):
    """Every record is a window of its source, its key and features saying which one, and
    each source's tiles are its grid, in order."""
    by_source: dict[str, list[Window]] = {}
    for features in _records(out):
        record = decode_record(features)
        source = features["source/key"].decode()
        window = Window(features["source/row"], features["source/column"],
                        features["image/height"], features["image/width"])  # fmt: skip
        assert record.key == tile_key(source, window)
        image, mask = _source(images, source), _source(masks, source)
        assert np.array_equal(
            record.image.reshape(image[window.slices].shape), image[window.slices]
        )
        assert np.array_equal(record.mask, mask[window.slices])
        by_source.setdefault(source, []).append(window)
    for source, windows in by_source.items():
        height, width = _source(masks, source).shape
        assert sorted(windows, key=lambda w: (w.row, w.column)) == grid_windows(
            height, width, tile, overlap
        )
    return by_source


@pytest.mark.parametrize(("image_format", "channels"), [("png", 3), ("jpeg", 3), ("png", 1),
                                                        ("png", 4)])  # fmt: skip
def test_convert_cuts_every_pair_into_tiles_holding_their_windows(tmp_path, image_format,
                                                                  channels):  # fmt: skip
    images, masks = write_pairs(tmp_path / "data", 5, size=(70, 100), image_format=image_format,
                                channels=channels)  # fmt: skip
    manifest = tfshards.convert(images, masks, tmp_path / "out", tile_size=32, tile_overlap=8,
                                num_classes=3, val_fraction=0.3, seed=1, channels=channels,
                                **RUN)  # fmt: skip
    per_image = 3 * 4  # rows 0, 24, 38; columns 0, 24, 48, 68
    assert sum(split.records for split in manifest.splits.values()) == 5 * per_image
    assert manifest.options["tile_size"] == 32 and manifest.options["tile_overlap"] == 8
    by_source = _check_tiles_are_windows(tmp_path / "out", images, masks, 32, 8)
    train = tfshards.records(tmp_path / "out", "train", progress=False)
    assert len(train) == len(by_source) * per_image  # a source's tiles share its split
    assert tfshards.verify(tmp_path / "out").ok


def test_tiffs_tiled_striped_bigtiff_and_compressed_are_read_by_windows(tmp_path):
    rng = np.random.default_rng(0)
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir(), masks.mkdir()
    layouts = {
        "tiled": {"tile": (16, 16)},
        "tiled_zlib_big": {"tile": (32, 16), "compression": "zlib", "bigtiff": True},
        "striped": {"rowsperstrip": 7},
        "striped_zlib": {"rowsperstrip": 5, "compression": "zlib"},
        "one_strip": {},
    }
    for name, layout in layouts.items():
        image = rng.integers(0, 256, (70, 100, 3), np.uint8)
        tifffile.imwrite(images / f"{name}.tif", image, photometric="rgb", **layout)
        tifffile.imwrite(masks / f"{name}.tif", rng.integers(0, 3, (70, 100), np.uint8), **layout)
    tfshards.convert(images, masks, tmp_path / "out", tile_size=32, tile_overlap=8,
                     num_classes=3, **RUN)  # fmt: skip
    assert len(_check_tiles_are_windows(tmp_path / "out", images, masks, 32, 8)) == 5


def test_a_tiff_image_with_a_png_mask_and_gray_tiff_images(tmp_path):
    rng = np.random.default_rng(1)
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir(), masks.mkdir()
    tifffile.imwrite(images / "a.tif", rng.integers(0, 256, (70, 100), np.uint8), tile=(16, 16))
    Image.fromarray(rng.integers(0, 2, (70, 100), np.uint8)).save(masks / "a.png")
    tfshards.convert(images, masks, tmp_path / "out", tile_size=32, channels=1, **RUN)
    _check_tiles_are_windows(tmp_path / "out", images, masks, 32, 0)


def _converted_tiff(path: Path, mode: str) -> None:
    rng = np.random.default_rng(0)
    if mode == "min-is-white":
        tifffile.imwrite(path, rng.integers(0, 255, (30, 40), np.uint8), photometric="miniswhite")
        return
    if mode == "premultiplied":  # RGBA of associated alpha
        rgba = rng.integers(0, 255, (30, 40, 4), np.uint8)
        tifffile.imwrite(path, rgba, tile=(16, 16), extrasamples=["assocalpha"])
        return
    rgb = Image.fromarray(rng.integers(0, 255, (30, 40, 3), np.uint8))
    (rgb.convert(mode, palette=Image.Palette.ADAPTIVE) if mode == "P" else rgb.convert(mode)).save(
        path
    )


@pytest.mark.parametrize("mode", ["P", "CMYK", "1", "LA", "min-is-white", "premultiplied"])
def test_tiffs_pillow_converts_are_tiled_as_their_whole_records(tmp_path, mode):
    """Palette, CMYK, bilevel, gray-and-alpha, min-is-white and premultiplied RGBA TIFFs:
    their stored samples are not their pixels (palette indices were stored as gray, C, M,
    Y as R, G, B)."""
    for folder in ("images", "masks"):
        (tmp_path / folder).mkdir()
    _converted_tiff(tmp_path / "images" / "000.tif", mode)
    Image.fromarray(np.zeros((30, 40), np.uint8)).save(tmp_path / "masks" / "000.png")
    images, masks = tmp_path / "images", tmp_path / "masks"
    tfshards.convert(images, masks, tmp_path / "whole", **RUN)
    tfshards.convert(images, masks, tmp_path / "tiled", tile_size=64, **RUN)
    whole, tiled = tfshards.Pairs(tmp_path / "whole")[0], tfshards.Pairs(tmp_path / "tiled")[0]
    assert np.array_equal(whole[0], tiled[0]) and np.array_equal(whole[1], tiled[1])


def test_a_palette_tiff_mask_is_read_by_windows_as_its_class_indices(tmp_path):
    """A mask's palette indices are its classes (as Pillow reads them whole): read by
    windows, not decoded whole within the decode limit as a palette image is."""
    from tfshards.converters.windows import header

    images, masks = _tiff_pairs(tmp_path / "data", 1, tile=(16, 16))
    classes = tifffile.imread(masks / "000.tif")
    palette = Image.fromarray(classes, "P")
    palette.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0])
    palette.save(masks / "000.tif", tiffinfo={322: 16, 323: 16})  # tiled, 16x16
    assert header(masks / "000.tif", mask=True)[2] and not header(masks / "000.tif")[2]
    tfshards.convert(images, masks, tmp_path / "whole", num_classes=3, **RUN)
    tfshards.convert(images, masks, tmp_path / "tiled", num_classes=3, tile_size=32, **RUN)
    tiles = tfshards.tiles(tmp_path / "tiled", source="000")
    stitched = np.zeros_like(classes)
    for tile in tiles:
        stitched[tile.window.slices] = tile.mask
    assert np.array_equal(stitched, classes)
    assert np.array_equal(tfshards.Pairs(tmp_path / "whole")[0][1][:, :, 0], classes)


def test_jpeg_tiffs_of_slide_scanners_stay_read_by_windows(tmp_path):
    """RGB or YCbCr samples compressed as JPEG are decoded to RGB by tifffile (with
    imagecodecs), as by Pillow: read by windows, not decoded whole within the limit."""
    from tfshards.converters.windows import header

    path = tmp_path / "slide.tif"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(path, compression="jpeg")
    assert header(path) == (64, 64, True)  # photometric RGB
    with tifffile.TiffFile(path) as tiff:
        tag = tiff.pages.first.tags["PhotometricInterpretation"]
        where, size = tag.valueoffset, tag.dtype  # the value, in the entry
    data = bytearray(path.read_bytes())
    assert size == 3 and data[where] == 2  # SHORT, little-endian: RGB
    data[where] = 6  # YCbCr
    path.write_bytes(bytes(data))
    assert header(path) == (64, 64, True)


def test_an_image_smaller_than_the_tile_is_one_tile_or_fails_when_asked(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 2, size=(20, 100))
    tfshards.convert(images, masks, tmp_path / "keep", tile_size=32, **RUN)
    windows = _check_tiles_are_windows(tmp_path / "keep", images, masks, 32, 0)
    assert {(w.height, w.width) for ws in windows.values() for w in ws} == {(20, 32)}
    with pytest.raises(PairError, match=r"000\.png: image is 20x100 \(HxW\), smaller than the "
                       r"tile size 32 \(--tile-smaller fail\)"):  # fmt: skip
        tfshards.convert(images, masks, tmp_path / "fail", tile_size=32, tile_smaller="fail",
                         **RUN)  # fmt: skip
    assert not (tmp_path / "fail" / "tfshards.json").exists()


def test_tiles_of_the_real_membrane_images(tmp_path):
    if not MEMBRANE.is_dir():
        pytest.skip("../shared/data/membrane is absent (a fresh clone)")
    images, masks = tmp_path / "image", tmp_path / "label"
    images.mkdir(), masks.mkdir()
    for name in ("0.png", "1.png"):
        os.symlink(MEMBRANE / "image" / name, images / name)
        os.symlink(MEMBRANE / "label" / name, masks / name)
    tfshards.convert(images, masks, tmp_path / "out", tile_size=200, tile_overlap=24,
                     binary_masks=True, **RUN)  # fmt: skip
    tiles = tfshards.tiles(tmp_path / "out", source="1")
    assert (tiles.height, tiles.width, len(tiles)) == (512, 512, 9)
    stitcher = tfshards.Stitcher(512, 512, classes=2)
    for tile in tiles:
        stitcher.add(tile.window, tile.mask)
    expected = (np.asarray(Image.open(MEMBRANE / "label" / "1.png")) > 0).astype(np.uint8)
    assert np.array_equal(stitcher.finish(), expected)


# -- errors, crash safety, --resume --------------------------------------------------------


def _tiff_pairs(root: Path, count: int, size=(70, 100), **layout) -> tuple[Path, Path]:
    rng = np.random.default_rng(2)
    images, masks = root / "images", root / "masks"
    images.mkdir(parents=True), masks.mkdir(parents=True)
    for index in range(count):
        image = rng.integers(0, 256, (*size, 3), np.uint8)
        tifffile.imwrite(images / f"{index:03d}.tif", image, photometric="rgb", **layout)
        tifffile.imwrite(masks / f"{index:03d}.tif", rng.integers(0, 3, size, np.uint8), **layout)
    return images, masks


def _nothing_published(out: Path) -> None:
    """No manifest (the dataset does not look complete) and no temporary shard left."""
    assert not (out / "tfshards.json").exists()
    assert not list(out.glob(".*.tmp"))


def test_an_image_and_mask_of_different_sizes_name_the_mask(tmp_path):
    images, masks = _tiff_pairs(tmp_path / "data", 3, tile=(16, 16))
    tifffile.imwrite(masks / "001.tif", np.zeros((70, 99), np.uint8))
    with pytest.raises(PairError, match=r"001\.tif: mask is 70x99 \(HxW\) but image .*001\.tif "
                       r"is 70x100"):  # fmt: skip
        tfshards.convert(images, masks, tmp_path / "out", tile_size=32, **RUN)
    _nothing_published(tmp_path / "out")
    skipped = tfshards.convert(images, masks, tmp_path / "skip", tile_size=32, on_error="skip",
                               **RUN)  # fmt: skip
    assert [s.key for s in skipped.skipped] == ["001"]
    assert skipped.splits["train"].records == 2 * 12


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda data: b"II*\x00" + b"\xff" * 60, r"not a readable TIFF"),
        (
            lambda data: data[: len(data) // 2],
            r"truncated: a segment ends at byte \d+, past the "
            r"file's end|not a readable TIFF",
        ),  # fmt: skip
        (lambda data: b"", r"not a readable TIFF"),
    ],
)
def test_corrupt_and_truncated_tiffs_fail_their_pair_before_a_tile_is_written(
    tmp_path, damage, match
):
    images, masks = _tiff_pairs(tmp_path / "data", 3, tile=(16, 16), compression="zlib")
    bad = images / "002.tif"
    bad.write_bytes(damage(bad.read_bytes()))
    with pytest.raises(PairError, match=r"pair '002': image file .*002\.tif: " + f"({match})"):
        tfshards.convert(images, masks, tmp_path / "out", tile_size=32, **RUN)
    _nothing_published(tmp_path / "out")
    done = tfshards.convert(images, masks, tmp_path / "skip", tile_size=32, on_error="skip",
                            **RUN)  # fmt: skip
    assert [s.key for s in done.skipped] == ["002"] and done.splits["train"].records == 24


def test_a_truncated_tiff_is_refused_by_its_segment_table(tmp_path):
    images, masks = _tiff_pairs(tmp_path / "data", 1, size=(64, 64), tile=(16, 16))
    data = (images / "000.tif").read_bytes()
    # tifffile writes the header and tags first: cutting the last pixels keeps them readable
    (images / "000.tif").write_bytes(data[:-100])
    with pytest.raises(PairError, match=r"truncated: a segment ends at byte \d+, past the file's "
                       r"end \(\d+ bytes\)"):  # fmt: skip
        tfshards.convert(images, masks, tmp_path / "out", tile_size=32, **RUN)


def test_a_corrupt_segment_after_tiles_were_written_fails_the_shard_even_with_skip(tmp_path):
    images, masks = _tiff_pairs(tmp_path / "data", 1, size=(64, 64), tile=(16, 16),
                                compression="zlib")  # fmt: skip
    good = (images / "000.tif").read_bytes()
    with tifffile.TiffFile(images / "000.tif") as tiff:
        page = tiff.pages.first
        offset, count = page.dataoffsets[-1], page.databytecounts[-1]  # the bottom-right tile
    data = bytearray(good)
    data[offset : offset + count] = b"\x00" * count
    (images / "000.tif").write_bytes(bytes(data))
    with pytest.raises(PairError, match=r"segment 15 does not decode .* 3 of its tiles were "
                       r"written before, so it cannot be skipped: .* convert again with "
                       r"--overwrite"):  # fmt: skip
        tfshards.convert(images, masks, tmp_path / "out", tile_size=32, on_error="skip", **RUN)
    _nothing_published(tmp_path / "out")
    # as the error says: a fixed file is a changed input, which --resume refuses
    (images / "000.tif").write_bytes(good)
    with pytest.raises(OutputError, match="inputs or options changed"):
        tfshards.convert(images, masks, tmp_path / "out", tile_size=32, resume=True, **RUN)
    tfshards.convert(images, masks, tmp_path / "out", tile_size=32, overwrite=True, **RUN)


def test_a_png_over_the_decode_limit_is_refused_before_decoding_naming_the_limit(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 2, size=(70, 100))
    limit = r"takes 21000 bytes, over the decode limit of 20000 bytes \(--decode-limit"
    with pytest.raises(PairError, match=r"000\.png: 70x100 \(HxW\) decoded at once " + limit):
        tfshards.convert(images, masks, tmp_path / "out", tile_size=32, decode_limit=20000,
                         **RUN)  # fmt: skip
    # the same pixels as a tiled TIFF are read by windows, within any limit
    tiffs, tiff_masks = _tiff_pairs(tmp_path / "tiffs", 2, tile=(16, 16))
    tfshards.convert(tiffs, tiff_masks, tmp_path / "tiff-out", tile_size=32, decode_limit=20000,
                     **RUN)  # fmt: skip
    # a TIFF of one strip is decoded whole: the limit applies
    one_strip, one_strip_masks = _tiff_pairs(tmp_path / "strip", 1, rowsperstrip=70)
    with pytest.raises(PairError, match=r"000\.tif: 70x100 \(HxW\) decoded at once"):
        tfshards.convert(one_strip, one_strip_masks, tmp_path / "strip-out", tile_size=32,
                         decode_limit=20000, **RUN)  # fmt: skip


def test_resume_finishes_an_interrupted_tiled_conversion_with_the_same_bytes(tmp_path):
    images, masks = _tiff_pairs(tmp_path / "data", 6, tile=(16, 16), compression="zlib")
    settings = {"tile_size": 32, "tile_overlap": 8, "num_shards": 3, "num_classes": 3, **RUN}
    tfshards.convert(images, masks, tmp_path / "ref", **settings)
    # A read error in the last shard (a segment's bytes zeroed, size and mtime kept: to
    # --resume the inputs are unchanged), after the others were written.
    last = tfshards.records(tmp_path / "ref", progress=False).keys[-1]
    path = images / f"{tile_position(last)[0]}.tif"
    good, stat = path.read_bytes(), path.stat()
    with tifffile.TiffFile(path) as tiff:
        offset, count = tiff.pages.first.dataoffsets[0], tiff.pages.first.databytecounts[0]
    path.write_bytes(good[:offset] + b"\x00" * count + good[offset + count :])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(PairError, match=rf"{path.name}: segment 0 does not decode"):
        tfshards.convert(images, masks, tmp_path / "out", **settings)
    _nothing_published(tmp_path / "out")
    assert len(list((tmp_path / "out" / ".tfshards-work" / "done").iterdir())) == 2
    path.write_bytes(good)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    resumed = tfshards.convert(images, masks, tmp_path / "out", resume=True, **settings)
    reference = tfshards.convert(images, masks, tmp_path / "ref", overwrite=True, **settings)
    assert resumed.splits == reference.splits
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "ref")


def test_resume_after_raising_the_decode_limit_reuses_the_shards_written(tmp_path):
    """The decode-limit error says to raise the limit; --resume then refused the change."""
    images, masks = _tiff_pairs(tmp_path / "data", 6, tile=(16, 16))
    settings = {"tile_size": 32, "num_shards": 3, "num_classes": 3, **RUN}
    tfshards.convert(images, masks, tmp_path / "ref", **settings)
    source = tile_position(tfshards.records(tmp_path / "ref", progress=False).keys[-1])[0]
    tiff = images / f"{source}.tif"  # the last shard's image, as a PNG: decoded whole
    Image.fromarray(tifffile.imread(tiff)).save(images / f"{source}.png")
    tiff.unlink()
    tfshards.convert(images, masks, tmp_path / "ref", overwrite=True, **settings)
    with pytest.raises(PairError, match="over the decode limit of 20000 bytes"):
        tfshards.convert(images, masks, tmp_path / "out", decode_limit=20000, **settings)
    assert len(list((tmp_path / "out" / ".tfshards-work" / "done").iterdir())) == 2
    resumed = tfshards.convert(images, masks, tmp_path / "out", resume=True, **settings)
    assert resumed.splits == tfshards.Manifest.load(tmp_path / "ref").splits
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "ref")


def test_an_image_over_pillows_limit_is_tiled_without_tile_size_with_a_message(
    tmp_path, monkeypatch, caplog
):
    images, masks = write_pairs(tmp_path / "data", 2, size=(70, 100))
    tiffs, tiff_masks = _tiff_pairs(tmp_path / "tiffs", 1, tile=(16, 16))
    os.rename(tiffs / "000.tif", images / "big.tif")
    os.rename(tiff_masks / "000.tif", masks / "big.tif")
    Image.fromarray(np.zeros((30, 30), np.uint8)).save(images / "small.png")
    Image.fromarray(np.zeros((30, 30), np.uint8)).save(masks / "small.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 70x100 is "too large" now
    monkeypatch.setattr(tiling, "AUTO_TILE", 32)
    with caplog.at_level(logging.WARNING, logger="tfshards"):
        tfshards.convert(images, masks, tmp_path / "out", channels=3, **RUN)
    assert (
        "3 images over Pillow's pixel limit (1000 pixels) would not fit one record" in caplog.text
    )
    keys = list(tfshards.records(tmp_path / "out", progress=False).keys)
    assert sorted(k for k in keys if "@" not in k) == ["small"]  # whole, as before
    for source in ("000", "001", "big"):  # PNGs (refused by Pillow) and the TIFF (its header)
        assert len(tfshards.tiles(tmp_path / "out", source=source)) == 3 * 4


# -- tfshards.tiles and the Stitcher -------------------------------------------------------


@pytest.fixture
def tiled(tmp_path) -> tuple[Path, Path, Path]:
    """Five 70x100 pairs, tiles of 32 overlapping by 8 (edge tiles shifted inward)."""
    images, masks = write_pairs(tmp_path / "data", 5, size=(70, 100), classes=4)
    tfshards.convert(images, masks, tmp_path / "out", tile_size=32, tile_overlap=8,
                     num_classes=4, num_shards=2, **RUN)  # fmt: skip
    return images, masks, tmp_path / "out"


def test_tiles_lists_one_sources_tiles_in_grid_order_with_their_windows(tiled):
    images, masks, out = tiled
    tiles = tfshards.tiles(out, "train", source="003")
    assert (tiles.height, tiles.width, len(tiles)) == (70, 100, 12)
    assert tiles.windows == grid_windows(70, 100, 32, 8)
    image, mask = _source(images, "003"), _source(masks, "003")
    for tile, window in zip(tiles, tiles.windows, strict=True):
        assert tile.window == window and tile.key == tile_key("003", window)
        assert np.array_equal(tile.image, image[window.slices])
        assert np.array_equal(tile.mask, mask[window.slices])
    with pytest.raises(RecordTableError, match="no record of source '03'"):
        tfshards.tiles(out, "train", source="03")
    # a tile's own key is not a source: it listed one tile at (0, 0) of a 32x32 "source"
    with pytest.raises(RecordTableError, match="'003@r24_c0' is the key of one tile of '003'"):
        tfshards.tiles(out, "train", source="003@r24_c0")


@pytest.mark.parametrize("blend", ["mean", "gaussian"])
@pytest.mark.parametrize("as_scores", [False, True])
def test_stitching_the_tiles_masks_gives_the_source_mask_bit_for_bit(tiled, tmp_path, blend,
                                                                     as_scores):  # fmt: skip
    _, masks, out = tiled
    for source in ("000", "004"):
        tiles = tfshards.tiles(out, source=source)
        target = tmp_path / f"{source}.npy"
        stitcher = tfshards.Stitcher(tiles.height, tiles.width, classes=4, out=target, blend=blend)
        for tile in tiles:
            prediction = np.eye(4, dtype=np.float32)[tile.mask] if as_scores else tile.mask
            stitcher.add(tile.window, prediction)
        stitched = stitcher.finish()
        assert isinstance(stitched, np.memmap) and stitched.dtype == np.uint8
        assert np.array_equal(stitched, _source(masks, source))
        assert np.array_equal(np.load(target, mmap_mode="r"), _source(masks, source))
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_scores_are_blended_by_the_mean_or_gaussian_weights_favouring_centres(tmp_path):
    left, right = Window(0, 0, 8, 16), Window(0, 8, 8, 16)  # overlapping in columns 8..15
    ones, zeros = np.ones((8, 16, 1), np.float32), np.zeros((8, 16, 1), np.float32)
    blended = {}
    for blend in ("mean", "gaussian"):
        stitcher = tfshards.Stitcher(8, 24, classes=1, blend=blend, output="scores")
        stitcher.add(left, ones)
        stitcher.add(right, zeros)
        blended[blend] = np.asarray(stitcher.finish())[0, :, 0]
    assert np.array_equal(blended["mean"], [1] * 8 + [0.5] * 8 + [0] * 8)
    gaussian = blended["gaussian"]
    assert np.all(gaussian[:8] == 1) and np.all(gaussian[16:] == 0)
    # in the overlap the left tile's weight falls towards its edge, the right's rises (both
    # floored at 1e-3 far from their centres, where they tie)
    assert np.all(np.diff(gaussian[8:16]) <= 0) and gaussian[8] > 0.6 and gaussian[15] < 0.4
    assert np.allclose(gaussian[8:16], 1 - gaussian[8:16][::-1])  # symmetric tiles


def test_the_stitcher_refuses_what_does_not_fit(tmp_path):
    stitcher = tfshards.Stitcher(10, 10, classes=3)
    with pytest.raises(StitchError, match="reaches past the 10x10 image"):
        stitcher.add(Window(5, 0, 8, 8), np.zeros((8, 8), np.uint8))
    with pytest.raises(StitchError, match="class index 3 .* not in 0..2"):
        stitcher.add(Window(0, 0, 8, 8), np.full((8, 8), 3, np.uint8))
    with pytest.raises(StitchError, match=r"expected class indices \(8, 8\) or scores"):
        stitcher.add(Window(0, 0, 8, 8), np.zeros((8, 8, 2), np.float32))
    stitcher.add(Window(0, 0, 8, 8), np.zeros((8, 8), np.uint8))
    with pytest.raises(StitchError, match="row 0 has pixels no tile covered"):
        stitcher.finish()
    with pytest.raises(OptionsError, match="blend must be one of mean, gaussian"):
        tfshards.Stitcher(10, 10, classes=3, blend="max")
    # the Window the error names is public: tiles cut by the user are stitched too
    with pytest.raises(OptionsError, match=r"window must be a tfshards.Window\(row, column"):
        stitcher.add((0, 0, 8, 8), np.zeros((8, 8), np.uint8))
    stitcher.add(tfshards.Window(2, 2, 8, 8), np.zeros((8, 8), np.uint8))


def test_a_stitcher_with_uncovered_pixels_writes_no_output_file(tmp_path):
    target = tmp_path / "pred.npy"
    stitcher = tfshards.Stitcher(300, 4, classes=2, out=target)
    stitcher.add(Window(0, 0, 299, 4), np.zeros((299, 4), np.uint8))
    with pytest.raises(StitchError, match="row 299 has pixels no tile covered"):
        stitcher.finish()
    assert not target.exists()  # a partial result would load as a complete one
    stitcher.add(Window(299, 0, 1, 4), np.ones((1, 4), np.uint8))
    assert np.array_equal(stitcher.finish()[298:], [[0] * 4, [1] * 4])


def test_the_stitcher_refuses_an_out_it_cannot_write_before_any_tile(tmp_path):
    with pytest.raises(OptionsError, match=r"the folder .*missing does not exist"):
        tfshards.Stitcher(4, 4, classes=2, out=tmp_path / "missing" / "pred.npy")
    with pytest.raises(OptionsError, match="out must be a .npy file to write, got the folder"):
        tfshards.Stitcher(4, 4, classes=2, out=tmp_path)


@pytest.mark.parametrize(
    "scores, match",
    [
        (np.full((4, 4, 2), np.nan, np.float32), "hold 32 NaN or infinite values"),
        (np.full((4, 4, 2), np.inf, np.float32), "hold 32 NaN or infinite values"),
        (np.full((4, 4, 2), "a"), "scores of dtype <U1: expected real numbers"),
        (np.ones((4, 4, 2), np.complex64), "scores of dtype complex64"),
    ],
)
def test_the_stitcher_refuses_scores_that_are_not_finite_real_numbers(scores, match):
    stitcher = tfshards.Stitcher(4, 4, classes=2, output="scores")
    with pytest.raises(StitchError, match=match):
        stitcher.add(Window(0, 0, 4, 4), scores)
    assert stitcher.tiles == 0


def test_the_table_covers_tiles_so_sampling_by_class_picks_tiles_holding_it(tmp_path):
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir(), masks.mkdir()
    mask = np.zeros((64, 96), np.uint8)
    mask[40:50, 70:80] = 2  # class 2 in the bottom-right corner only
    Image.fromarray(np.zeros((64, 96, 3), np.uint8)).save(images / "a.png")
    Image.fromarray(mask).save(masks / "a.png")
    tfshards.convert(images, masks, tmp_path / "out", tile_size=32, num_classes=3, **RUN)
    table = tfshards.records(tmp_path / "out", progress=False)
    holding = {table.keys[i] for i in table.records_with(2)}
    assert holding == {"a@r32_c64"}
    assert table.class_pixels[:, 2].sum() == 100
    pairs = tfshards.Pairs(tmp_path / "out", with_keys=True)  # tiles train as any record
    image, labels, key = pairs[table.records_with(2)[0]]
    assert key == "a@r32_c64" and image.shape == (32, 32, 3) and labels[8:18, 6:16].min() == 2


def test_a_large_tiff_mask_is_sampled_by_a_window_before_converting(tmp_path, monkeypatch):
    from tfshards.converters import mask_values

    images, masks = _tiff_pairs(tmp_path / "data", 2, size=(64, 64), tile=(16, 16))
    for index in range(2):
        tifffile.imwrite(masks / f"{index:03d}.tif", np.where(np.eye(64) > 0, 255, 0).astype(
            np.uint8), tile=(16, 16))  # fmt: skip
    monkeypatch.setattr(mask_values, "SAMPLE_PIXELS", 1000)  # 64x64 masks are "large" now
    with pytest.raises(mask_values.MaskValuesError, match="the values 0 and 255"):
        tfshards.convert(images, masks, tmp_path / "out", tile_size=32, **RUN)
    assert np.array_equal(
        mask_values.middle_window(masks / "000.tif", size=8), np.where(np.eye(8) > 0, 255, 0)
    )


def _shard_of_each_key(out: Path) -> dict[str, str]:
    from tfshards.schemas.manifest import Manifest
    from tfshards.schemas.tfrecord import iter_records

    found = {}
    for split in Manifest.load(out).splits.values():
        for shard in split.shards:
            with open(out / shard.file, "rb") as stream:
                for data in iter_records(stream):
                    found[parse_example(data)["key"].decode()] = shard.file
    return found


def test_a_large_tiff_is_cut_into_bands_of_tile_rows_written_by_several_shards(tmp_path):
    images, masks = _tiff_pairs(tmp_path / "data", 2, tile=(16, 16))
    png_images, png_masks = write_pairs(tmp_path / "png", 1, size=(70, 100))
    os.rename(png_images / "000.png", images / "png.png")
    os.rename(png_masks / "000.png", masks / "png.png")
    settings = {"tile_size": 32, "tile_overlap": 8, "num_classes": 3, **RUN}
    # shards of a few bytes: one band of tile rows per unit of the plan
    tfshards.convert(images, masks, tmp_path / "bands", shard_size=1, **settings)
    tfshards.convert(images, masks, tmp_path / "whole", **settings)
    where = _shard_of_each_key(tmp_path / "bands")
    assert sorted(where) == sorted(_shard_of_each_key(tmp_path / "whole"))
    assert len({where[k] for k in where if k.startswith("000@")}) == 3  # 3 rows, 3 shards
    assert len({where[k] for k in where if k.startswith("png@")}) == 1  # decoded whole: once
    _check_tiles_are_windows(tmp_path / "bands", images, masks, 32, 8)
    assert tfshards.verify(tmp_path / "bands").ok
    for source in ("000", "001", "png"):
        tiles = tfshards.tiles(tmp_path / "bands", source=source)
        stitcher = tfshards.Stitcher(tiles.height, tiles.width, classes=3)
        for tile in tiles:
            stitcher.add(tile.window, tile.mask)
        assert np.array_equal(stitcher.finish(), _source(masks, source))


def test_a_band_of_a_cut_image_that_fails_is_not_skipped(tmp_path):
    images, masks = _tiff_pairs(tmp_path / "data", 2, size=(64, 64), tile=(16, 16),
                                compression="zlib")  # fmt: skip
    with tifffile.TiffFile(images / "001.tif") as tiff:
        offset, count = tiff.pages.first.dataoffsets[8], tiff.pages.first.databytecounts[8]
    data = bytearray((images / "001.tif").read_bytes())
    data[offset : offset + count] = b"\x00" * count  # in the second band's first tile
    (images / "001.tif").write_bytes(bytes(data))
    with pytest.raises(PairError, match=r"001\.tif: segment 8 does not decode .*; its image is "
                       r"cut into bands of tile rows written by several shards, so it cannot be "
                       r"skipped"):  # fmt: skip
        tfshards.convert(images, masks, tmp_path / "out", tile_size=32, shard_size=1,
                         on_error="skip", **RUN)  # fmt: skip
    _nothing_published(tmp_path / "out")


def test_tiles_of_an_untiled_image_is_its_one_record(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 2, size=(24, 32))
    tfshards.convert(images, masks, tmp_path / "out", **RUN)
    tiles = tfshards.tiles(tmp_path / "out", source="001")
    assert tiles.windows == [Window(0, 0, 24, 32)] and tiles[0].key == "001"
    assert np.array_equal(tiles[0].mask, _source(masks, "001"))


def test_sources_named_like_tiles_are_told_from_tiles(tmp_path):
    rng = np.random.default_rng(0)
    for folder in ("images", "masks"):
        (tmp_path / folder).mkdir()
    for name in ("x", "x@r0_c0", "y@r4_c4"):  # "x"'s first tile is keyed "x@r0_c0" too
        Image.fromarray(rng.integers(0, 255, (20, 24), np.uint8)).save(
            tmp_path / "images" / f"{name}.png"
        )
        Image.fromarray(rng.integers(0, 2, (20, 24), np.uint8)).save(
            tmp_path / "masks" / f"{name}.png"
        )
    images, masks = tmp_path / "images", tmp_path / "masks"
    tfshards.convert(images, masks, tmp_path / "whole", val_fraction=0, **RUN)
    assert tfshards.tiles(tmp_path / "whole", source="y@r4_c4").windows == [Window(0, 0, 20, 24)]
    tfshards.convert(images, masks, tmp_path / "tiled", tile_size=16, val_fraction=0, **RUN)
    expected = grid_windows(20, 24, 16, 0)
    for source in ("x", "x@r0_c0", "y@r4_c4"):
        tiles = tfshards.tiles(tmp_path / "tiled", source=source)
        assert tiles.windows == expected, source
        assert [tile.key for tile in tiles] == [tile_key(source, w) for w in expected]
    with pytest.raises(RecordTableError, match="'y@r4_c4@r4_c8' is the key of one tile of"):
        tfshards.tiles(tmp_path / "tiled", source="y@r4_c4@r4_c8")


def test_tiffs_in_a_bucket_are_read_by_windows_into_the_same_shards(tmp_path, s3_bucket):
    from s3_server import upload_folder

    images, masks = _tiff_pairs(tmp_path / "data", 2, tile=(16, 16), compression="zlib")
    settings = {"tile_size": 32, "tile_overlap": 8, "num_classes": 3, "shard_size": 1, **RUN}
    local = tfshards.convert(images, masks, tmp_path / "local", **settings)
    upload_folder(images, f"{s3_bucket}/images")
    upload_folder(masks, f"{s3_bucket}/masks")
    remote = tfshards.convert(f"{s3_bucket}/images", f"{s3_bucket}/masks", tmp_path / "remote",
                              **settings)  # fmt: skip
    assert remote.splits == local.splits
    assert shard_bytes(tmp_path / "remote").keys() == shard_bytes(tmp_path / "local").keys()
    for name, data in shard_bytes(tmp_path / "local").items():
        if name != "tfshards.json":  # its source paths differ
            assert shard_bytes(tmp_path / "remote")[name] == data, name


def test_the_cli_converts_by_tiles(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 2, size=(70, 100))
    argv = ["-q", "convert", "--images", str(images), "--masks", str(masks),
            "--out", str(tmp_path / "out"), "--tile", "32", "--overlap", "8",
            "--tile-smaller", "fail", "--decode-limit", "1MiB"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    manifest = tfshards.Manifest.load(tmp_path / "out")
    assert manifest.options["tile_size"] == 32 and manifest.options["decode_limit"] == 2**20
    assert manifest.splits["train"].records == 2 * 12
    assert main(["inspect", str(tmp_path / "out")]) == 0
    assert "tiles: records are 32x32 tiles of the source images, overlap 8" in (
        capsys.readouterr().out
    )


def test_the_stitcher_never_overwrites_a_file_it_was_not_told_to(tmp_path):
    """out= naming an existing file (perhaps the source itself) is refused before any tile;
    with overwrite=True the old file stays whole until finish() replaces it."""
    target = tmp_path / "scene.npy"
    np.save(target, np.arange(12, dtype=np.int64).reshape(3, 4))
    with pytest.raises(OptionsError, match=r"scene.npy exists; pass overwrite=True"):
        tfshards.Stitcher(3, 4, classes=2, out=target)
    assert np.array_equal(np.load(target), np.arange(12).reshape(3, 4))
    stitcher = tfshards.Stitcher(3, 4, classes=2, out=target, overwrite=True)
    stitcher.add(Window(0, 0, 3, 4), np.ones((3, 4), np.uint8))
    assert np.array_equal(np.load(target), np.arange(12).reshape(3, 4))  # not yet replaced
    assert np.array_equal(stitcher.finish(), np.ones((3, 4), np.uint8))
    assert np.array_equal(np.load(target), np.ones((3, 4), np.uint8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scene.npy"]
