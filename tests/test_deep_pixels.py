"""16-bit and multi-band images (issue 46, point 1): real files written here by Pillow,
tifffile and NumPy, converted, read back bit for bit, their statistics checked against
NumPy, and every refusal naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

import tfshards
from tfshards import ManifestError, OptionsError, PairError

SIZE = (32, 32)


def _masks(root: Path, count: int, classes: int = 3, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    masks = {}
    for index in range(count):
        mask = rng.integers(0, classes, SIZE, dtype=np.uint8)
        Image.fromarray(mask).save(root / "masks" / f"{index:03d}.png")
        masks[f"{index:03d}"] = mask
    return masks


def _images(root: Path, count: int, bands: int, writer, seed: int = 0) -> dict[str, np.ndarray]:
    """``count`` random uint16 images of ``bands`` bands, each written by ``writer(path
    without suffix, pixels [H, W, C])``; returns {key: pixels}."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    images = {}
    for index in range(count):
        pixels = rng.integers(0, 2**16, (*SIZE, bands), dtype=np.uint16)
        writer(root / "images" / f"{index:03d}", pixels)
        images[f"{index:03d}"] = pixels
    return images


def _npy(path: Path, pixels: np.ndarray) -> None:
    np.save(path.with_suffix(".npy"), pixels)


def _png16(path: Path, pixels: np.ndarray) -> None:
    Image.fromarray(pixels[:, :, 0]).save(path.with_suffix(".png"))


def _convert(root: Path, out: str = "out", **options) -> tfshards.Manifest:
    options = {"workers": 1, "progress": False, "num_classes": 3, **options}
    return tfshards.convert(root / "images", root / "masks", root / out, **options)


def _pairs_by_key(path: Path, split: str = "train") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    pairs = tfshards.Pairs(path, split, with_keys=True)
    return {key: (image, mask) for image, mask, key in (pairs[i] for i in range(len(pairs)))}


def _read_all(path: Path, split: str = "train", **arguments) -> np.ndarray:
    batches = tfshards.read(path, split=split, batch_size=64, shuffle=False, **arguments)
    return np.concatenate([image.numpy() for image, _ in batches])


def _assert_round_trip(path: Path, images: dict[str, np.ndarray], masks: dict) -> None:
    """Pairs and read() give the source pixels, bit for bit, as uint16."""
    found = _pairs_by_key(path)
    assert sorted(found) == sorted(images)
    for key, (image, mask) in found.items():
        assert image.dtype == np.uint16 and np.array_equal(image, images[key]), key
        assert np.array_equal(mask[:, :, 0], masks[key]), key
    pairs = tfshards.Pairs(path, "train")
    in_order = np.stack([pairs[i][0] for i in range(len(pairs))])
    read = _read_all(path, image_dtype="uint16")
    assert read.dtype == np.uint16 and np.array_equal(read, in_order)
    assert tfshards.verify(path).ok


@pytest.mark.parametrize("encoding", ["raw", "deflate"])
@pytest.mark.parametrize("bands", [4, 13, 16])
def test_npy_bands_round_trip_bit_exact(tmp_path, encoding, bands):
    images = _images(tmp_path, 5, bands, _npy)
    masks = _masks(tmp_path, 5)
    manifest = _convert(tmp_path, encoding=encoding)
    assert (manifest.image.channels, manifest.image.dtype) == (bands, "uint16")
    _assert_round_trip(tmp_path / "out", images, masks)


@pytest.mark.parametrize("encoding", ["raw", "deflate", "png"])
def test_16bit_png_round_trips_in_every_lossless_encoding(tmp_path, encoding):
    images = _images(tmp_path, 4, 1, _png16)
    masks = _masks(tmp_path, 4)
    manifest = _convert(tmp_path, encoding=encoding)
    assert (manifest.image.channels, manifest.image.dtype) == (1, "uint16")
    _assert_round_trip(tmp_path / "out", images, masks)


def _tiff_writer(**options):
    def write(path: Path, pixels: np.ndarray) -> None:
        tifffile.imwrite(path.with_suffix(".tif"), pixels, **options)

    return write


