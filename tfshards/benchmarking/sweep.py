"""`tfshards bench`: convert and read with every combination of shard count, encoding,
compression and cycle length, beside the hand-written baselines, on the user's own data."""

from __future__ import annotations

import itertools
import logging
import os
import platform
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from tfshards.benchmarking.baselines import ceiling_pipeline, keras_pipeline, list_files_pipeline
from tfshards.benchmarking.measure import (
    PeakRss,
    drop_page_cache,
    median_and_spread,
    timed_pass,
    timed_pass_cpu,
)
from tfshards.errors import OptionsError
from tfshards.schemas.format import NO_COMPRESSION

log = logging.getLogger("tfshards")
BATCH = 32
MIN_PASSES = 3  # a recommendation rests on the median of at least this many passes


@dataclass(frozen=True)
class SweepConfig:
    images: Path
    masks: Path
    work: Path
    shards: tuple[int, ...] = (1, 4, 16, 64)
    encodings: tuple[str, ...] = ("deflate", "keep", "raw")
    compressions: tuple[str, ...] = (NO_COMPRESSION, "gzip")
    cycle_lengths: tuple[int, ...] = (1, 4, 16)
    repeats: int = 3
    max_disk_ratio: float = 4.0
    synthetic: bool = False  # the inputs are a temporary synthetic dataset
    note: str = ""  # what the report should say about the data (e.g. --quick's reduced size)

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise OptionsError(f"repeats must be at least 1, got {self.repeats}")
        if not (self.shards and self.encodings and self.compressions and self.cycle_lengths):
            raise OptionsError("every sweep dimension needs at least one value")
        if min(self.shards) < 1 or min(self.cycle_lengths) < 1:
            raise OptionsError("shard counts and cycle lengths must be at least 1")

    @property
    def points(self) -> list[tuple[int, str, str]]:
        """The conversions to make: (shards, encoding, compression)."""
        return list(itertools.product(self.shards, self.encodings, self.compressions))


@dataclass
class SweepResult:
    config: SweepConfig
    machine: dict[str, Any]
    page_cache: str
    source_bytes: int
    pairs: int
    baselines: dict[str, float] = field(default_factory=dict)
    pair_pixels: int = 0  # bytes of one decoded pair (image and mask, uint8)
    rows: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False

    def recommendation(self) -> dict[str, Any] | None:
        """The fastest cold-stream row within the disk budget, with its commands (None
        without one, or with fewer than MIN_PASSES passes per point: see why_no_recommendation).
        """
        fitting = [r for r in self.rows if r["disk_ratio"] <= self.config.max_disk_ratio]
        if not fitting or self.config.repeats < MIN_PASSES:
            return None
        best = max(fitting, key=lambda r: r["cold_pairs_per_s"])
        images, masks = (
            ("YOUR_IMAGES", "YOUR_MASKS")
            if self.config.synthetic
            else (self.config.images, self.config.masks)
        )
        command = (
            f"tfshards convert --images {images} --masks "
            f"{masks} --out SHARDS --num-shards {best['shards']} "
            f"--encoding {best['encoding']} --compression {best['compression']}"
        )
        reader = (
            f"tfshards.read('SHARDS', options=tfshards.ReadOptions("
            f"cycle_length={best['cycle_length']}))"
        )
        return {
            "row": best,
            "convert": command,
            "read": reader,
            "rule": f"highest cold pairs/s with bytes <= {self.config.max_disk_ratio}x the source",
        }

    def why_no_recommendation(self) -> str:
        if self.config.repeats < MIN_PASSES:
            return (
                f"No recommendation: it needs the median of at least {MIN_PASSES} passes per "
                f"point, and this run made {self.config.repeats} (--repeats {MIN_PASSES})."
            )
        return (
            f"No configuration fits within {self.config.max_disk_ratio}x the source bytes; "
            "raise --max-disk-ratio."
        )

    def warm_slower(self) -> str | None:
        """Why warm (cached) epochs were slower than cold streams, when some were."""
        slower = [r for r in self.rows if r["warm_pairs_per_s"] < r["cold_pairs_per_s"]]
        if not slower:
            return None
        pixels = self.pairs * self.pair_pixels
        return (
            f"Warm epochs were slower than cold ones in {len(slower)} of {len(self.rows)} rows. "
            "Warm epochs read the disk cache of decoded uint8 pixels (its build, the first "
            "cached pass, is not timed); cold epochs stream the shards and decode them. The "
            f"cache holds {pixels / 2**20:.1f} MiB of pixels against "
            f"{min(r['bytes'] for r in slower) / 2**20:.1f} MiB of shards, and each epoch "
            "opens the cache's part files and refills the shuffle buffer: with small data "
            "(here an epoch takes "
            f"{1000 * self.pairs / max(r['cold_pairs_per_s'] for r in slower):.0f} ms or less)"
            " those fixed costs outweigh decoding, which the cache saves. Measure with "
            "more or larger pairs to see the cache's gain."
        )

    def to_json(self) -> dict[str, Any]:
        config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.config).items()}
        return {
            "config": config,
            "machine": self.machine,
            "page_cache": self.page_cache,
            "pairs": self.pairs,
            "source_bytes": self.source_bytes,
            "baselines_pairs_per_s": self.baselines,
            "pair_pixels": self.pair_pixels,
            "warm_slower": self.warm_slower(),
            "rows": self.rows,
            "complete": self.complete,
            "recommendation": self.recommendation(),
        }


