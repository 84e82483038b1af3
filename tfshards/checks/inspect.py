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
from tfshards.checks.shard_io import local_shard, shard_examples
from tfshards.errors import ManifestError
from tfshards.schemas.format import decode_pixels
from tfshards.schemas.manifest import Manifest
from tfshards.storage import Location, StorageOptions
from tfshards.wording import counted


def _class_table(summary: dict[str, Any]) -> list[str]:
    """Only the classes present; with a mask map, the source values each came from."""
    total = sum(summary["class_pixels"]) or 1
    sources: dict[int, list[int]] = {}
    for source, target in summary["mask"]["mask_map"]:
        sources.setdefault(target, []).append(source)
    lines = ["  class  from values  pixels          share   suggested weight"]
    for index, (count, weight) in enumerate(
        zip(summary["class_pixels"], summary["class_weights"], strict=True)
    ):
        if count:
            origin = ",".join(str(v) for v in sources.get(index, [index]))
            lines.append(
                f"  {index:5d}  {origin:>11s}  {count:14d}  {100 * count / total:6.2f}%  "
                f"{weight:8.3f}"
            )
    ignore = summary["mask"]["ignore_label"]
    if ignore is not None:
        ignored = summary["ignored_pixels"]
        lines.append(f"  ignored (value {ignore}): {ignored} pixels, left out of the loss")
    absent = sum(1 for count in summary["class_pixels"] if not count)
    if absent:
        lines.append(f"  ({counted(absent, 'class', 'classes')} below the largest have no pixels)")
    return lines


def class_weights(class_pixels: list[int]) -> list[float]:
    """Median-frequency balancing: weight_c = median(freq) / freq_c (0 for absent classes)."""
    present = [n for n in class_pixels if n]
    if not present:
        return [0.0] * len(class_pixels)
    median = statistics.median(present)
    return [round(median / n, 4) if n else 0.0 for n in class_pixels]


def dataset_summary(path: Location, storage_options: StorageOptions = None) -> dict[str, Any]:
    """Everything `tfshards inspect` prints, as plain data (``path`` may be a URL)."""
    manifest = Manifest.load(path, storage_options)
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
    return {
        "path": storage.resolved(path),
        "records": manifest.total_records,
        "splits": splits,
        "image": asdict(manifest.image),
        "mask": asdict(manifest.mask),
        "compression": asdict(manifest.compression),
        "seed": manifest.seed,
        "source": {k: v for k, v in manifest.source.items() if k != "fingerprint"},
        "skipped": [vars(s) for s in manifest.skipped],
        "unpaired": manifest.unpaired,
        "class_pixels": pixels_total,
        "ignored_pixels": sum(split.ignored_pixels for split in manifest.splits.values()),
        "class_weights": class_weights(pixels_total),
    }


def _padded(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    length = max(len(a), len(b))
    return list(zip(a + [0] * (length - len(a)), b + [0] * (length - len(b)), strict=True))


def summary_text(summary: dict[str, Any]) -> str:
    image = summary["image"]
    shape = f"{image['height']}x{image['width']}" if image["height"] else "mixed sizes"
    lines = [
        f"dataset {summary['path']}: {summary['records']} pairs",
        f"  images: {shape}, {image['channels']} channels, encoding {image['encoding']}; "
        f"masks: encoding {summary['mask']['encoding']}, "
        f"num_classes {summary['mask']['num_classes']}",
        f"  compression {summary['compression']['type']} (level "
        f"{summary['compression']['level']}), seed {summary['seed']}",
        f"  source: images {summary['source']['images']}, masks {summary['source']['masks']}",
    ]
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
    storage_options: StorageOptions = None,
) -> int:
    """Draw ``count`` random pairs as rows: image, coloured mask, overlay, key. Returns rows."""
    manifest = Manifest.load(path, storage_options)
    split = split or next(iter(manifest.splits))
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
                    rows.append(_preview_row(features, tile))
                index += 1
    palette = np.random.default_rng(PALETTE_SEED).integers(40, 256, size=(256, 3), dtype=np.uint8)
    palette[0] = 0
    label_height = 14
    sheet = Image.new("RGB", (3 * tile, len(rows) * (tile + label_height)), "white")
    draw = ImageDraw.Draw(sheet)
    for row, (key, image, mask) in enumerate(rows):
        top = row * (tile + label_height)
        coloured = palette[mask]
        overlay = np.where(mask[..., None] > 0, (0.5 * image + 0.5 * coloured), image)
        for column, pixels in enumerate((image, coloured, overlay.astype(np.uint8))):
            sheet.paste(
                Image.fromarray(pixels).resize((tile, tile), Image.Resampling.NEAREST),
                (column * tile, top),
            )
        draw.text((4, top + tile), key, fill="black")
    sheet.save(target)
    return len(rows)


def _preview_row(features: dict, tile: int) -> tuple[str, np.ndarray, np.ndarray]:
    height, width = features["image/height"], features["image/width"]
    image = decode_pixels(
        features["image/encoded"],
        features["image/format"].decode(),
        height,
        width,
        features["image/channels"],
    )
    mask = decode_pixels(
        features["mask/encoded"], features["mask/format"].decode(), height, width, 1
    )[:, :, 0]
    rgb = np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image[:, :, :3]
    return features["key"].decode("utf-8", "replace"), rgb, mask
