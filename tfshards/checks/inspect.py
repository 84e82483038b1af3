"""`tfshards inspect`: a human (or JSON) summary of a dataset, and a preview picture."""

from __future__ import annotations

import os
import random
import statistics
from dataclasses import asdict
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from tfshards import storage
from tfshards.checks.info import class_weights, info
from tfshards.checks.shard_io import local_shard, shard_examples
from tfshards.errors import ManifestError, OptionsError
from tfshards.schemas.manifest import Manifest
from tfshards.schemas.record import decode_record
from tfshards.storage import Location, StorageOptions
from tfshards.wording import counted


def _class_table(summary: dict[str, Any]) -> list[str]:
    """Only the classes present; with a mask map, the source values each came from."""
    total = sum(summary["class_pixels"]) or 1
    binary = summary["mask"]["binary_masks"]
    sources: dict[int, list[int]] = {}
    for source, target in summary["mask"]["mask_map"]:
        sources.setdefault(target, []).append(source)
    weights = {int(k): v for k, v in summary["class_weights"].items()}
    lines = []
    if binary:  # which of 1 and 255 the files held is not recorded: no column for it
        lines.append("  masks: --binary-masks (0 -> class 0; 255, or 1, -> class 1)")
    origin_title = "" if binary else "  from values"
    lines.append(
        f"  class{origin_title}  pixels          share   weight ({summary['weights_split']}, "
        "median frequency)"
    )
    for index, count in enumerate(summary["class_pixels"]):
        if count:
            origin = ",".join(str(v) for v in sources.get(index, [index]))
            origin = "" if binary else f"  {origin:>11s}"
            lines.append(
                f"  {index:5d}{origin}  {count:14d}  {100 * count / total:6.2f}%  "
                f"{weights.get(index, 0.0):8.3f}"
            )
    ignore = summary["mask"]["ignore_label"]
    if ignore is not None:
        ignored = summary["ignored_pixels"]
        lines.append(f"  ignored (value {ignore}): {ignored} pixels, left out of the loss")
    absent = sum(1 for count in summary["class_pixels"] if not count)
    if absent:
        lines.append(f"  ({counted(absent, 'class', 'classes')} below the largest have no pixels)")
    return lines


def dataset_summary(path: Location, storage_options: StorageOptions = None) -> dict[str, Any]:
    """Everything `tfshards inspect` prints, as plain data (``path`` may be a URL)."""
    dataset = info(path, storage_options=storage_options)
    manifest = dataset.manifest
    splits = {}
    pixels_total: list[int] = []
    for name, split in manifest.splits.items():
        sizes = [s.bytes for s in split.shards]
        splits[name] = {
            "records": split.records,
            "shards": len(split.shards),
            "bytes": split.bytes,
            "shard_bytes": {
                "min": min(sizes),
                "median": int(statistics.median(sizes)),
                "max": max(sizes),
            },
        }
        pixels_total = [a + b for a, b in _padded(pixels_total, split.class_pixels)]
    weights_split = "train" if "train" in manifest.splits else next(iter(manifest.splits))
    return {
        "path": storage.resolved(path),
        "records": manifest.total_records,
        "splits": splits,
        "image": asdict(manifest.image),
        "mask": dict(
            asdict(manifest.mask), binary_masks=bool(manifest.options.get("binary_masks"))
        ),
        "num_classes": dataset.num_classes,
        "num_classes_inferred": dataset.num_classes_inferred,
        "compression": asdict(manifest.compression),
        "seed": manifest.seed,
        # --tile (docs/large-images.md): records are tiles of this size; None: whole images
        "tiles": {k: manifest.options.get(f"tile_{k}") for k in ("size", "overlap")},
        "source": {k: v for k, v in manifest.source.items() if k != "fingerprint"},
        "skipped": [vars(s) for s in manifest.skipped],
        "unpaired": manifest.unpaired,
        "class_pixels": pixels_total,
        "ignored_pixels": sum(split.ignored_pixels for split in manifest.splits.values()),
        "weights_split": weights_split,
        "class_weights": {
            str(k): v
            for k, v in class_weights(
                path, split=weights_split, storage_options=storage_options
            ).items()
        },
    }