def _tiff_pages(path: Path, pixels: np.ndarray) -> None:
    """One page per band, written one page at a time (as scanners and GDAL do)."""
    with tifffile.TiffWriter(path.with_suffix(".tiff")) as tif:
        for band in range(pixels.shape[2]):
            tif.write(pixels[:, :, band], photometric="minisblack", metadata=None)


def _tiff_planar(path: Path, pixels: np.ndarray) -> None:
    bands_first = np.moveaxis(pixels, -1, 0)
    tifffile.imwrite(path.with_suffix(".tif"), bands_first, planarconfig="separate")


CONTIG = {"photometric": "minisblack", "planarconfig": "contig"}
TIFFS = {
    "striped": _tiff_writer(rowsperstrip=8, **CONTIG),
    "tiled-deflate": _tiff_writer(tile=(16, 16), compression="zlib", **CONTIG),
    "bigtiff": _tiff_writer(bigtiff=True, **CONTIG),
    "planar": _tiff_planar,
    "pages": _tiff_pages,
}


@pytest.mark.parametrize("layout", sorted(TIFFS))
def test_tiffs_round_trip_bit_exact(tmp_path, layout):
    images = _images(tmp_path, 4, 5, TIFFS[layout])
    masks = _masks(tmp_path, 4)
    manifest = _convert(tmp_path, encoding="deflate")
    assert (manifest.image.channels, manifest.image.dtype) == (5, "uint16")
    _assert_round_trip(tmp_path / "out", images, masks)


def test_8bit_multiband_tiff_keeps_its_bands(tmp_path):
    rng = np.random.default_rng(3)
    (tmp_path / "images").mkdir()
    image = rng.integers(0, 256, (*SIZE, 6), dtype=np.uint8)
    tifffile.imwrite(tmp_path / "images" / "000.tif", image, **CONTIG)
    _masks(tmp_path, 1)
    manifest = _convert(tmp_path, encoding="raw")
    assert (manifest.image.channels, manifest.image.dtype) == (6, "uint8")
    ((found, _),) = _pairs_by_key(tmp_path / "out").values()
    assert found.dtype == np.uint8 and np.array_equal(found, image)


def test_npy_bands_first_are_told_by_the_mask(tmp_path):
    (tmp_path / "images").mkdir()
    image = np.random.default_rng(0).integers(0, 2**16, (7, *SIZE), dtype=np.uint16)
    np.save(tmp_path / "images" / "000.npy", image)  # (bands, H, W), as rasterio reads
    _masks(tmp_path, 1)
    assert _convert(tmp_path, encoding="raw").image.channels == 7
    ((found, _),) = _pairs_by_key(tmp_path / "out").values()
    assert np.array_equal(found, np.moveaxis(image, 0, -1))


