"""Segmentation training helpers: Keras augmentation layers on image/mask batches, and
ignore labels from conversion to the loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tfshards

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def bright_pixels_dataset(root: Path, count: int = 16, size: int = 32) -> Path:
    """Grayscale images of 4x4 blocks, black or white; the mask is 1 where white."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for index in range(count):
        blocks = rng.integers(0, 2, (size // 4, size // 4), dtype=np.uint8)
        mask = np.kron(blocks, np.ones((4, 4), np.uint8))
        Image.fromarray(mask * 255).save(root / "images" / f"{index:02d}.png")
        Image.fromarray(mask).save(root / "masks" / f"{index:02d}.png")
    out = root / "shards"
    tfshards.convert(root / "images", root / "masks", out, num_classes=2, workers=1, progress=False)
    return out


def layers(seed: int):
    return keras.Sequential(
        [
            keras.layers.RandomFlip("horizontal_and_vertical", seed=seed),
            keras.layers.RandomRotation(0.25, fill_mode="constant", seed=seed),
            keras.layers.RandomZoom(0.2, fill_mode="constant", seed=seed),
            keras.layers.RandomCrop(24, 24, seed=seed),
        ]
    )


def test_keras_layers_move_masks_with_their_images(tmp_path):
    shards = bright_pixels_dataset(tmp_path)
    plain = tfshards.read(shards, batch_size=16, shuffle=False)
    augmented = tfshards.read(shards, batch_size=16, shuffle=False, augment=layers(seed=1))
    (images, _), (moved_images, moved_masks) = next(iter(plain)), next(iter(augmented))
    assert moved_images.shape == (16, 24, 24, 1) and moved_masks.shape == (16, 24, 24, 1)
    assert moved_masks.dtype == tf.int32 and set(np.unique(moved_masks)) <= {0, 1}
    # The mask is still the bright pixels of the image it came with.
    agreement = np.mean((moved_images.numpy() > 0.5) == (moved_masks.numpy() == 1))
    assert agreement > 0.95, agreement
    assert not np.array_equal(moved_images.numpy()[:, 4:28, 4:28], images.numpy()[:, 4:28, 4:28])


def test_keras_layers_are_random_every_epoch_and_reproducible_with_a_seed(tmp_path):
    shards = bright_pixels_dataset(tmp_path)

    def first_batch(dataset):
        return next(iter(dataset))[0].numpy()

    ds = tfshards.read(shards, batch_size=16, shuffle=False, augment=layers(seed=3))
    assert not np.array_equal(first_batch(ds), first_batch(ds)), "the same every epoch"
    again = tfshards.read(shards, batch_size=16, shuffle=False, augment=layers(seed=3))
    ds = tfshards.read(shards, batch_size=16, shuffle=False, augment=layers(seed=3))
    assert np.array_equal(first_batch(ds), first_batch(again))


def test_a_plain_function_still_augments_each_pair(tmp_path):
    shards = bright_pixels_dataset(tmp_path)

    def flip(image, mask):
        return tf.reverse(image, [1]), tf.reverse(mask, [1])

    (images, masks), (flipped, flipped_masks) = (
        next(iter(tfshards.read(shards, batch_size=4, shuffle=False, augment=a)))
        for a in (None, flip)
    )
    assert np.array_equal(flipped.numpy(), images.numpy()[:, :, ::-1])
    assert np.array_equal(flipped_masks.numpy(), masks.numpy()[:, :, ::-1])


def voc_like(root: Path, count: int = 12) -> tuple[Path, Path]:
    """Masks with classes 0..2 and a 255 border to ignore, as VOC draws object outlines."""
    rng = np.random.default_rng(1)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for index in range(count):
        mask = np.kron(rng.integers(0, 3, (4, 4), dtype=np.uint8), np.ones((4, 4), np.uint8))
        mask[0, :] = 255
        image = (mask.astype(np.int32) * 80 % 256).astype(np.uint8)
        Image.fromarray(np.stack([image] * 3, axis=-1)).save(root / "images" / f"{index:02d}.png")
        Image.fromarray(mask).save(root / "masks" / f"{index:02d}.png")
    return root / "images", root / "masks"


def test_ignore_label_from_conversion_to_the_loss(tmp_path):
    images, masks = voc_like(tmp_path / "data")
    out = tmp_path / "out"
    with pytest.raises(tfshards.PairError, match="not below --num-classes 3"):
        tfshards.convert(images, masks, out, num_classes=3, workers=1, progress=False)
    manifest = tfshards.convert(
        images, masks, out, num_classes=3, ignore_label=255, workers=1, progress=False
    )
    train = manifest.splits["train"]
    assert manifest.mask.ignore_label == 255 and len(train.class_pixels) == 3
    assert train.mask_values == [0, 1, 2] and train.ignored_pixels == 12 * 16
    assert tfshards.verify(out).ok
    one_hot = next(iter(tfshards.read(out, batch_size=12, shuffle=False, one_hot=True)))[1]
    assert one_hot.shape[-1] == 3
    assert np.all(one_hot.numpy()[:, 0] == 0), "ignored pixels are all-zero vectors"
    assert np.all(one_hot.numpy()[:, 1:].sum(-1) == 1)

    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(3, 1)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=255)
    model.compile(keras.optimizers.Adam(0.05), loss)
    history = model.fit(tfshards.read(out, batch_size=4, seed=0), epochs=8, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def mixed_sizes(root: Path) -> Path:
    """Records of four sizes; each mask is 1 where the image is bright, 0 elsewhere."""
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


@pytest.mark.parametrize("cache", [None, "disk"])
def test_variable_sizes_train_on_random_crops_and_evaluate_padded(tmp_path, cache):
    shards = mixed_sizes(tmp_path)
    where = tmp_path / "cache" if cache else None
    with pytest.raises(tfshards.OptionsError, match="crop_size=.*pad_to=.*batch_size=1"):
        tfshards.read(shards)
    crops = tfshards.read(
        shards, batch_size=4, crop_size=(16, 16), cache=where, seed=0, image_dtype="uint8",
        options=tfshards.ReadOptions(crop_scale=(0.8, 1.25)),
    )  # fmt: skip
    epochs = [[(i.numpy(), m.numpy()) for i, m in crops] for _ in range(3)]
    for epoch in epochs:
        assert sum(len(i) for i, _ in epoch) == 12
        for images, masks in epoch:
            assert images.shape[1:] == (16, 16, 1) and masks.shape[1:] == (16, 16, 1)
            inside = masks != 255  # padding of the 12x12 records, with the default pad label
            agreement = np.mean((images[inside] > 127) == (masks[inside] == 1))
            assert agreement > 0.9, agreement  # each mask still covers its image's bright pixels
    assert not np.array_equal(epochs[1][0][0], epochs[2][0][0]), "new crops every epoch"
    if cache:
        assert [e.state for e in tfshards.list_caches(where)] == ["ready"]
    padded = tfshards.read(shards, batch_size=12, pad_to=(40, 50), shuffle=False, cache=where)
    images, masks = next(iter(padded))
    assert images.shape == (12, 40, 50, 1)
    assert int(np.sum(masks.numpy() != 255)) == 3 * (20 * 32 + 40 * 24 + 12 * 12 + 32 * 48)
    native = tfshards.read(shards, batch_size=1, shuffle=False, cache=where)
    sizes = sorted({tuple(i.shape[1:3]) for i, _ in native})
    assert sizes == [(12, 12), (20, 32), (32, 48), (40, 24)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger than pad_to"):
        list(tfshards.read(shards, batch_size=12, pad_to=(16, 16), shuffle=False))