def machine_info(work: Path) -> dict[str, Any]:
    import tensorflow as tf

    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "ram_gib": round(pages * os.sysconf("SC_PAGE_SIZE") / 2**30, 1) if pages else None,
        "disk_free_gib": round(shutil.disk_usage(work).free / 2**30, 1),
        "tensorflow": tf.__version__,
    }


def run_sweep(
    config: SweepConfig,
    *,
    on_step: Callable[[str], None] | None = None,
    result: SweepResult | None = None,
) -> SweepResult:
    """Measure baselines, then every point; fills ``result`` as it goes (for Ctrl-C)."""
    from tfshards.converters.pairing import checked_pairs, pair_files

    step = on_step or (lambda name: None)
    config.work.mkdir(parents=True, exist_ok=True)
    pairs = checked_pairs(
        pair_files(config.images, config.masks), allow_unpaired=False, where=str(config.images)
    )
    source_bytes = sum(p.image.stat().st_size + p.mask.stat().st_size for p in pairs)
    result = result or SweepResult(config, {}, "", 0, 0)
    result.source_bytes, result.pairs = source_bytes, len(pairs)
    result.machine = machine_info(config.work)
    dropped = drop_page_cache()
    result.page_cache = (
        "dropped before each cold pass"
        if dropped
        else "page cache warm (dropping caches is not permitted here)"
    )
    with Image.open(pairs[0].image) as first:
        size, channels = (first.height, first.width), 1 if first.mode in ("L", "I;16") else 3
    result.pair_pixels = size[0] * size[1] * (channels + 1)
    _measure_baselines(config, result, size, channels, step, dropped)
    for shards, encoding, compression in config.points:
        out = config.work / f"shards-{shards}-{encoding}-{compression}"
        row_base = _convert_point(config, out, shards, encoding, compression, source_bytes)
        step(f"converted {out.name}")
        ceiling = _median_rate(config.repeats, ceiling_pipeline(out), cold=dropped)
        for cycle in config.cycle_lengths:
            result.rows.append(
                _read_point(
                    config, out, dict(row_base, cycle_length=cycle), result, ceiling, dropped, size
                )
            )
            step(f"read {out.name} cycle {cycle}")
        shutil.rmtree(out, ignore_errors=True)
    result.complete = True
    return result


def _measure_baselines(config, result, size, channels, step, dropped: bool) -> None:
    data = config.work / "baseline-data"
    if not data.exists():  # image_dataset_from_directory wants the two folders side by side
        data.mkdir()
        (data / "images").symlink_to(config.images.resolve())
        (data / "masks").symlink_to(config.masks.resolve())
    cache_file = config.work / "keras-cache"
    for stale in config.work.glob("keras-cache*"):
        stale.unlink()
    keras = keras_pipeline(data, size, cache_file, channels=channels)
    if dropped:  # the same cold start as tfshards' cold passes
        drop_page_cache()
    first = _rate(keras)
    cached = [_rate(keras) for _ in range(config.repeats)]
    result.baselines["keras_first_epoch"] = round(first, 1)
    result.baselines["keras_disk_cached"] = round(median_and_spread(cached)[0], 1)
    step("baseline keras")
    listed = list_files_pipeline(config.images, config.masks, channels=channels)
    _rate(listed)
    rates = []
    for _ in range(config.repeats):
        if dropped:  # cold, like tfshards' cold passes
            drop_page_cache()
        rates.append(_rate(listed))
    result.baselines["list_files_map"] = round(median_and_spread(rates)[0], 1)
    step("baseline list_files")