def _padded(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    length = max(len(a), len(b))
    return list(zip(a + [0] * (length - len(a)), b + [0] * (length - len(b)), strict=True))


def summary_text(summary: dict[str, Any]) -> str:
    image = summary["image"]
    shape = f"{image['height']}x{image['width']}" if image["height"] else "mixed sizes"
    inferred = " (inferred: largest class found + 1)" if summary["num_classes_inferred"] else ""
    depth = "" if image.get("dtype", "uint8") == "uint8" else f" of {image['dtype']}"
    lines = [
        f"dataset {summary['path']}: {summary['records']} pairs",
        f"  images: {shape}, {counted(image['channels'], 'channel')}{depth}, encoding "
        f"{image['encoding']}; masks: encoding {summary['mask']['encoding']}, "
        f"num_classes {summary['num_classes']}{inferred}",
        f"  compression {summary['compression']['type']} (level "
        f"{summary['compression']['level']}), seed {summary['seed']}",
        f"  source: images {summary['source']['images']}, masks {summary['source']['masks']}",
    ]
    tiles = summary.get("tiles") or {}
    if tiles.get("size"):
        lines.append(
            f"  tiles: records are {tiles['size']}x{tiles['size']} tiles of the source images, "
            f"overlap {tiles['overlap']} (tfshards.tiles lists an image's)"
        )
    for name, split in summary["splits"].items():
        sizes = split["shard_bytes"]
        lines.append(
            f"  {name:5s} {counted(split['records'], 'pair')} in "
            f"{counted(split['shards'], 'shard')}, "
            f"{split['bytes'] / 2**20:.1f} MiB (shard min/median/max "
            f"{sizes['min'] / 2**20:.1f}/{sizes['median'] / 2**20:.1f}/"
            f"{sizes['max'] / 2**20:.1f} MiB)"
        )
    lines += _class_table(summary)
    if summary["skipped"]:
        lines.append(f"  skipped {counted(len(summary['skipped']), 'pair')}:")
        lines += [f"    {s['key']}: {s['file']}: {s['reason']}" for s in summary["skipped"][:10]]
    unpaired = {k: v for k, v in summary["unpaired"].items() if v}
    if unpaired:
        lines.append(
            "  left out at conversion: " + ", ".join(f"{v} {k}" for k, v in unpaired.items())
        )
    return "\n".join(lines)


PALETTE_SEED = 7


def write_preview(
    path: str | os.PathLike,
    target: str | os.PathLike,
    *,
    count: int = 8,
    seed: int = 0,
    split: str | None = None,
    tile: int = 160,
    bands: tuple[int, int, int] | None = None,
    storage_options: StorageOptions = None,
) -> int:
    """Draw ``count`` random pairs as rows: image, coloured mask, overlay, key. Returns rows.

    ``bands``: the three image channels (0-based) shown as red, green and blue; default
    :func:`preview_bands`. uint16 images are stretched per band between their 2nd and
    98th percentiles (:func:`preview_rgb`)."""
    manifest = Manifest.load(path, storage_options)
    bands = preview_bands(manifest.image.channels, bands)
    split = split or next(iter(manifest.splits))
    if split not in manifest.splits:  # else a KeyError from the dict
        raise ManifestError(
            f"{storage.display(path)}: no split {split!r} to preview; this dataset has "
            f"{', '.join(manifest.splits)}"
        )
    shards = manifest.splits[split].shards
    rng = random.Random(seed)
    wanted = set(
        rng.sample(
            range(manifest.splits[split].records), min(count, manifest.splits[split].records)
        )
    )
    rows, index = [], 0
    for shard in shards:
        with local_shard(path, shard.file, storage_options) as local:
            if local is None:
                raise ManifestError(f"{storage.display(storage.join(path, shard.file))}: missing")
            for features in shard_examples(local, manifest.compression.type):
                if index in wanted:
                    rows.append(_preview_row(features, manifest.image.dtype, bands))
                index += 1
    sheet = _sheet(rows, tile)
    sheet.save(target)
    return len(rows)


TITLES = ("image", "mask (classes)", "overlay")
TEXT_HEIGHT = 14  # one line of Pillow's default font, with a margin


def _sheet(rows: list[tuple[str, np.ndarray, np.ndarray]], tile: int) -> Image.Image:
    """Column titles, one row per pair (image, coloured mask, overlay, key), then a legend."""
    palette = np.random.default_rng(PALETTE_SEED).integers(40, 256, size=(256, 3), dtype=np.uint8)
    palette[0] = 0
    classes = sorted({int(v) for _, _, mask in rows for v in np.unique(mask)})
    per_line = max(1, 3 * tile // 80)
    legend_lines = -(-len(classes) // per_line)
    height = TEXT_HEIGHT + len(rows) * (tile + TEXT_HEIGHT) + legend_lines * TEXT_HEIGHT
    sheet = Image.new("RGB", (3 * tile, height), "white")
    draw = ImageDraw.Draw(sheet)
    for column, title in enumerate(TITLES):
        draw.text((column * tile + 4, 1), title, fill="black")
    for row, (key, image, mask) in enumerate(rows):
        top = TEXT_HEIGHT + row * (tile + TEXT_HEIGHT)
        coloured = palette[mask]
        overlay = np.where(mask[..., None] > 0, (0.5 * image + 0.5 * coloured), image)
        for column, pixels in enumerate((image, coloured, overlay.astype(np.uint8))):
            sheet.paste(
                Image.fromarray(pixels).resize((tile, tile), Image.Resampling.NEAREST),
                (column * tile, top),
            )
        draw.text((4, top + tile), key, fill="black")
    legend_top = TEXT_HEIGHT + len(rows) * (tile + TEXT_HEIGHT)
    for slot, value in enumerate(classes):  # a swatch and the class index
        x, y = (slot % per_line) * 80 + 4, legend_top + (slot // per_line) * TEXT_HEIGHT
        draw.rectangle(
            (x, y + 2, x + 10, y + 12), fill=tuple(int(c) for c in palette[value]), outline="black"
        )
        draw.text((x + 14, y + 1), f"class {value}", fill="black")
    return sheet


def _preview_row(
    features: dict, dtype: str, bands: tuple[int, int, int]
) -> tuple[str, np.ndarray, np.ndarray]:
    record = decode_record(features, dtype)
    return record.key, preview_rgb(record.image, bands), record.mask


def preview_bands(channels: int, bands: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """The channels a preview shows as (red, green, blue): ``bands`` when given (checked
    against ``channels``); else gray for 1 or 2 channels (the first), and the first
    three for 3 or more (RGB, RGBA without alpha; for other band orders, such as
    Sentinel-2's B1, B2, B3, B4..., pass the bands to show: 3, 2, 1 for true colour)."""
    if bands is None:
        return (0, 0, 0) if channels < 3 else (0, 1, 2)
    bands = tuple(bands)
    if len(bands) != 3 or not all(isinstance(b, int) and 0 <= b < channels for b in bands):
        raise OptionsError(
            f"bands must be three channel indices in 0..{channels - 1} (this dataset's "
            f"images have {channels} channels), got {bands}"
        )
    return bands


def preview_rgb(image: np.ndarray, bands: tuple[int, int, int]) -> np.ndarray:
    """uint8 [H, W, 3] of ``bands`` of ``image``: uint8 as stored; uint16 stretched per
    band, its 2nd percentile to 0 and its 98th to 255 (16-bit sensors fill a small part
    of 0..65535: unstretched, their images are black)."""
    picked = image[:, :, list(bands)]
    if picked.dtype == np.uint8:
        return np.ascontiguousarray(picked)
    values = picked.astype(np.float32)
    low, high = np.percentile(values, [2, 98], axis=(0, 1))
    scaled = (values - low) / np.maximum(high - low, 1) * 255
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
