"""Several datasets read as one (read({name: path}, weights=, epoch_size=)) and label maps
(read(path, label_map=...)): issue 47."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tfshards
from tfshards.errors import OptionsError
from tfshards.readers.labels import label_map, remapped_table
from tfshards.schemas.record_table import RecordTable, record_row

SIZES = {"a": 40, "b": 15}  # records of each dataset
TAGS = {"a": 1, "b": 2}  # an image's channel 1: which dataset it came from


def _mask(name: str, index: int, side: int = 8) -> np.ndarray:
    """a: classes 0..3 (3 in every 4th record); b: classes 0..2 (2 in every 3rd)."""
    mask = np.zeros((side, side), np.uint8)
    mask[: side // 2, : side // 2] = 1
    if name == "a" and index % 4 == 0:
        mask[side // 2 :, side // 2 :] = 3
    if name == "a" and index % 2 == 0:
        mask[0, side - 1] = 2
    if name == "b" and index % 3 == 0:
        mask[side // 2 :, :2] = 2
    return mask


def _dataset(root: Path, name: str, count: int, side: int = 8, **options) -> Path:
    """``count`` pairs; image channel 0 is the pair's index, channel 1 the dataset's tag."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for index in range(count):
        image = np.zeros((side, side, 3), np.uint8)
        image[..., 0], image[..., 1] = index, TAGS.get(name, 9)
        Image.fromarray(image).save(root / "images" / f"{index:03d}.png")
        Image.fromarray(_mask(name, index, side)).save(root / "masks" / f"{index:03d}.png")
    classes = 4 if name == "a" else 3
    settings = {"num_shards": 2, "encoding": "raw", "num_classes": classes, **options}
    tfshards.convert(
        root / "images", root / "masks", root / "out", options=tfshards.ConvertOptions(**settings)
    )
    return root / "out"


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    return {name: _dataset(root / name, name, count) for name, count in SIZES.items()}


def _seen(read) -> list[tuple[int, int]]:
    """(dataset tag, pair index) of every pair read, in order."""
    return [
        (int(tag), int(index))
        for image, _ in read
        for index, tag in image[:, 0, 0, :2].numpy().tolist()
    ]


def _mixed(two, **arguments):
    settings = {"weights": {"a": 0.75, "b": 0.25}, "epoch_size": 40, "batch_size": 8}
    settings.update(arguments)
    return tfshards.read(two, image_dtype="uint8", **settings)


# Point 4: one dataset's label map -------------------------------------------------------


def test_a_label_map_remaps_every_mask_pixel_at_read_time(two):
    plain = tfshards.read(two["a"], batch_size=8, image_dtype="uint8", shuffle=False)
    mapped = tfshards.read(
        two["a"], batch_size=8, image_dtype="uint8", shuffle=False, label_map={3: 1, 2: None}
    )
    lookup = np.array([0, 1, 255, 1])
    for (image, mask), (image2, mask2) in zip(plain, mapped, strict=True):
        assert np.array_equal(image.numpy(), image2.numpy())
        assert np.array_equal(lookup[mask.numpy()], mask2.numpy())  # pixel by pixel
    assert (lookup == 255).any()


def test_a_label_map_applies_to_a_cached_read_and_the_cache_serves_any_map(two, tmp_path):
    arguments = {"batch_size": 8, "image_dtype": "uint8", "shuffle": False, "cache": tmp_path}
    first = [m.numpy() for _, m in tfshards.read(two["a"], label_map=[0, 0, 0, 1], **arguments)]
    for _ in range(2):  # the cache is complete after the first epoch: now read from it
        again = [m.numpy() for _, m in tfshards.read(two["a"], **arguments)]
        mapped = [
            m.numpy() for _, m in tfshards.read(two["a"], label_map=[0, 0, 0, 1], **arguments)
        ]
    assert [np.array_equal(np.array([0, 0, 0, 1])[x], y) for x, y in zip(again, mapped)] == [
        True
    ] * 5
    assert all(np.array_equal(x, y) for x, y in zip(first, mapped, strict=True))
    assert len(list(tmp_path.rglob("*.ready*")) or list(tmp_path.iterdir())) >= 1


def test_a_label_map_remaps_info_and_class_weights(two):
    own = tfshards.info(two["a"])
    mapped = tfshards.info(two["a"], label_map={3: 1})
    assert (own.num_classes, mapped.num_classes) == (4, 3)
    pixels = own.class_pixels("train")
    assert mapped.class_pixels("train") == [pixels[0], pixels[1] + pixels[3], pixels[2]]
    weights = tfshards.class_weights(two["a"], label_map={3: 1, 2: None})
    assert sorted(weights) == [0, 1, 255] and weights[255] == 0.0


def test_a_remapped_table_merges_classes_and_counts_ignored_pixels():
    masks = [_mask("a", i) for i in range(8)]
    table = RecordTable.from_rows((record_row(str(i), m, None) for i, m in enumerate(masks)), 4)
    lookup = np.arange(256)
    lookup[3], lookup[2] = 1, -1
    mapped = remapped_table(table, lookup, 2)
    expected = RecordTable.from_rows(
        (record_row(str(i), np.where(m == 2, 255, np.where(m == 3, 1, m)), 255)
         for i, m in enumerate(masks)), 2,
    )  # fmt: skip
    assert mapped.to_bytes() == expected.to_bytes()


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({4: 1}, r"4 is not one of its 4 classes"),
        ({-1: 1}, r"-1 is not one of its 4 classes"),
        ({1: 2.5}, r"maps to 2.5"),
        ([0, 1, 2], r"one entry per class of the dataset \(4\), got 3"),
        ("0123", r"label_map takes"),
    ],
)
def test_bad_label_maps_are_refused_before_the_first_batch(two, given, match):
    with pytest.raises(OptionsError, match=match):
        tfshards.read(two["a"], label_map=given)


def test_a_label_map_target_outside_num_classes_is_refused(two):
    with pytest.raises(OptionsError, match=r"reads classes \[3\] but the shared taxonomy has 3"):
        tfshards.read(two["a"], label_map={1: 1}, num_classes=3)
    manifest = tfshards.Manifest.load(two["a"])
    with pytest.raises(OptionsError, match="ignore label 255 is one of"):
        label_map({1: 300}, manifest, where="x")
