"""`tfshards demo`: synth -> convert -> read back (twice, the second from the disk cache)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tfshards.converters.convert import ConvertOptions, ConvertRun, run_conversion
from tfshards.wording import counted


def run_demo(
    workdir: Path | None = None, *, count: int = 200, size: int = 128, progress: bool = True
) -> str:
    """Run the whole round trip and return a printable summary."""
    if workdir is not None:
        return _round_trip(workdir, count, size, progress, kept=True)
    with tempfile.TemporaryDirectory(prefix="tfshards-demo-") as tmp:
        summary = _round_trip(Path(tmp), count, size, progress, kept=False)
    return summary + (
        "\n(the data, shards and cache were in a temporary folder, now deleted; "
        "pass --workdir DIR to keep them)"
    )


def _round_trip(workdir: Path, count: int, size: int, progress: bool, *, kept: bool) -> str:
    """synth, convert, read twice; folders are named only when they are kept."""
    from tfshards.converters.synth import synth
    from tfshards.readers import list_caches, read

    images, masks = synth(workdir / "data", count=count, size=size, classes=3, seed=0)
    result = run_conversion(
        images,
        masks,
        workdir / "shards",
        ConvertOptions(val_fraction=0.1, num_classes=3, seed=0),
        ConvertRun(progress=progress, overwrite=True),
    )
    lines = [
        f"synthetic data: {count} pairs of {size}x{size} RGB images, 3 classes",
        f"converted in {result.seconds:.1f} s" + (f" into {workdir / 'shards'}" if kept else ""),
    ]
    for split, info in result.manifest.splits.items():
        lines.append(
            f"  {split}: {counted(info.records, 'pair')} in {counted(len(info.shards), 'shard')}, "
            f"{info.bytes / 2**20:.1f} MiB"
        )
    train = read(workdir / "shards", split="train", batch_size=16, cache=True, seed=0)
    rates = []
    for epoch in (1, 2):
        started = time.perf_counter()
        seen = sum(int(images.shape[0]) for images, _ in train)
        seconds = time.perf_counter() - started
        rates.append(seen / seconds)
        source = "streamed and decoded, cache written" if epoch == 1 else "from the disk cache"
        lines.append(
            f"read epoch {epoch}: {seen} pairs in {seconds:.2f} s "
            f"({seen / seconds:.0f} pairs/s, {source})"
        )
    lines.append(f"epoch 2 (cached) ran {rates[1] / rates[0]:.1f}x as fast as epoch 1")
    images, masks = next(iter(train))
    lines.append(
        f"a batch: images {images.dtype.name} {tuple(images.shape)}, "
        f"masks {masks.dtype.name} {tuple(masks.shape)}"
    )
    lines += [
        f"cache: {e.path if kept else 'in the temporary folder'} ({e.state}, "
        f"{e.bytes / 2**20:.1f} MiB)"
        for e in list_caches(workdir / "shards")
    ]
    return "\n".join(lines)
