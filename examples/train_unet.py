"""Train a small Keras UNet on tfshards.read(cache=True), then evaluate in a new process.

    python examples/train_unet.py                      # synthetic data
    python examples/train_unet.py --images data/images --masks data/masks --num-classes 2 \
        --mask-map 0:0,255:1 --size 256

The evaluation runs in a separate Python process that reads the disk cache the
training run built: its log line "reading the disk cache ... (no decoding)"
shows it did not decode the shards again.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path


def unet(size: int, channels: int, classes: int):
    import keras
    from keras import layers

    def block(x, filters):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        return layers.Conv2D(filters, 3, padding="same", activation="relu")(x)

    inputs = keras.Input((size, size, channels))
    skips, x = [], inputs
    for filters in (16, 32):
        x = block(x, filters)
        skips.append(x)
        x = layers.MaxPooling2D()(x)
    x = block(x, 64)
    for filters, skip in zip((32, 16), reversed(skips), strict=True):
        x = layers.Conv2DTranspose(filters, 2, strides=2, padding="same")(x)
        x = block(layers.Concatenate()([x, skip]), filters)
    outputs = layers.Conv2D(classes, 1, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def evaluate(shards: str, model_path: str, size: int) -> None:
    """Runs in the second process: reuse the cache, evaluate, print the metrics."""
    import keras

    import tfshards

    val = tfshards.read(shards, split="val", batch_size=16, image_size=(size, size), cache=True)
    model = keras.models.load_model(model_path)
    loss, accuracy = model.evaluate(val, verbose=0)
    print(f"evaluate (new process): loss {loss:.3f}, pixel accuracy {accuracy:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", help="image folder (default: synthetic data)")
    parser.add_argument("--masks", help="mask folder")
    parser.add_argument("--num-classes", type=int, default=3)
    parser.add_argument("--mask-map", help="e.g. 0:0,255:1 for 0/255 masks")
    parser.add_argument("--size", type=int, default=64, help="training image side")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workdir", help="keep shards and model here (default: temporary)")
    parser.add_argument("--evaluate", nargs=2, metavar=("SHARDS", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.evaluate:
        evaluate(*args.evaluate, args.size)
        return
    with tempfile.TemporaryDirectory(prefix="tfshards-unet-") as tmp:
        train_and_evaluate(args, Path(args.workdir or tmp))


def train_and_evaluate(args: argparse.Namespace, workdir: Path) -> None:
    import tfshards
    from tfshards.converters.options import parse_mask_map

    if args.images is None:
        images, masks = tfshards.synth(
            workdir / "data", count=240, size=args.size, classes=args.num_classes
        )
    else:
        images, masks = Path(args.images), Path(args.masks)
    shards = workdir / "shards"
    manifest = tfshards.convert(
        images,
        masks,
        shards,
        val_fraction=0.2,
        num_classes=args.num_classes,
        seed=0,
        mask_map=parse_mask_map(args.mask_map) if args.mask_map else None,
        overwrite=True,
        resize=(args.size, args.size),
    )
    channels = manifest.image.channels
    image_size = (args.size, args.size)
    train = tfshards.read(
        shards, split="train", batch_size=16, image_size=image_size, cache=True, seed=0
    )
    val = tfshards.read(shards, split="val", batch_size=16, image_size=image_size, cache=True)
    model = unet(args.size, channels, args.num_classes)
    # shuffle=False: the dataset reshuffles itself each epoch; Keras only warns for tf.data.
    model.fit(train, validation_data=val, epochs=args.epochs, verbose=2, shuffle=False)
    model_path = str(workdir / "unet.keras")
    model.save(model_path)
    print("training done; evaluating in a new process that reuses the disk cache:")
    subprocess.run(
        [sys.executable, __file__, "--size", str(args.size), "--evaluate", str(shards), model_path],
        check=True,
    )


if __name__ == "__main__":
    main()
