"""A synthetic segmentation dataset: images with random shapes, masks with their classes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from tfshards.arguments import checked_bool, checked_int, checked_path, checked_size, is_int
from tfshards.errors import OptionsError

_PALETTE_SEED = 1234


def synth(
    out: str | os.PathLike,
    *,
    count: int = 200,
    size: int | tuple[int, int] = 256,
    classes: int = 3,
    seed: int = 0,
    image_format: str = "png",
    palette_masks: bool = False,
    channels: int = 3,
) -> tuple[Path, Path]:
    """Write ``count`` pairs to ``out/images`` and ``out/masks``; return the two folders.

    Class 0 is background; each other class is drawn as ellipses and rectangles
    with its own colour plus noise, so a small model can learn to segment it.

    >>> images, masks = synth("data", count=20, size=64, classes=3)  # doctest: +SKIP
    """
    checked_path("out", out)
    checked_int("count", count, low=1)
    checked_int("classes", classes, low=2, high=257)
    checked_int("seed", seed, low=0)
    checked_bool("palette_masks", palette_masks)
    if is_int(size):
        size = (checked_int("size", size, low=1),) * 2
    height, width = checked_size("size", size)
    checked_int("channels", channels)
    if image_format not in ("png", "jpeg"):
        raise OptionsError(f"image_format must be png or jpeg, got {image_format!r}")
    if channels not in (1, 3):
        raise OptionsError(f"channels must be 1 or 3, got {channels}")
    images, masks = Path(out, "images"), Path(out, "masks")
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    colours = np.random.default_rng(_PALETTE_SEED).integers(0, 256, size=(classes, 3))
    rng = np.random.default_rng(seed)
    suffix = "png" if image_format == "png" else "jpg"
    for index in range(count):
        image, mask = _pair(rng, height, width, classes, colours)
        if channels == 1:
            image = image.convert("L")
        image.save(images / f"{index:05d}.{suffix}", quality=95)
        if palette_masks:
            mask = mask.convert("P")
            mask.putpalette(colours.astype(np.uint8).ravel().tolist())
        mask.save(masks / f"{index:05d}.png")
    return images, masks


def _pair(rng: np.random.Generator, height: int, width: int, classes: int, colours: np.ndarray):
    mask = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(mask)
    for _ in range(int(rng.integers(1, 6))):
        label = int(rng.integers(1, classes))
        x0, x1 = sorted(rng.integers(0, width, size=2).tolist())
        y0, y1 = sorted(rng.integers(0, height, size=2).tolist())
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x0, y0, max(x1, x0 + 2), max(y1, y0 + 2)), fill=label)
    labels = np.asarray(mask)
    noise = rng.normal(0, 20, size=(height, width, 3))
    pixels = np.clip(colours[labels] + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB"), mask