def _convert_point(
    config, out: Path, shards: int, encoding: str, compression: str, source_bytes: int
) -> dict[str, Any]:
    from tfshards.converters.convert import ConvertOptions, ConvertRun, run_conversion

    report = run_conversion(
        config.images,
        config.masks,
        out,
        ConvertOptions(num_shards=shards, encoding=encoding, compression=compression),
        ConvertRun(overwrite=True, progress=False),
    )
    shard_bytes = sum(s.bytes for split in report.manifest.splits.values() for s in split.shards)
    return {
        "shards": len(report.manifest.splits["train"].shards),
        "encoding": encoding,
        "compression": compression,
        "convert_s": round(report.seconds, 2),
        "convert_pairs_per_s": round(report.manifest.total_records / report.seconds, 1),
        "bytes": shard_bytes,
        "disk_ratio": round(shard_bytes / source_bytes, 3),
    }


def _read_point(
    config,
    out: Path,
    row: dict[str, Any],
    result: SweepResult,
    ceiling: float,
    dropped: bool,
    size: tuple[int, int],
) -> dict[str, Any]:
    import tfshards

    options = tfshards.ReadOptions(cycle_length=row["cycle_length"])
    with PeakRss() as rss:
        stream = tfshards.read(out, batch_size=BATCH, seed=0, options=options)
        _rate(stream)  # warm-up pass
        cold = []
        for _ in range(config.repeats):
            if dropped:
                drop_page_cache()
            cold.append(_rate_and_cpu(stream))
        cached = tfshards.read(
            out, batch_size=BATCH, seed=0, options=options, cache=config.work / "cache"
        )
        _rate(cached)  # builds the cache
        warm = [_rate_and_cpu(cached) for _ in range(config.repeats)]
    tfshards.clear_caches(config.work / "cache")
    cold_rate, cold_spread = median_and_spread([rate for rate, _ in cold])
    warm_rate, warm_spread = median_and_spread([rate for rate, _ in warm])
    keras = result.baselines["keras_first_epoch"]
    return dict(
        row,
        cold_pairs_per_s=round(cold_rate, 1),
        cold_spread=round(cold_spread, 3),
        cold_mb_per_s=round(cold_rate * row["bytes"] / result.pairs / 1e6, 1),
        cold_cpu_ms_per_pair=round(median_and_spread([cpu for _, cpu in cold])[0], 3),
        warm_pairs_per_s=round(warm_rate, 1),
        warm_spread=round(warm_spread, 3),
        warm_cpu_ms_per_pair=round(median_and_spread([cpu for _, cpu in warm])[0], 3),
        peak_rss_mib=round(rss.peak_mib, 1),
        cold_vs_keras=round(cold_rate / keras, 2),
        warm_vs_keras_cached=round(warm_rate / result.baselines["keras_disk_cached"], 2),
        cold_vs_ceiling=round(cold_rate / ceiling, 2),
    )


def _rate(dataset) -> float:
    count, seconds = timed_pass(dataset)
    return count / seconds


def _rate_and_cpu(dataset) -> tuple[float, float]:
    """(pairs/s, process CPU milliseconds per pair) of one pass."""
    count, seconds, cpu = timed_pass_cpu(dataset)
    return count / seconds, 1000 * cpu / count


def _median_rate(repeats: int, dataset, *, cold: bool) -> float:
    """A warm-up pass, then the median of ``repeats`` timed passes (cold: cache dropped)."""
    _rate(dataset)
    rates = []
    for _ in range(repeats):
        if cold:  # compared with cold tfshards passes, so measured the same way
            drop_page_cache()
        rates.append(_rate(dataset))
    return median_and_spread(rates)[0]
