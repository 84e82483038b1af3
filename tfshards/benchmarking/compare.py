"""`tfshards bench --compare-baseline`: the README's path against the hand-written Keras
pipeline, first epoch and warm epoch, on the user's own machine and data.

Ours is ``tfshards.read(shards, batch_size=32, seed=0, cache=True)`` on the default
conversion (float32 images, as Keras yields); the baseline is two
``image_dataset_from_directory`` zipped, shuffled, ``.cache(file)``, batched
(``baselines.keras_pipeline``). A round measures, alternating which goes first, each
pipeline's first epoch (its cache built from nothing) and then one warm epoch (read back
from that cache). Ratios are taken within a round (ours / Keras), so drift on a busy
machine hits both sides of each ratio alike; the report gives their median and range.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfshards.benchmarking.baselines import keras_pipeline
from tfshards.benchmarking.measure import timed_pass_cpu
from tfshards.benchmarking.sweep import machine_info
from tfshards.errors import OptionsError

BATCH = 32
OURS, KERAS = "tfshards.read(cache=True)", "keras image_dataset_from_directory + .cache(file)"
EPOCHS = ("first", "warm")
Measured = dict[tuple[str, str], tuple[float, float]]  # (pipeline, epoch) -> (pairs/s, ms)


@dataclass(frozen=True)
class CompareConfig:
    images: Path
    masks: Path
    work: Path
    rounds: int = 3

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise OptionsError(
                f"--repeats must be at least 1 for the comparison, got {self.rounds}"
            )


@dataclass
class CompareResult:
    """Per round and pipeline and epoch: (pairs/s, CPU ms per pair of this process)."""

    pairs: int = 0
    machine: dict[str, Any] = field(default_factory=dict)
    passes: list[Measured] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One row per pipeline and epoch: medians over rounds, spread (max-min)/median."""
        rows = []
        for pipeline in (OURS, KERAS):
            for epoch in EPOCHS:
                rates = [p[pipeline, epoch][0] for p in self.passes]
                cpu = [p[pipeline, epoch][1] for p in self.passes]
                rows.append(
                    {
                        "pipeline": pipeline,
                        "epoch": epoch,
                        "pairs_per_s": round(statistics.median(rates), 1),
                        "spread": round(_spread(rates), 2),
                        "cpu_ms_per_pair": round(statistics.median(cpu), 3),
                        "cpu_spread": round(_spread(cpu), 2),
                    }
                )
        return rows

    def ratios(self) -> list[dict[str, Any]]:
        """ours / Keras per round, for pairs/s and CPU per pair: median, min, max."""
        rows = []
        for epoch in EPOCHS:
            for what, index in (("pairs/s", 0), ("cpu ms per pair", 1)):
                values = [p[OURS, epoch][index] / p[KERAS, epoch][index] for p in self.passes]
                rows.append(
                    {
                        "ratio": f"{epoch} epoch {what}, ours / keras",
                        "median": round(statistics.median(values), 2),
                        "min": round(min(values), 2),
                        "max": round(max(values), 2),
                    }
                )
        return rows


def _spread(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


def run_comparison(
    config: CompareConfig, *, on_step: Callable[[str], None] | None = None
) -> CompareResult:
    """Convert once with the defaults, then ``config.rounds`` alternating rounds."""
    import tfshards
    from tfshards.converters.convert import ConvertOptions, ConvertRun, run_conversion

    step = on_step or (lambda name: None)
    shards = config.work / "compare-shards"
    report = run_conversion(
        config.images,
        config.masks,
        shards,
        ConvertOptions(),
        ConvertRun(overwrite=True, progress=False),
    )
    step("converted")
    result = CompareResult(pairs=report.manifest.total_records, machine=machine_info(config.work))
    size, channels = _image_size(config.images)
    data = _side_by_side(config)
    for number in range(config.rounds):
        measured: Measured = {}
        order = [_ours, _keras] if number % 2 == 0 else [_keras, _ours]
        for measure in order:
            measured.update(measure(config.work, shards, data, size, channels))
            step(f"round {number + 1}")
        result.passes.append(measured)
    tfshards.clear_caches(shards)
    shutil.rmtree(shards, ignore_errors=True)
    return result


def _ours(work: Path, shards: Path, data: Path, size: tuple[int, int], channels: int) -> Measured:
    import tfshards

    tfshards.clear_caches(shards)  # the first epoch builds it anew
    dataset = tfshards.read(shards, batch_size=BATCH, seed=0, cache=True)
    return {(OURS, "first"): _pass(dataset), (OURS, "warm"): _pass(dataset)}


def _keras(work: Path, shards: Path, data: Path, size: tuple[int, int], channels: int) -> Measured:
    for stale in work.glob("compare-keras-cache*"):
        stale.unlink()
    dataset = keras_pipeline(data, size, work / "compare-keras-cache", channels=channels)
    return {(KERAS, "first"): _pass(dataset), (KERAS, "warm"): _pass(dataset)}


def _pass(dataset) -> tuple[float, float]:
    count, seconds, cpu = timed_pass_cpu(dataset)
    return count / seconds, 1000 * cpu / count


def _image_size(images: Path) -> tuple[tuple[int, int], int]:
    from PIL import Image

    first = min(p for p in images.iterdir() if p.is_file())
    with Image.open(first) as image:
        return (image.height, image.width), 1 if image.mode in ("L", "I;16") else 3


def _side_by_side(config: CompareConfig) -> Path:
    """image_dataset_from_directory wants images/ and masks/ side by side: links to them."""
    data = config.work / "compare-baseline-data"
    if not data.exists():
        data.mkdir(parents=True)
        (data / "images").symlink_to(config.images.resolve())
        (data / "masks").symlink_to(config.masks.resolve())
    return data


def compare_markdown(result: CompareResult, *, note: str = "") -> str:
    """The report: what was run, the rows, the ratios."""
    lines = [
        "# tfshards bench --compare-baseline",
        "",
        f"{result.pairs} pairs, batch {BATCH}, float32 images; {_machine(result.machine)}; page "
        f"cache warm; {len(result.passes)} rounds, alternating which pipeline goes first; medians, "
        "spread = (max - min) / median; CPU = this process's user + system time.",
    ]
    if note:
        lines += ["", note]
    lines += ["", _table(result.rows()), "", _table(result.ratios())]
    return "\n".join(lines)


def _machine(machine: dict[str, Any]) -> str:
    return (
        f"{machine.get('cores')} cores, {machine.get('ram_gib')} GiB RAM, "
        f"{machine.get('platform')}, TensorFlow {machine.get('tensorflow')}"
    )


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)
