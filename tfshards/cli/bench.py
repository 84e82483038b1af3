"""The `tfshards bench` command: its arguments, then sweep with a progress bar -> report files."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from tfshards import storage
from tfshards.benchmarking.report import markdown, write_report
from tfshards.benchmarking.sweep import MIN_PASSES, SweepConfig, SweepResult, run_sweep
from tfshards.cli.datasets import add_storage_option
from tfshards.errors import OptionsError
from tfshards.schemas.format import NO_COMPRESSION

log = logging.getLogger("tfshards")
CACHE_LOGGER = "tfshards.readers.cache"  # the disk cache's modules log under it


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure shard counts, encodings and compression on your data and disk",
        description="Convert and read with every combination, beside the hand-written "
        "baselines (the Keras image_dataset_from_directory pipeline, list_files + map) and the "
        "bare TFRecordDataset ceiling; write results.csv, results.json, report.md and "
        "throughput.png (with the 'bench' extra) and recommend a configuration.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--images",
        help="image folder (with --masks); a URL such as s3://bucket/images is copied into "
        "--work first, and the sweep measures this machine's disk",
    )
    source.add_argument("--synthetic", type=int, metavar="N", help="use N synthetic pairs")
    p.add_argument("--masks", help="mask folder or URL")
    p.add_argument("--size", type=int, default=256, help="synthetic image side (default 256)")
    p.add_argument(
        "--work",
        help="local scratch folder for shards and copied inputs (default: a temporary folder)",
    )
    p.add_argument("--report", default="bench", help="local output folder (default ./bench)")
    add_storage_option(p)
    _add_sweep_options(p)
    p.set_defaults(run=run_bench, tensorflow=True)


def _add_sweep_options(p: argparse.ArgumentParser) -> None:
    """The grid swept, how often each point is timed, and the baseline comparison instead."""
    p.add_argument("--shards", default="1,4,16,64", help="shard counts (default 1,4,16,64)")
    p.add_argument(
        "--encodings",
        default="deflate,keep,raw",
        help="image encodings (default deflate,keep,raw)",
    )
    p.add_argument("--compression", default="none,gzip", help="compressions (default none,gzip)")
    p.add_argument(
        "--cycle-lengths", default="1,4,16", help="interleave cycle lengths (default 1,4,16)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed passes per point; with --compare-baseline, rounds (default 3)",
    )
    p.add_argument(
        "--max-disk-ratio",
        type=float,
        default=4.0,
        help="recommend only configurations within this many times the source bytes (default 4.0)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small grid (2 shard counts, deflate+raw, no compression, cycle 1 and "
        "4, 3 repeats; with --synthetic, at most 300 pairs of 64x64, stated in the report)",
    )
    p.add_argument(
        "--compare-baseline",
        action="store_true",
        help="instead of the grid: the README's path, tfshards.read(shards, cache=True) on "
        "the default conversion, against the hand-written Keras pipeline "
        "(image_dataset_from_directory + .cache(file)): first and warm epochs, --repeats "
        "alternating rounds, pairs/s and CPU ms per pair with spreads, and the ratios "
        "(e.g. tfshards bench --synthetic 2000 --compare-baseline: a few minutes on 2 cores)",
    )


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
    for flag, value in (("--work", args.work), ("--report", args.report)):
        if value and storage.is_url(value):
            raise OptionsError(
                f"{flag} must be a local folder: bench measures this machine's disk "
                f"(got {storage.display(value)})"
            )
    with (
        tempfile.TemporaryDirectory(prefix="tfshards-bench-") as tmp,
        _cache_lines_quiet(unless=args.verbose),
    ):
        work = Path(args.work) if args.work else Path(tmp)
        images, masks = _source(args, work)
        if args.compare_baseline:
            return _compare_and_report(args, images, masks, work)
        config = _config(args, images, masks, work)
        return _sweep_and_report(config, Path(args.report), quiet=args.quiet)


@contextlib.contextmanager
def _cache_lines_quiet(*, unless: bool):
    """The disk cache's INFO lines (building, ready) left out: the bench builds a cache at
    every point, in its own scratch folder; its warnings still show, everything with -v."""
    cache_log = logging.getLogger(CACHE_LOGGER)
    level = cache_log.level
    if not unless:
        cache_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        cache_log.setLevel(level)


def _source(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    if args.images and (storage.is_url(args.images) or storage.is_url(args.masks)):
        options = storage.parse_options(args.storage_option)
        images = _copied(args, args.images, work / "inputs" / "images", options)
        return images, _copied(args, args.masks, work / "inputs" / "masks", options)
    if args.images:
        return Path(args.images), Path(args.masks)
    from tfshards.converters.synth import synth

    count, size = quick_size(args)
    return synth(work / "synthetic", count=count, size=size, seed=0)


def _copied(args: argparse.Namespace, url: str, local: Path, options: dict) -> Path:
    """A local copy of an input folder given by URL, with a progress bar."""
    with tqdm(unit="B", unit_scale=True, disable=args.quiet, desc=f"copy {local.name}") as bar:
        copied = storage.get_tree(url, local, options, on_file=bar.update)
    log.info("copied %s (%.1f MB) to %s", storage.display(url), copied / 1e6, local)
    return local


QUICK_PAIRS, QUICK_SIDE = 300, 64


def quick_size(args: argparse.Namespace) -> tuple[int, int]:
    """The synthetic pairs and side to make: --quick caps them."""
    if args.quick:
        return min(args.synthetic, QUICK_PAIRS), min(args.size, QUICK_SIDE)
    return args.synthetic, args.size


def _note(args: argparse.Namespace) -> str:
    if not args.quick:
        return ""
    if args.images:
        return "Quick mode: a reduced grid on your data."
    count, size = quick_size(args)
    return (
        f"Quick mode: a reduced grid on {count} synthetic pairs of {size}x{size} (asked for "
        f"{args.synthetic} of {args.size}x{args.size}); small data favours streaming over "
        "the cache, so measure without --quick before choosing."
    )


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
            repeats=MIN_PASSES,
            max_disk_ratio=args.max_disk_ratio,
            synthetic=not args.images,
            note=_note(args),
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


def _compare_and_report(args: argparse.Namespace, images: Path, masks: Path, work: Path) -> int:
    """--compare-baseline: the rounds, then rows and ratios printed and saved as compare.md."""
    from tfshards.benchmarking.compare import CompareConfig, compare_markdown, run_comparison

    config = CompareConfig(images, masks, work, rounds=args.repeats)
    bar = tqdm(total=1 + 2 * config.rounds, unit="step", disable=args.quiet, desc="compare")
    with logging_redirect_tqdm(), bar:
        result = run_comparison(config, on_step=lambda name: bar.update(1))
    text = compare_markdown(result, note=_note(args))
    report = Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    (report / "compare.md").write_text(text + "\n")
    print(text)
    print(f"wrote {report / 'compare.md'}")
    return 0


def _sweep_and_report(config: SweepConfig, report: Path, *, quiet: bool) -> int:
    steps = 2 + len(config.points) * (1 + len(config.cycle_lengths))
    result = SweepResult(config, {}, "", 0, 0)
    interrupted = False
    bar = tqdm(total=steps, unit="step", disable=quiet, desc="bench")
    # Log lines go through tqdm.write, above the bar instead of through it.
    with logging_redirect_tqdm(), bar:

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