def test_statistics_are_numpys_over_each_split(tmp_path):
    _images(tmp_path, 12, 4, _npy)
    _masks(tmp_path, 12)
    manifest = _convert(tmp_path, encoding="deflate", val_fraction=0.3)
    assert set(manifest.splits) == {"train", "val"}
    for name, split in manifest.splits.items():
        pixels = np.stack([image for image, _ in _pairs_by_key(tmp_path / "out", name).values()])
        values = pixels.reshape(-1, 4).astype(np.float64)
        stats = split.image_stats
        assert stats.pixels == values.shape[0]
        np.testing.assert_allclose(stats.mean, values.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(stats.std, values.std(axis=0), rtol=1e-12)
        assert stats.min == values.min(axis=0).astype(int).tolist()
        assert stats.max == values.max(axis=0).astype(int).tolist()


def test_statistics_do_not_depend_on_workers_or_shards(tmp_path):
    _images(tmp_path, 10, 3, _npy)
    _masks(tmp_path, 10)
    one = _convert(tmp_path, "one", encoding="raw")
    many = _convert(tmp_path, "many", encoding="raw", workers=2, num_shards=4)
    assert one.splits["train"].image_stats == many.splits["train"].image_stats
    assert one.to_json().count('"image_stats"') == 1


def test_float32_and_normalize(tmp_path):
    _images(tmp_path, 6, 3, _npy)
    _masks(tmp_path, 6)
    _convert(tmp_path, encoding="deflate")
    out = tmp_path / "out"
    samples = _read_all(out, image_dtype="uint16")
    floats = _read_all(out)
    assert floats.dtype == np.float32
    np.testing.assert_array_equal(floats, samples.astype(np.float32) * np.float32(1 / 65535))
    stats = tfshards.Manifest.load(out).splits["train"].image_stats
    normalized = _read_all(out, normalize=True)
    mean, std = np.float32(stats.mean), np.float32(stats.std)
    np.testing.assert_allclose(normalized, (samples - mean) / std, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(normalized.reshape(-1, 3).mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(normalized.reshape(-1, 3).std(axis=0), 1, atol=1e-4)


def test_normalize_applies_to_8bit_datasets_too(tmp_path):
    from conftest import write_pairs

    images, masks = write_pairs(tmp_path / "data", 4)
    tfshards.convert(images, masks, tmp_path / "out", workers=1, progress=False)
    stats = tfshards.Manifest.load(tmp_path / "out").splits["train"].image_stats
    assert len(stats.mean) == 3 and stats.max[0] <= 255
    samples = _read_all(tmp_path / "out", image_dtype="uint8")
    normalized = _read_all(tmp_path / "out", normalize=True)
    expected = (samples - np.float32(stats.mean)) / np.float32(stats.std)
    np.testing.assert_allclose(normalized, expected, rtol=1e-5, atol=1e-5)
    widened = _read_all(tmp_path / "out", image_dtype="uint16")
    assert widened.dtype == np.uint16 and np.array_equal(widened, samples)


def test_uint16_datasets_refuse_uint8_and_resizing_reads(tmp_path):
    _images(tmp_path, 2, 2, _npy)
    _masks(tmp_path, 2)
    _convert(tmp_path, encoding="raw")
    out = tmp_path / "out"
    with pytest.raises(OptionsError, match="image_dtype='uint8' is refused: .* uint16"):
        tfshards.read(out, image_dtype="uint8")
    with pytest.raises(OptionsError, match="image_size is refused"):
        tfshards.read(out, image_size=(16, 16))
    with pytest.raises(OptionsError, match="image_dtype must be one of"):
        tfshards.read(out, image_dtype="int16")
    for dtype in ("uint16", "uint8"):  # normalize's float32 was given instead, silently
        with pytest.raises(
            OptionsError, match=f"normalize=True gives float32 images; image_dtype='{dtype}'"
        ):
            tfshards.read(out, image_dtype=dtype, normalize=True, batch_size=1)


def test_the_disk_and_memory_caches_keep_uint16(tmp_path):
    _images(tmp_path, 5, 3, _npy)
    _masks(tmp_path, 5)
    _convert(tmp_path, encoding="deflate")
    out = tmp_path / "out"
    plain = _read_all(out, image_dtype="uint16")
    cache = tmp_path / "cache"
    for _ in range(2):  # the first pass fills the cache, the second reads it
        assert np.array_equal(_read_all(out, image_dtype="uint16", cache=cache), plain)
    assert any(cache.rglob("*")), "the disk cache was not written"
    assert np.array_equal(_read_all(out, image_dtype="uint16", cache="memory"), plain)


def test_crops_of_uint16_images_cut_whole_samples(tmp_path):
    images = _images(tmp_path, 3, 2, _npy)
    _masks(tmp_path, 3)
    _convert(tmp_path, encoding="raw")
    crops = _read_all(tmp_path / "out", image_dtype="uint16", crop_size=(8, 8), seed=0)
    assert crops.shape == (3, 8, 8, 2)
    sources = list(images.values())
    for crop in crops:  # each crop is a window of one source image
        found = any(
            np.array_equal(crop, image[r : r + 8, c : c + 8])
            for image in sources
            for r in range(25)
            for c in range(25)
        )
        assert found


# ---- refusals, each naming the file ---------------------------------------------------


def test_mixed_sample_types_name_the_file(tmp_path):
    _images(tmp_path, 3, 1, _png16)
    _masks(tmp_path, 3)
    Image.fromarray(np.zeros(SIZE, np.uint8)).save(tmp_path / "images" / "002.png")
    with pytest.raises(PairError, match=r"002\.png.*1 channel\(s\) of uint8 but this dataset "):
        _convert(tmp_path)
    assert not (tmp_path / "out" / "tfshards.json").exists()


def test_mixed_band_counts_name_the_file(tmp_path):
    _images(tmp_path, 3, 4, _npy)
    _masks(tmp_path, 3)
    np.save(tmp_path / "images" / "001.npy", np.zeros((*SIZE, 5), np.uint16))
    with pytest.raises(PairError, match=r"001\.npy.*holds 5 channel\(s\) of uint16 .* stores 4"):
        _convert(tmp_path, channels=4)


def test_16bit_images_in_an_8bit_dataset_are_never_truncated(tmp_path):
    _images(tmp_path, 2, 1, _png16)
    _masks(tmp_path, 2)
    with pytest.raises(PairError, match=r"000\.png.*never cut to 8 bits"):
        _convert(tmp_path, image_dtype="uint8")


def test_png_and_jpeg_refuse_layouts_they_cannot_hold(tmp_path):
    _images(tmp_path, 2, 4, _npy)
    _masks(tmp_path, 2)
    with pytest.raises(OptionsError, match=r"000\.npy: encoding 'png' cannot store 4 channel"):
        _convert(tmp_path, encoding="png")
    with pytest.raises(OptionsError, match="encoding 'jpeg' cannot store 1 channel.* uint16"):
        tfshards.ConvertOptions(encoding="jpeg", channels=1, image_dtype="uint16")
    with pytest.raises(OptionsError, match="channels must be 1..64"):
        tfshards.ConvertOptions(channels=65)


def _one_tiff(tmp_path: Path) -> Path:
    _images(tmp_path, 1, 3, TIFFS["tiled-deflate"])
    _masks(tmp_path, 1)
    return tmp_path / "images" / "000.tif"


def test_truncated_tiff_names_the_file(tmp_path):
    path = _one_tiff(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(PairError, match=r"000\.tif: (corrupt or truncated|cannot read)"):
        _convert(tmp_path)


def test_corrupt_tiff_names_the_file(tmp_path):
    path = _one_tiff(tmp_path)
    data = bytearray(path.read_bytes())
    with tifffile.TiffFile(path) as tif:
        offset = tif.pages[0].dataoffsets[0]
    data[offset : offset + 64] = bytes(64)  # the first tile's zlib stream, zeroed
    path.write_bytes(bytes(data))
    with pytest.raises(PairError, match=r"000\.tif: (corrupt or truncated|cannot read)"):
        _convert(tmp_path, channels=3, image_dtype="uint16")


def test_a_tiff_of_two_band_axes_is_refused(tmp_path):
    (tmp_path / "images").mkdir()
    stack = np.zeros((2, *SIZE, 3), np.uint16)  # two pages of 3-sample images
    tifffile.imwrite(tmp_path / "images" / "000.tif", stack, **CONTIG)
    _masks(tmp_path, 1)
    with pytest.raises(PairError, match=r"000\.tif: .*axes besides Y and X"):
        _convert(tmp_path, channels=3, image_dtype="uint16")


@pytest.mark.parametrize(
    ("array", "reason"),
    [
        (np.zeros((*SIZE, 2), np.int16), "int16 images are not supported"),
        (np.zeros((*SIZE, 2), np.float32), "float32 images are not supported"),
        (np.zeros((2, 2, *SIZE), np.uint16), "4-D array"),
        (np.array([{"a": 1}], dtype=object), "allow_pickle"),
    ],
)
def test_npy_arrays_tfshards_cannot_store_are_refused(tmp_path, array, reason):
    (tmp_path / "images").mkdir()
    np.save(tmp_path / "images" / "000.npy", array, allow_pickle=True)
    _masks(tmp_path, 1)
    with pytest.raises(PairError, match=rf"000\.npy: .*{reason}"):
        _convert(tmp_path, channels=2, image_dtype="uint16")


# ---- masks ----------------------------------------------------------------------------


def _mask_case(tmp_path: Path, mask: np.ndarray, suffix: str) -> None:
    _images(tmp_path, 1, 2, _npy)
    (tmp_path / "masks").mkdir()
    path = tmp_path / "masks" / f"000{suffix}"
    if suffix == ".npy":
        np.save(path, mask)
    else:
        tifffile.imwrite(path, mask)


@pytest.mark.parametrize("suffix", [".npy", ".tif"])
def test_16bit_masks_within_the_classes_are_accepted(tmp_path, suffix):
    mask = (np.arange(32 * 32).reshape(SIZE) % 3).astype(np.uint16)
    _mask_case(tmp_path, mask, suffix)
    _convert(tmp_path, encoding="raw")
    ((_, found),) = _pairs_by_key(tmp_path / "out").values()
    assert found.dtype == np.uint8 and np.array_equal(found[:, :, 0], mask)


@pytest.mark.parametrize("suffix", [".npy", ".tif"])
def test_16bit_masks_beyond_the_classes_are_refused(tmp_path, suffix):
    mask = (np.arange(32 * 32).reshape(SIZE) % 3).astype(np.uint16)
    mask[0, 0] = 300
    _mask_case(tmp_path, mask, suffix)
    with pytest.raises(PairError, match=rf"000\{suffix}: mask value 300 does not fit in 0..255"):
        _convert(tmp_path, encoding="raw")
    mask[0, 0] = 7
    _mask_case(tmp_path / "again", mask, suffix)
    with pytest.raises(PairError, match="mask value 7 is not below --num-classes 3"):
        _convert(tmp_path / "again", encoding="raw")


def test_16bit_mask_values_are_remapped_by_a_mask_map_given_as_a_dict(tmp_path):
    mask = (np.arange(32 * 32).reshape(SIZE) % 2 * 1000).astype(np.uint16)  # 0 and 1000
    _mask_case(tmp_path, mask, ".tif")
    _convert(tmp_path, encoding="raw", num_classes=2, mask_map={0: 0, 1000: 1})
    ((_, found),) = _pairs_by_key(tmp_path / "out").values()
    assert np.array_equal(found[:, :, 0], mask // 1000)


def _colour_png16(path: Path, samples: np.ndarray) -> None:
    """A PNG of 16-bit RGB ([H, W, 3]) or RGBA samples, which Pillow does not write."""
    import struct
    import zlib

    height, width, bands = samples.shape
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in samples)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 16, {3: 2, 4: 6}[bands], 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


@pytest.mark.parametrize("tile_size", [None, 16])
def test_16bit_colour_pngs_are_refused_not_cut_to_8_bits(tmp_path, tile_size):
    """Pillow reads them as 8 bits: images lost their low bits, masks' classes 300 and 600
    became 1 and 2, silently."""
    rng = np.random.default_rng(0)
    for folder in ("images", "masks"):
        (tmp_path / folder).mkdir()
    _colour_png16(tmp_path / "images" / "000.png", rng.integers(0, 2**16, (*SIZE, 3), np.uint16))
    Image.fromarray(np.zeros(SIZE, np.uint8)).save(tmp_path / "masks" / "000.png")
    with pytest.raises(PairError, match=r"000\.png: a 16-bit RGB PNG, which Pillow reads as 8"):
        _convert(tmp_path, tile_size=tile_size)
    (tmp_path / "images" / "000.png").unlink()
    Image.fromarray(np.zeros((*SIZE, 3), np.uint8)).save(tmp_path / "images" / "000.png")
    labels = np.repeat((np.arange(32 * 32).reshape(*SIZE, 1) % 3 * 300).astype(np.uint16), 4, 2)
    _colour_png16(tmp_path / "masks" / "000.png", labels)
    with pytest.raises(PairError, match=r"mask file .*000\.png: a 16-bit RGBA PNG"):
        _convert(tmp_path, tile_size=tile_size, mask_map={0: 0, 300: 1, 600: 2})


@pytest.mark.parametrize("tile_size", [None, 16])
def test_an_unreadable_first_image_is_skipped_and_the_next_sets_the_layout(tmp_path, tile_size):
    """The first image decides channels and sample type; with on_error="skip" an unreadable
    one aborted the whole conversion (a broken TIFF header also read 'IndexError')."""
    _images(tmp_path, 3, 5, _npy)
    _masks(tmp_path, 3)
    (tmp_path / "images" / "000.npy").unlink()
    (tmp_path / "images" / "000.tif").write_bytes(b"II*\x00" + b"\xff" * 50)
    with pytest.raises(PairError, match=r"000\.tif: .*(no readable page|holds no image)"):
        _convert(tmp_path, tile_size=tile_size)
    manifest = _convert(tmp_path, "skipped", tile_size=tile_size, on_error="skip")
    assert (manifest.image.channels, manifest.image.dtype) == (5, "uint16")
    assert [skipped.key for skipped in manifest.skipped] == ["000"]


# ---- verify, inspect, TFDS, buckets -------------------------------------------------------


def test_verify_checks_records_against_the_manifests_dtype(tmp_path):
    import json

    _images(tmp_path, 3, 2, _npy)
    _masks(tmp_path, 3)
    _convert(tmp_path, encoding="raw")
    out = tmp_path / "out"
    assert tfshards.verify(out).ok
    body = json.loads((out / "tfshards.json").read_text())
    body["image"]["dtype"] = "uint8"  # the records hold twice the bytes uint8 would
    (out / "tfshards.json").write_text(json.dumps(body))
    report = tfshards.verify(out)
    assert not report.ok
    assert "raw pixels are 4096 bytes, expected 2048" in str(report.shards[0].problems)


def test_inspect_previews_three_bands_stretched(tmp_path):
    from tfshards.checks.inspect import preview_bands, preview_rgb, write_preview

    _images(tmp_path, 3, 13, _npy)
    _masks(tmp_path, 3)
    _convert(tmp_path, encoding="deflate")
    assert preview_bands(13) == (0, 1, 2) and preview_bands(1) == (0, 0, 0)
    with pytest.raises(OptionsError, match=r"bands must be three channel indices in 0..12"):
        preview_bands(13, (3, 2, 13))
    assert write_preview(tmp_path / "out", tmp_path / "p.png", bands=(3, 2, 1)) == 3
    with pytest.raises(ManifestError, match="no split 'tset' to preview; this dataset has"):
        write_preview(tmp_path / "out", tmp_path / "p.png", split="tset")
    assert Image.open(tmp_path / "p.png").mode == "RGB"
    dim = np.full((4, 4, 2), 1000, np.uint16)
    dim[0, 0] = 3000  # 16-bit sensors fill a small part of the range: stretched to 0..255
    dim[1, 1] = 500
    rgb = preview_rgb(dim, (0, 1, 1))
    assert rgb.dtype == np.uint8 and rgb.shape == (4, 4, 3) and rgb.max() == 255
    assert rgb.min() == 0


def test_cli_inspect_names_the_sample_type_and_takes_bands(tmp_path):
    import subprocess
    import sys

    _images(tmp_path, 2, 4, _npy)
    _masks(tmp_path, 2)
    _convert(tmp_path, encoding="raw")
    command = [sys.executable, "-m", "tfshards.cli", "inspect", str(tmp_path / "out")]
    command += ["--preview", str(tmp_path / "p.png"), "--bands", "2,1,0"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "4 channels of uint16" in done.stdout and (tmp_path / "p.png").exists()


@pytest.mark.parametrize(("encoding", "bands"), [("raw", 5), ("deflate", 3), ("png", 1)])
def test_tfds_loads_uint16_images(tmp_path, encoding, bands):
    tfds = pytest.importorskip("tensorflow_datasets")
    from tfshards.converters.tfds_metadata import export_tfds

    writer = _png16 if encoding == "png" else _npy
    _images(tmp_path, 4, bands, writer)
    _masks(tmp_path, 4)
    _convert(tmp_path, encoding=encoding, compression="none")
    out = tmp_path / "out"
    export_tfds(out)
    builder = tfds.builder_from_directory(str(out))
    pairs = builder.as_dataset(split="train", shuffle_files=False, as_supervised=True)
    theirs = [image for image, _ in tfds.as_numpy(pairs)]
    ours = _read_all(out, image_dtype="uint16")
    assert all(image.dtype == np.uint16 for image in theirs)
    assert np.array_equal(np.stack(theirs), ours)


def test_a_bucket_dataset_of_uint16_images_reads_the_same(tmp_path, s3_bucket):
    _images(tmp_path, 3, 4, _npy)
    _masks(tmp_path, 3)
    url = f"{s3_bucket}/out"
    tfshards.convert(
        tmp_path / "images", tmp_path / "masks", url, encoding="deflate", workers=1, progress=False
    )
    local = _convert(tmp_path, encoding="deflate")
    remote = tfshards.Manifest.load(url)
    assert remote.splits["train"].image_stats == local.splits["train"].image_stats
    options = tfshards.ReadOptions(shard_cache=tmp_path / "shard-cache")
    remote_pairs = tfshards.Pairs(url, "train", options=options)
    local_pairs = tfshards.Pairs(tmp_path / "out", "train")
    for index in range(len(local_pairs)):
        assert np.array_equal(remote_pairs[index][0], local_pairs[index][0])
    ours = _read_all(tmp_path / "out", image_dtype="uint16")
    batches = tfshards.read(url, batch_size=8, shuffle=False, image_dtype="uint16", options=options)
    assert np.array_equal(np.concatenate([image.numpy() for image, _ in batches]), ours)


def test_beam_writes_the_local_bytes_and_statistics(tmp_path):
    pytest.importorskip("apache_beam")
    from tfshards.converters.beam import beam_runner

    _images(tmp_path, 8, 5, _npy)
    _masks(tmp_path, 8)
    options = {"encoding": "deflate", "num_shards": 2, "val_fraction": 0.25}
    local = _convert(tmp_path, "local", **options)
    runner = beam_runner("--runner=DirectRunner --direct_num_workers=1")
    beam = _convert(tmp_path, "beam", runner=runner, **options)
    assert beam == local and beam.splits["train"].image_stats is not None
    for shard in local.splits["train"].shards:
        local_bytes = (tmp_path / "local" / shard.file).read_bytes()
        assert (tmp_path / "beam" / shard.file).read_bytes() == local_bytes


def test_resize_at_conversion_keeps_uint16_bands(tmp_path):
    _images(tmp_path, 2, 5, _npy)
    _masks(tmp_path, 2)
    smooth = np.tile(np.linspace(0, 60_000, 32, dtype=np.uint16)[None, :, None], (32, 1, 5))
    np.save(tmp_path / "images" / "000.npy", smooth)
    manifest = _convert(tmp_path, encoding="raw", resize=(16, 16))
    assert (manifest.image.height, manifest.image.channels) == (16, 5)
    found = _pairs_by_key(tmp_path / "out")["000"][0]
    assert found.dtype == np.uint16 and found.shape == (16, 16, 5)
    assert np.all(np.diff(found[0, :, 0].astype(int)) > 0)  # a ramp, resized, stays a ramp
    assert int(found.min()) >= 0 and int(found.max()) <= 60_000 + 1


def test_big_endian_npy_is_stored_as_its_values(tmp_path):
    (tmp_path / "images").mkdir()
    image = np.arange(32 * 32 * 2, dtype=">u2").reshape(*SIZE, 2)
    np.save(tmp_path / "images" / "000.npy", image)
    _masks(tmp_path, 1)
    _convert(tmp_path, encoding="deflate")
    ((found, _),) = _pairs_by_key(tmp_path / "out").values()
    assert found.dtype == np.uint16 and np.array_equal(found, image.astype(np.uint16))


def test_too_many_bands_and_empty_arrays_name_the_file(tmp_path):
    _images(tmp_path, 1, 65, _npy)
    _masks(tmp_path, 1)
    with pytest.raises(OptionsError, match=r"000\.npy: channels must be 1..64 .*got 65"):
        _convert(tmp_path)
    np.save(tmp_path / "images" / "000.npy", np.zeros((*SIZE, 0), np.uint16))
    with pytest.raises(PairError, match=r"000\.npy: .*at least one pixel and one band"):
        _convert(tmp_path)


def test_without_tifffile_tiffs_pillow_would_truncate_are_refused(tmp_path, monkeypatch):
    from tfshards.converters import deep_files

    monkeypatch.setattr(deep_files, "_tifffile", lambda: None)  # as if the extra were absent
    _images(tmp_path, 1, 3, _tiff_writer(photometric="rgb"))
    _masks(tmp_path, 1)
    with pytest.raises(PairError, match=r"000\.tif: .*pip install 'tfshards\[tiff\]'"):
        _convert(tmp_path, channels=3, image_dtype="uint8")
    gray = _images(tmp_path / "gray", 2, 1, _tiff_writer())  # Pillow reads 16-bit gray
    masks = _masks(tmp_path / "gray", 2)
    _convert(tmp_path / "gray", encoding="raw")
    _assert_round_trip(tmp_path / "gray" / "out", gray, masks)


def test_without_tifffile_a_tiff_pillow_cannot_open_names_the_extra(tmp_path, monkeypatch):
    from tfshards.converters import deep_files

    monkeypatch.setattr(deep_files, "_tifffile", lambda: None)
    _images(tmp_path, 1, 13, _tiff_writer(**CONTIG))
    _masks(tmp_path, 1)
    with pytest.raises(PairError, match=r"000\.tif: .*pip install 'tfshards\[tiff\]'"):
        _convert(tmp_path, channels=13, image_dtype="uint16")


def test_a_keras_layer_on_uint16_images_gives_uint16(tmp_path):
    import keras

    _images(tmp_path, 4, 3, _npy)
    _masks(tmp_path, 4)
    _convert(tmp_path, encoding="raw")
    plain = _read_all(tmp_path / "out", image_dtype="uint16")
    flip = keras.layers.RandomFlip("horizontal", seed=0)
    flipped = _read_all(tmp_path / "out", image_dtype="uint16", augment=flip, seed=0)
    assert flipped.dtype == np.uint16 and flipped.shape == plain.shape
    for image, source in zip(flipped, plain, strict=True):  # flipped or not, never rescaled
        assert np.array_equal(image, source) or np.array_equal(image, source[:, ::-1])
    # photometric layers assume value_range=(0, 255) unless told: they clipped every
    # uint16 pixel to 255, silently
    brighter = keras.Sequential([flip, keras.layers.RandomBrightness(0.1, seed=0)])
    with pytest.raises(OptionsError, match=r"RandomBrightness has value_range=\(0, 255\)"):
        tfshards.read(tmp_path / "out", image_dtype="uint16", augment=brighter)
    told = keras.layers.RandomBrightness(0.1, value_range=(0, 65535), seed=0)
    assert _read_all(tmp_path / "out", image_dtype="uint16", augment=told, seed=0).max() > 255


def test_cli_converts_npy_bands_with_an_image_dtype(tmp_path):
    import subprocess
    import sys

    images = _images(tmp_path, 3, 4, _npy)
    _masks(tmp_path, 3)
    command = [sys.executable, "-m", "tfshards.cli", "convert", "--images"]
    command += [str(tmp_path / "images"), "--masks", str(tmp_path / "masks")]
    command += ["--out", str(tmp_path / "out"), "--image-dtype", "uint16", "--channels", "4"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    found = _pairs_by_key(tmp_path / "out")
    assert all(np.array_equal(found[key][0], images[key]) for key in images)
