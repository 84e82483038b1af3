"""Every validation error, with the file and the cause in the message."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tfshards import ConvertOptions, PairError
from tfshards.converters.pairing import Pair
from tfshards.converters.validation import prepare_pair


def save(path, array, mode=None, **kwargs):
    image = Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)
    image.save(path, **kwargs)
    return path


@pytest.fixture
def pair(tmp_path):
    image = save(tmp_path / "a.png", np.full((8, 10, 3), 100, np.uint8))
    mask = save(tmp_path / "a_mask.png", np.eye(8, 10, dtype=np.uint8))
    return Pair("a", image, mask)


def prepare(pair, **options):
    return prepare_pair(pair, ConvertOptions(**options), 3)


def test_good_pair(pair):
    prepared = prepare(pair)
    assert prepared.image.shape == (8, 10, 3) and prepared.mask.shape == (8, 10)
    assert prepared.image_source.reusable and prepared.mask_source.reusable


def test_size_mismatch_names_both_sizes(pair, tmp_path):
    save(pair.mask, np.zeros((9, 10), np.uint8))
    with pytest.raises(PairError, match=r"a_mask.png: mask is 9x10 \(HxW\) but image .* is 8x10"):
        prepare(pair)


@pytest.mark.parametrize(
    "content,reason",
    [
        (b"", "empty file"),
        (b"this is text, not a PNG", "not an image file"),
    ],
)
def test_unreadable_image_content(pair, content, reason):
    pair.image.write_bytes(content)
    with pytest.raises(PairError, match=f"image file .*a.png: {reason}"):
        prepare(pair)


def test_truncated_png_and_jpeg(tmp_path, pair):
    for name, fmt in (("t.png", "PNG"), ("t.jpg", "JPEG")):
        path = save(
            tmp_path / name,
            np.random.default_rng(0).integers(0, 255, (8, 10, 3), dtype=np.uint8),
            format=fmt,
        )
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(PairError, match=f"{name}: corrupt or truncated"):
            prepare(Pair("t", path, pair.mask))


def test_decompression_bomb(tmp_path, pair, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40)
    with pytest.raises(PairError, match="decompression-bomb limit"):
        prepare(pair)


def test_unreadable_permissions(pair, monkeypatch):
    # Simulated: tests may run as root, who reads files whatever their mode bits.
    from tfshards import storage

    real_read = storage.read_bytes

    def denied(path, storage_options=None):
        if path == pair.image:
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, storage_options)

    monkeypatch.setattr(storage, "read_bytes", denied)
    with pytest.raises(PairError, match=r"a.png: cannot read \(Permission denied\)"):
        prepare(pair)


def test_mask_value_over_num_classes(pair):
    with pytest.raises(PairError, match=r"a_mask.png: mask value 1 is not below --num-classes 1"):
        prepare(pair, num_classes=1)


def test_mask_map_remaps_and_rejects_unmapped(pair):
    save(pair.mask, (np.eye(8, 10) * 255).astype(np.uint8))
    prepared = prepare(pair, mask_map=((0, 0), (255, 1)), num_classes=2)
    assert set(np.unique(prepared.mask)) == {0, 1}
    assert not prepared.mask_source.reusable  # remapped masks are re-encoded
    with pytest.raises(PairError, match=r"mask values \[255\] are not in --mask-map"):
        prepare(pair, mask_map=((0, 0),))


def test_palette_mask_keeps_indices_not_colours(pair):
    indices = (np.arange(80).reshape(8, 10) % 4).astype(np.uint8)
    palette_mask = Image.frombytes("P", (10, 8), indices.tobytes())
    palette_mask.putpalette([200, 10, 10, 10, 200, 10, 10, 10, 200, 255, 255, 0] + [0] * 756)
    palette_mask.save(pair.mask)
    prepared = prepare(pair)
    assert np.array_equal(prepared.mask, indices)
    assert not prepared.mask_source.reusable  # a palette PNG would decode to colours in TF


def test_16bit_masks_supported_below_256_refused_above(pair):
    values = (np.arange(80).reshape(8, 10) % 5).astype(np.uint16)
    Image.fromarray(values).save(pair.mask)
    assert Image.open(pair.mask).mode.startswith("I")
    assert np.array_equal(prepare(pair).mask, values)
    Image.fromarray(values * 100).save(pair.mask)
    with pytest.raises(PairError, match=r"mask value 400 does not fit in 0..255 \(I;16 mask\)"):
        prepare(pair)


def test_colour_masks_refused_unless_gray(pair):
    gray = np.stack([np.eye(8, 10, dtype=np.uint8)] * 3, axis=2)
    save(pair.mask, gray)
    assert np.array_equal(prepare(pair).mask, np.eye(8, 10, dtype=np.uint8))
    gray[0, 0, 1] = 7
    save(pair.mask, gray)
    with pytest.raises(PairError, match="RGB mask with differing colour channels"):
        prepare(pair)


def test_16bit_images_refused_in_8bit_datasets_kept_in_16bit_ones(pair):
    values = (np.arange(80).reshape(8, 10) * 800).astype(np.uint16)
    Image.fromarray(values).save(pair.image)
    with pytest.raises(PairError, match="1 channel.* of uint16 .* never cut to 8 bits"):
        prepare(pair)
    kept = prepare_pair(pair, ConvertOptions(image_dtype="uint16"), 1).image
    assert kept.dtype == np.uint16 and np.array_equal(kept[:, :, 0], values)


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "CMYK", "P"])
def test_image_modes_convert_to_the_dataset_channels(pair, mode, tmp_path):
    path = tmp_path / ("m.jpg" if mode == "CMYK" else "m.png")
    save(path, np.full((8, 10, 3), 90, np.uint8), mode)
    prepared = prepare(Pair("m", path, pair.mask))
    assert prepared.image.shape == (8, 10, 3)
    assert not prepared.image_source.reusable


def test_exif_rotation_is_applied_to_image_and_mask(tmp_path):
    pixels = np.zeros((8, 10, 3), np.uint8)
    pixels[:2] = 255  # top rows white
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise when shown
    Image.fromarray(pixels).save(tmp_path / "r.jpg", exif=exif, quality=100)
    save(tmp_path / "r.png", np.zeros((10, 8), np.uint8))  # mask drawn on the shown image
    prepared = prepare(Pair("r", tmp_path / "r.jpg", tmp_path / "r.png"))
    assert prepared.image.shape == (10, 8, 3)
    assert prepared.image[:, -1].mean() > 200  # the top rows became the right columns
    assert prepared.image[:, 0].mean() < 50
    assert not prepared.image_source.reusable  # the stored bytes must be rotated too


def test_resize_uses_nearest_for_masks(pair):
    save(pair.mask, (np.arange(80).reshape(8, 10) % 3).astype(np.uint8))
    prepared = prepare(pair, resize=(17, 23))
    assert prepared.image.shape == (17, 23, 3) and prepared.mask.shape == (17, 23)
    assert set(np.unique(prepared.mask)) <= {0, 1, 2}
    assert not prepared.image_source.reusable and not prepared.mask_source.reusable


def test_options_refuse_bad_values():
    from tfshards import OptionsError

    with pytest.raises(OptionsError, match="mask encoding 'jpeg' is refused: it is lossy"):
        ConvertOptions(mask_encoding="jpeg")
    with pytest.raises(
        OptionsError,
        match="unknown image encoding 'webp'; valid encodings: deflate, jpeg, keep, png, raw",
    ):
        ConvertOptions(encoding="webp")
    with pytest.raises(OptionsError, match="leave some pairs for training"):
        ConvertOptions(val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(OptionsError, match="num_classes must be 1..256"):
        ConvertOptions(num_classes=300)
