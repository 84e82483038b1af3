"""The `tfshards bench` command: options -> sweep with a progress bar -> report files."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from tfshards.benchmarking.report import markdown, write_report
from tfshards.benchmarking.sweep import SweepConfig, SweepResult, run_sweep
from tfshards.errors import OptionsError
from tfshards.schemas.format import NO_COMPRESSION

log = logging.getLogger("tfshards")


def _numbers(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise OptionsError(f"--{name} takes comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def run_bench(args: argparse.Namespace) -> int:
    if args.images and not args.masks:
        raise OptionsError("--images needs --masks")
    with tempfile.TemporaryDirectory(prefix="tfshards-bench-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        images, masks = _source(args, work)
        config = _config(args, images, masks, work)
        return _sweep_and_report(config, Path(args.report), quiet=args.quiet)


def _source(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    if args.images:
        return Path(args.images), Path(args.masks)
    from tfshards.converters.synth import synth

    count, size = args.synthetic, args.size
    if args.quick:
        count, size = min(count, 300), min(size, 64)
    return synth(work / "synthetic", count=count, size=size, seed=0)


def _config(args: argparse.Namespace, images: Path, masks: Path, work: Path) -> SweepConfig:
    if args.quick:
        return SweepConfig(
            images,
            masks,
            work,
            shards=(1, 4),
            encodings=("deflate", "raw"),
            compressions=(NO_COMPRESSION,),
            cycle_lengths=(1, 4),
            repeats=1,
            max_disk_ratio=args.max_disk_ratio,
            synthetic=not args.images,
        )
    return SweepConfig(
        images,
        masks,
        work,
        shards=_numbers(args.shards, "shards"),
        encodings=_names(args.encodings),
        compressions=_names(args.compression),
        cycle_lengths=_numbers(args.cycle_lengths, "cycle-lengths"),
        repeats=args.repeats,
        max_disk_ratio=args.max_disk_ratio,
        synthetic=not args.images,
    )


def _sweep_and_report(config: SweepConfig, report: Path, *, quiet: bool) -> int:
    steps = 2 + len(config.points) * (1 + len(config.cycle_lengths))
    result = SweepResult(config, {}, "", 0, 0)
    interrupted = False
    with tqdm(total=steps, unit="step", disable=quiet, desc="bench") as bar:

        def step(name: str) -> None:
            bar.set_postfix_str(name, refresh=False)
            bar.update(1)

        try:
            run_sweep(config, on_step=step, result=result)
        except KeyboardInterrupt:
            interrupted = True
    if not result.rows and not result.baselines:
        print("tfshards bench: interrupted before anything was measured", file=sys.stderr)
        return 130
    written = write_report(result, report)
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in written))
    if not any(p.suffix == ".png" for p in written):
        print('no plot: install matplotlib (pip install "tfshards[bench]") for throughput.png')
    if interrupted:
        print("tfshards bench: interrupted; the report holds what was measured", file=sys.stderr)
        return 130
    return 0
