"""Segmentation training helpers: Keras augmentation layers on image/mask batches, and
ignore labels from conversion to the loss."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mixed_sizes, write_pairs
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
    assert moved_masks.dtype == tf.int32 and set(np.unique(moved_masks)) <= {0, 1, 255}
    # The mask is still the bright pixels of the image it came with (255: filled).
    kept = moved_masks.numpy() != 255
    agreement = np.mean((moved_images.numpy()[kept] > 0.5) == (moved_masks.numpy()[kept] == 1))
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


LEVEL = 60  # a pixel of class c is LEVEL * (c + 1): its class reads off its image


def class_levels_dataset(root: Path, ignore_label: int | None = None, count: int = 8) -> Path:
    """RGB images of 4x4 blocks of classes 0..2, each pixel LEVEL * (class + 1), never 0."""
    rng = np.random.default_rng(3)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for index in range(count):
        mask = np.kron(rng.integers(0, 3, (8, 8), dtype=np.uint8), np.ones((4, 4), np.uint8))
        image = np.stack([LEVEL * (mask + 1)] * 3, axis=-1).astype(np.uint8)
        Image.fromarray(image).save(root / "images" / f"{index:02d}.png")
        Image.fromarray(mask).save(root / "masks" / f"{index:02d}.png")
    out = root / "shards"
    tfshards.convert(root / "images", root / "masks", out, num_classes=3,
                     ignore_label=ignore_label, workers=1, progress=False)  # fmt: skip
    return out


FILLING = {
    "translation": lambda **k: keras.layers.RandomTranslation(0.4, 0.4, **k),
    "rotation": lambda **k: keras.layers.RandomRotation(0.25, **k),
    "zoom": lambda **k: keras.layers.RandomZoom((0.3, 0.6), **k),  # zoom out: fills borders
}


def filled_and_classes(images: np.ndarray, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images -> (pixels the layer filled, each other pixel's class from its level)."""
    levels = images[..., :1].astype(np.int64)
    return levels == round(fill), levels // LEVEL - 1


@pytest.mark.parametrize("image_dtype", ["uint8", "float32"])
@pytest.mark.parametrize("kind", sorted(FILLING))
@pytest.mark.parametrize("ignore_label", [None, 9])
def test_pixels_a_layer_fills_get_the_ignore_label(tmp_path, kind, image_dtype, ignore_label):
    """Pixels a layer fills (fill_mode="constant") are the ignore label in the mask (255
    when the dataset declares none), never class 0; moved pixels keep their class."""
    shards = class_levels_dataset(tmp_path, ignore_label)
    layer = FILLING[kind](fill_mode="constant", interpolation="nearest", seed=2)
    ds = tfshards.read(shards, batch_size=8, shuffle=False, augment=layer,
                       image_dtype=image_dtype, seed=0)  # fmt: skip
    images, masks = (t.numpy() for t in next(iter(ds)))
    if image_dtype == "float32":
        images = np.round(images * 255)
    filled, classes = filled_and_classes(images, 0)
    assert filled.mean() > 0.05, "the layer filled too few pixels to tell"
    label = 255 if ignore_label is None else ignore_label
    assert np.all(masks[filled] == label), np.unique(masks[filled])
    assert np.array_equal(masks[~filled], classes[~filled])


def test_filled_pixels_with_any_fill_value_one_hot_and_a_pipeline(tmp_path):
    """A fill value other than 0 (here an image level of its own) is still told from the
    classes; one-hot masks are all-zero where filled; a pipeline of layers fills twice."""
    shards = class_levels_dataset(tmp_path)
    fill = 30.0
    layer = keras.Sequential([
        keras.layers.RandomFlip("horizontal", seed=1),
        FILLING["rotation"](fill_mode="constant", interpolation="nearest", fill_value=fill,
                            seed=1),
        FILLING["translation"](fill_mode="constant", interpolation="nearest",
                               fill_value=fill, seed=1),
    ])  # fmt: skip
    for one_hot in (False, True):
        ds = tfshards.read(shards, batch_size=8, shuffle=False, augment=layer, seed=0,
                           image_dtype="uint8", one_hot=one_hot)  # fmt: skip
        images, masks = (t.numpy() for t in next(iter(ds)))
        filled, classes = filled_and_classes(images, fill)
        assert filled.mean() > 0.05
        if one_hot:
            assert masks.shape[-1] == 3 and np.all(masks[filled[..., 0]] == 0)
            labels = np.argmax(masks, axis=-1)[..., None]
            assert np.array_equal(labels[~filled], classes[~filled])
        else:
            assert np.all(masks[filled] == 255), np.unique(masks[filled])
            assert np.array_equal(masks[~filled], classes[~filled])


def test_a_plain_function_keeps_the_masks_it_makes(tmp_path):
    """A function passed as augment= is the user's: what it fills stays as it filled it."""
    shards = class_levels_dataset(tmp_path)

    def shift(image, mask):  # moves everything down by 4 rows, zeros above
        return (tf.pad(image[:-4], [[4, 0], [0, 0], [0, 0]]),
                tf.pad(mask[:-4], [[4, 0], [0, 0], [0, 0]]))  # fmt: skip

    ds = tfshards.read(shards, batch_size=8, shuffle=False, augment=shift, image_dtype="uint8")
    masks = next(iter(ds))[1].numpy()
    assert np.all(masks[:, :4] == 0)


