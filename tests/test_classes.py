"""The class count and class weights a model needs, from one place: tfshards.info and
tfshards.class_weights, used by inspect, the TFDS metadata and Keras' class_weight."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import write_pairs
from PIL import Image

import tfshards
from tfshards import OptionsError, convert
from tfshards.checks.inspect import PALETTE_SEED, write_preview
from tfshards.cli import main


def skewed_pairs(root, count=6, *, ignore: int | None = None):
    """Masks mostly class 0, some 1, few 2 (and a corner of ``ignore`` when given)."""
    images, masks = write_pairs(root, count, size=(8, 8))
    rng = np.random.default_rng(1)
    for path in sorted(masks.iterdir()):
        labels = rng.choice(3, size=(8, 8), p=[0.7, 0.2, 0.1]).astype(np.uint8)
        if ignore is not None:
            labels[:2, :2] = ignore
        Image.fromarray(labels).save(path)
    return images, masks


def test_info_gives_the_class_count_declared_or_inferred(tmp_path):
    images, masks = skewed_pairs(tmp_path / "data")
    convert(images, masks, tmp_path / "plain", workers=1, progress=False)
    plain = tfshards.info(tmp_path / "plain")
    assert (plain.num_classes, plain.num_classes_inferred) == (3, True)
    convert(images, masks, tmp_path / "five", num_classes=5, workers=1, progress=False)
    declared = tfshards.info(tmp_path / "five")
    assert (declared.num_classes, declared.num_classes_inferred) == (5, False)
    mapped = ((0, 0), (1, 1), (2, 3))
    convert(images, masks, tmp_path / "mapped", mask_map=mapped, workers=1, progress=False)
    assert tfshards.info(tmp_path / "mapped").num_classes == 4


def test_class_weights_follow_the_manifest_counts(tmp_path):
    images, masks = skewed_pairs(tmp_path / "data", ignore=255)
    out = tmp_path / "out"
    convert(images, masks, out, ignore_label=255, val_fraction=0.3, workers=1, progress=False)
    pixels = tfshards.Manifest.load(out).splits["train"].class_pixels
    median = float(np.median(pixels))
    assert tfshards.class_weights(out) == pytest.approx(
        {0: median / pixels[0], 1: median / pixels[1], 2: median / pixels[2], 255: 0.0}
    )
    inverse = tfshards.class_weights(out, split="val", method="inverse_frequency")
    val = tfshards.Manifest.load(out).splits["val"].class_pixels
    assert inverse == pytest.approx({c: sum(val) / (3 * val[c]) for c in range(3)} | {255: 0.0})
    with pytest.raises(OptionsError, match="median_frequency, inverse_frequency"):
        tfshards.class_weights(out, method="balanced")
    with pytest.raises(tfshards.ManifestError, match="no split 'test'"):
        tfshards.class_weights(out, split="test")


def test_inspect_prints_the_same_class_count_and_weights(tmp_path, capsys):
    images, masks = skewed_pairs(tmp_path / "data")
    out = tmp_path / "out"
    convert(images, masks, out, workers=1, progress=False)
    weights = tfshards.class_weights(out)
    assert main(["inspect", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["class_weights"] == {str(k): v for k, v in weights.items()}
    assert summary["num_classes"] == 3 and summary["num_classes_inferred"]
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "num_classes 3 (inferred: largest class found + 1)" in text
    for cls, weight in weights.items():
        assert re.search(rf"^\s+{cls}\s+.*%\s+{weight:.3f}$", text, flags=re.M), text


def test_keras_weighs_the_loss_with_class_weights_as_computed_by_hand(tmp_path):
    import keras

    images, masks = skewed_pairs(tmp_path / "data")
    out = tmp_path / "out"
    convert(images, masks, out, workers=1, progress=False)
    weights = tfshards.class_weights(out)
    batch = tfshards.read(out, batch_size=6, shuffle=False)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(3, 1)])
    model.compile(
        keras.optimizers.SGD(learning_rate=0.0),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(batch, class_weight=weights, epochs=1, verbose=0)
    image, mask = (t.numpy() for t in next(iter(batch)))
    logits = model.predict(image, verbose=0).astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    labels = mask[..., 0]
    cross_entropy = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    pixel_weights = np.vectorize(weights.get)(labels)
    by_hand = (pixel_weights * cross_entropy).sum() / labels.size
    assert history.history["loss"][0] == pytest.approx(by_hand, rel=1e-5)


def test_preview_has_column_titles_and_a_class_legend(tmp_path):
    images, masks = skewed_pairs(tmp_path / "data")
    out = tmp_path / "out"
    convert(images, masks, out, workers=1, progress=False)
    assert write_preview(out, tmp_path / "p.png", count=2, tile=96) == 2
    sheet = np.asarray(Image.open(tmp_path / "p.png").convert("RGB"))
    titles, legend = sheet[:14], sheet[-14:]
    for column in range(3):  # text in each column's title band
        assert (titles[:, column * 96 : (column + 1) * 96] < 128).any()
    palette = np.random.default_rng(PALETTE_SEED).integers(40, 256, size=(256, 3), dtype=np.uint8)
    for cls in (1, 2):  # each class's colour is in the legend
        assert (legend.reshape(-1, 3) == palette[cls]).all(axis=1).any()


JAX_SCRIPT = """
import keras, numpy as np, tfshards
assert keras.backend.backend() == "jax", keras.backend.backend()
train = tfshards.read("out", batch_size=4, image_dtype="uint8", cache=True, seed=0)
model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255),
                          keras.layers.Conv2D(3, 1)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(train, epochs=2, class_weight=tfshards.class_weights("out"), verbose=0)
assert all(np.isfinite(history.history["loss"])), history.history
print("fit on jax")
"""


def test_model_fit_on_read_with_the_jax_backend(tmp_path):
    import os
    import subprocess
    import sys

    images, masks = skewed_pairs(tmp_path / "data")
    convert(images, masks, tmp_path / "out", workers=1, progress=False)
    done = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu"),
        timeout=300,
    )
    assert done.returncode == 0 and "fit on jax" in done.stdout, done.stderr[-3000:]