def test_filled_pixels_on_the_per_pair_path_and_refusals(tmp_path):
    """Crops (read pair by pair) fill alike; fills that cannot be told from classes are
    refused, naming the way out."""
    shards = class_levels_dataset(tmp_path / "a")
    rotation = FILLING["rotation"](fill_mode="constant", interpolation="nearest", seed=3)
    ds = tfshards.read(shards, batch_size=8, crop_size=(24, 24), augment=rotation, seed=0,
                       image_dtype="uint8")  # fmt: skip
    images, masks = (t.numpy() for t in next(iter(ds)))
    filled, classes = filled_and_classes(images, 0)
    assert filled.mean() > 0.05 and np.all(masks[filled] == 255)
    assert np.array_equal(masks[~filled], classes[~filled])
    huge = keras.layers.RandomTranslation(0.2, 0.2, fill_mode="constant", fill_value=5000.0)
    with pytest.raises(tfshards.OptionsError, match="fill_value=5000.0.*below 1792"):
        tfshards.read(shards, batch_size=8, augment=huge)

    images_dir, masks_dir = write_pairs(tmp_path / "b", count=4, size=(16, 16), classes=256)
    every = tmp_path / "every"
    tfshards.convert(images_dir, masks_dir, every, num_classes=256, workers=1, progress=False)
    with pytest.raises(tfshards.OptionsError, match="no ignore label, while 255 is one of"):
        tfshards.read(every, batch_size=4, augment=keras.Sequential([rotation]))
    flips = keras.layers.RandomFlip(seed=1)  # fills nothing: 255 stays a class
    masks = next(iter(tfshards.read(every, batch_size=4, augment=flips)))[1].numpy()
    assert masks.max() == 255


def same_pairs_dataset(root: Path, count: int = 16) -> Path:
    """``count`` copies of one pair: batches differ only by their augmentation."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    mask = np.kron(np.random.default_rng(4).integers(0, 3, (8, 8), dtype=np.uint8),
                   np.ones((4, 4), np.uint8))  # fmt: skip
    for index in range(count):
        image = np.stack([LEVEL * (mask + 1)] * 3, axis=-1).astype(np.uint8)
        Image.fromarray(image).save(root / "images" / f"{index:02d}.png")
        Image.fromarray(mask).save(root / "masks" / f"{index:02d}.png")
    out = root / "shards"
    tfshards.convert(root / "images", root / "masks", out, num_classes=3, num_shards=2,
                     workers=1, progress=False)  # fmt: skip
    return out


def test_pipelines_draw_their_own_augmentations_reproducibly(tmp_path):
    """Input pipelines with one seed draw different augmentations, each reproducible, and
    each resumes exactly (start=)."""
    shards = same_pairs_dataset(tmp_path)

    def batches(pipeline: int, start=None, epochs: int = 2) -> list[bytes]:
        """``epochs`` iterations (each goes on where the one before stopped)."""
        context = tf.distribute.InputContext(2, pipeline, 2)
        ds = tfshards.read(
            shards, batch_size=4, seed=5, image_dtype="uint8", input_context=context,
            augment=keras.layers.RandomRotation(0.5, seed=1), start=start,
        )  # fmt: skip
        return [i.numpy().tobytes() + m.numpy().tobytes() for _ in range(epochs) for i, m in ds]

    first, second = batches(0), batches(1)
    assert len(first) == len(second) == 8  # 16 records: 4 rounds of 2 pipelines x 2
    assert all(a != b for a, b in zip(first, second, strict=True)), "the same draws"
    assert len(set(first)) == 8, "a pipeline drew alike twice"
    assert batches(0) == first and batches(1) == second
    for pipeline, whole in enumerate((first, second)):
        assert batches(pipeline, start=(0, 2), epochs=1) == whole[2:6], "resumed otherwise"


JAX_FILLS = """
import sys
import keras, numpy as np, tensorflow as tf
import tfshards
assert keras.backend.backend() == "jax", keras.backend.backend()
layer = keras.Sequential([keras.layers.RandomRotation(0.4, fill_mode="constant",
                                                      interpolation="nearest", seed=1)])
draws = []
for pipeline in (0, 1):
    context = tf.distribute.InputContext(2, pipeline, 2)
    ds = tfshards.read(sys.argv[1], batch_size=8, seed=5, image_dtype="uint8",
                       augment=layer, input_context=context)
    images, masks = (t.numpy() for t in next(iter(ds)))
    filled = images[..., :1] == 0
    assert filled.mean() > 0.05 and np.all(masks[filled] == 255), np.unique(masks[filled])
    level = int(sys.argv[2])
    assert np.array_equal(masks[~filled], images[..., :1][~filled] // level - 1)
    draws.append(filled)
assert not np.array_equal(*draws), "the pipelines drew alike"
print("jax ok")
"""


def test_fills_and_pipelines_under_the_jax_backend(tmp_path):
    shards = same_pairs_dataset(tmp_path)
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", JAX_FILLS, str(shards), str(LEVEL)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "jax ok" in run.stdout


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
