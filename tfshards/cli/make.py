"""`tfshards` subcommands that make datasets: synth, convert, demo."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from tfshards.cli.datasets import add_storage_option
from tfshards.converters.options import (
    COMPRESSION_CHOICES,
    ON_ERROR,
    ConvertOptions,
    parse_hw,
    parse_mask_map,
    parse_size,
)
from tfshards.errors import OptionsError
from tfshards.schemas import deflate
from tfshards.schemas.format import (
    AUTO,
    ENCODINGS,
    IMAGE_DTYPES,
    MASK_ENCODINGS,
    MAX_CHANNELS,
)
from tfshards.storage import join, parse_options
from tfshards.wording import counted

log = logging.getLogger("tfshards")
DEFAULTS = ConvertOptions()  # the one source of every default in `convert --help`


def _size_arg(parse: Callable):
    def convert(text: str):
        try:
            return parse(text)
        except OptionsError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__.replace("parse_", "")
    return convert


def add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert image/mask folders into pre-shuffled TFRecord shards",
        description="Pair images with masks, validate every pair, assign splits by a hash "
        "of the key, shuffle, and write compressed TFRecord shards plus a manifest "
        "(tfshards.json) written last.",
    )
    _add_input_args(p)
    _add_validation_args(p)
    _add_record_args(p)
    _add_tile_args(p)
    _add_output_args(p)
    p.set_defaults(run=_run_convert, interrupt_hint=_how_to_finish)


def _how_to_finish(args: argparse.Namespace) -> str:
    if args.overwrite:
        return (
            "rerun the same command to finish; a dataset already in --out is kept until the "
            "new one is complete"
        )
    return "rerun the same command, or add --resume, to finish"


def _add_input_args(p: argparse.ArgumentParser) -> None:
    """Input folders, name patterns, unpaired files."""
    g = p.add_argument_group("input and pairing")
    g.add_argument(
        "--images",
        required=True,
        help="folder of images (walked recursively), or a URL such as s3://bucket/images",
    )
    g.add_argument("--masks", help="folder or URL of masks (default: --images, with name patterns)")
    g.add_argument("--image-pattern", help="image file name pattern, e.g. 'image_{key}.png'")
    g.add_argument("--mask-pattern", help="mask file name pattern, e.g. '{key}_mask.png'")
    g.add_argument(
        "--allow-unpaired",
        action="store_true",
        help="convert the matched pairs and report orphans and duplicate keys instead of failing",
    )


def _add_validation_args(p: argparse.ArgumentParser) -> None:
    """What a pair must satisfy, and how mask values are read."""
    g = p.add_argument_group("validation")
    g.add_argument(
        "--num-classes", type=int, help="fail if a mask value is >= this (default: not checked)"
    )
    g.add_argument(
        "--mask-map",
        type=_size_arg(parse_mask_map),
        help="remap mask values first, e.g. 0:0,255:1; unmapped values are errors "
        "(default: no map)",
    )
    g.add_argument(
        "--ignore-label",
        type=int,
        metavar="VALUE",
        help="mask value of pixels to leave out of the loss (e.g. 255 in VOC-style masks): "
        "kept out of --num-classes checks and class counts, stored in the manifest "
        "(default: none)",
    )
    g.add_argument(
        "--binary-masks",
        action="store_true",
        help="black/white masks: 0 -> class 0, 255 (or 1) -> class 1, 2 classes; without it "
        "0/255 masks stop the conversion before anything is written",
    )
    g.add_argument(
        "--channels",
        type=int,
        choices=range(1, MAX_CHANNELS + 1),
        metavar=f"1..{MAX_CHANNELS}",
        help="image channels to store (default: the first image's: 1 if grayscale, 3 if "
        "colour, the bands of a .npy or multi-band TIFF)",
    )
    g.add_argument(
        "--image-dtype",
        choices=IMAGE_DTYPES,
        help="image sample type to store (default: the first image's; 16-bit images are "
        "never cut to 8 bits)",
    )
    g.add_argument(
        "--resize",
        type=_size_arg(parse_hw),
        metavar="HxW",
        help="resize images (bicubic) and masks (nearest) to HEIGHTxWIDTH (default: keep sizes)",
    )
    g.add_argument(
        "--on-error",
        choices=ON_ERROR,
        default=DEFAULTS.on_error,
        help="a corrupt or invalid pair stops the job (fail, default) or is "
        "skipped and listed in the manifest (skip)",
    )


def _add_tile_args(p: argparse.ArgumentParser) -> None:
    """Large images cut into tiles (docs/large-images.md)."""
    g = p.add_argument_group("tiles (large images)")
    g.add_argument(
        "--tile",
        dest="tile_size",
        type=int,
        metavar="N",
        help="cut every pair into NxN tiles, one record each, edge tiles shifted inward so "
        "every pixel is covered (default: one record per pair; images over Pillow's pixel "
        "limit are still cut into 1024x1024 tiles)",
    )
    g.add_argument(
        "--overlap",
        dest="tile_overlap",
        type=int,
        default=DEFAULTS.tile_overlap,
        metavar="M",
        help="pixels shared by neighbouring tiles, below --tile (default: %(default)s)",
    )
    g.add_argument(
        "--tile-smaller",
        choices=("keep", "fail"),
        default=DEFAULTS.tile_smaller,
        help="an image smaller than --tile: one tile of its own size (keep, default) or an "
        "error for its pair (fail)",
    )
    g.add_argument(
        "--decode-limit",
        type=_size_arg(parse_size),
        default=DEFAULTS.decode_limit,
        metavar="SIZE",
        help="most bytes of pixels of one image decoded whole when tiling (PNG, JPEG; tiled "
        "and striped TIFFs are read by windows), checked before decoding (default: "
        f"{DEFAULTS.decode_limit / 2**30:g}GiB)",
    )


def _add_record_args(p: argparse.ArgumentParser) -> None:
    """Encodings, compression, shard counts, index and TFDS files."""
    g = p.add_argument_group("records and shards")
    g.add_argument(
        "--encoding",
        choices=sorted(ENCODINGS),
        default=DEFAULTS.encoding,
        help="image encoding: deflate (raw pixels, zlib per record: lossless, compact, fast "
        "to read), raw pixels, keep the source PNG/JPEG bytes (fastest conversion; smallest "
        "for JPEG photos), png, or jpeg (lossy) (default: %(default)s)",
    )
    g.add_argument(
        "--mask-encoding",
        choices=[AUTO, *sorted(MASK_ENCODINGS)],
        default=DEFAULTS.mask_encoding,
        help="mask encoding; auto (default) is the image encoding when that is deflate or "
        "raw, else keep; masks are never stored lossy",
    )
    g.add_argument(
        "--compression",
        choices=COMPRESSION_CHOICES,
        default=DEFAULTS.compression,
        help="whole-shard compression; auto (default) is none: deflate, PNG and JPEG are "
        "compressed already, and a gzip stream over raw pixels reads about half as fast "
        "as deflate records",
    )
    g.add_argument(
        "--compression-level",
        type=int,
        default=DEFAULTS.compression_level,
        help="zlib level 0-9 (default %(default)s: with zlib, several times faster than 6 for a "
        "few %% more bytes); where ISA-L is installed it writes every level but 0 with its "
        "level 3, the one whose bytes are reproducible",
    )
    g.add_argument(
        "--deflate-library",
        choices=deflate.LIBRARIES,
        default=DEFAULTS.deflate_library,
        help="what deflates records and shards: auto (default) is ISA-L where installed, "
        "else zlib; zlib writes zlib's bytes, the same whether or not ISA-L is installed, "
        "at several times ISA-L's CPU",
    )
    _add_shard_args(g)


def _add_shard_args(g: argparse._ArgumentGroup) -> None:
    """Shard counts and sizes, index and TFDS files, splits."""
    shards = g.add_mutually_exclusive_group()
    shards.add_argument(
        "--num-shards",
        type=int,
        help="shards for the largest split; others get a proportional count "
        "(default: from --shard-size)",
    )
    shards.add_argument(
        "--shard-size",
        type=_size_arg(parse_size),
        default=DEFAULTS.shard_size,
        help="target bytes per shard before compression, e.g. 128MiB (default)",
    )
    g.add_argument(
        "--index",
        action="store_true",
        help="write <shard>.idx beside each shard ('<offset> <length>' per record) for NVIDIA "
        "DALI's readers.tfrecord and the tfrecord package; needs uncompressed shards. DALI "
        "cannot inflate the default deflate encoding on the CPU (its inflate operator is "
        "GPU-only and LZ4-only): for DALI convert with --encoding raw (1.9x the source bytes), "
        "png, or keep (PNG/JPEG sources, their own size), which DALI decodes natively",
    )
    g.add_argument(
        "--tfds-metadata",
        action="store_true",
        help="also write dataset_info.json and features.json so tfds.builder_from_directory "
        "loads the shards (uncompressed, one image size; see `tfshards export-tfds --help`)",
    )
    g.add_argument(
        "--val-fraction",
        type=float,
        default=DEFAULTS.val_fraction,
        help="fraction of pairs for 'val' (default %(default)s)",
    )
    g.add_argument(
        "--test-fraction",
        type=float,
        default=DEFAULTS.test_fraction,
        help="fraction of pairs for 'test' (default %(default)s)",
    )
    g.add_argument(
        "--seed", type=int, default=DEFAULTS.seed, help="shuffle and split seed (default 0)"
    )


def _add_output_args(p: argparse.ArgumentParser) -> None:
    """The output folder, workers, runner, resume and overwrite."""
    g = p.add_argument_group("output and execution")
    g.add_argument(
        "--out", required=True, help="output folder, or a URL such as s3://bucket/prefix"
    )
    add_storage_option(g)
    g.add_argument("--workers", type=int, help="parallel processes (default: all cores)")
    g.add_argument(
        "--runner",
        choices=("local", "beam"),
        default="local",
        help="write shards with local processes (default) or an Apache Beam pipeline "
        '(pip install "tfshards[beam]"); the output is byte-identical',
    )
    g.add_argument(
        "--beam-option",
        action="append",
        default=[],
        metavar="FLAG",
        help="one Beam pipeline option, repeatable: --beam-option=--runner=DirectRunner "
        "--beam-option=--direct_num_workers=2",
    )
    mode = g.add_mutually_exclusive_group()
    mode.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted conversion, keeping complete shards",
    )
    mode.add_argument(
        "--overwrite", action="store_true", help="replace a previous conversion in --out"
    )


# ConvertRun fields the CLI derives instead of taking a flag of the same name.
_RUN_FROM_CLI = ("progress", "runner", "storage_options")


def _run_convert(args: argparse.Namespace) -> int:
    from tfshards.converters.convert import ConvertRun, run_conversion

    given = vars(args)  # every option flag is named after its ConvertOptions/ConvertRun field
    options = ConvertOptions(**{f.name: given[f.name] for f in fields(ConvertOptions)})
    runner = None
    if args.runner == "beam":
        from tfshards.converters.beam import beam_runner

        runner = beam_runner(args.beam_option)
    run = ConvertRun(
        **{f.name: given[f.name] for f in fields(ConvertRun) if f.name not in _RUN_FROM_CLI},
        progress=not args.quiet,
        runner=runner,
        storage_options=parse_options(args.storage_option),
    )
    result = run_conversion(args.images, args.masks, args.out, options, run, cli=True)
    print(conversion_summary(result))
    if args.tfds_metadata:
        from tfshards.schemas.format import TFDS_FILES

        print("wrote TFDS metadata: " + ", ".join(str(join(args.out, f)) for f in TFDS_FILES))
    return 0


def conversion_summary(result) -> str:
    manifest = result.manifest
    total = manifest.total_records
    if result.already_complete:
        head = f"{result.path} is already complete: nothing to do"
    else:
        head = (
            f"wrote {result.path}  ({counted(result.shards_written, 'shard')} written, "
            f"{result.shards_reused} reused, {result.seconds:.1f} s, "
            f"{total / max(result.seconds, 1e-9):.0f} pairs/s)"
        )
    lines = [head]
    for name, split in manifest.splits.items():
        lines.append(
            f"  {name:5s} {counted(split.records, 'pair'):>14s}  "
            f"{counted(len(split.shards), 'shard'):>12s}  "
            f"{split.bytes / 2**20:10.1f} MiB"
        )
    if manifest.skipped:
        lines.append(
            f"  skipped {counted(len(manifest.skipped), 'pair')} (listed in tfshards.json):"
        )
        lines += [f"    {s.key}: {s.file}: {s.reason}" for s in manifest.skipped[:10]]
    unpaired = {k: v for k, v in manifest.unpaired.items() if v}
    if unpaired:
        lines.append(
            "  left out: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in unpaired.items())
        )
    return "\n".join(lines)


def add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="write a synthetic image/mask dataset to try things on",
        description="Write OUT/images/NNNNN.png and OUT/masks/NNNNN.png: random shapes whose "
        "classes are in the masks (0 is background).",
    )
    p.add_argument("out", help="output folder")
    p.add_argument("--count", type=int, default=200, help="number of pairs (default 200)")
    p.add_argument("--size", type=int, default=256, help="height and width (default 256)")
    p.add_argument("--classes", type=int, default=3, help="classes incl. background (default 3)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--image-format",
        choices=("png", "jpeg"),
        default="png",
        help="image file format (default png)",
    )
    p.add_argument("--palette-masks", action="store_true", help="write palette (P) PNG masks")
    p.add_argument("--grayscale", action="store_true", help="write 1-channel images")
    p.set_defaults(run=_run_synth)


def _run_synth(args: argparse.Namespace) -> int:
    from tfshards.converters.synth import synth

    images, masks = synth(
        args.out,
        count=args.count,
        size=args.size,
        classes=args.classes,
        seed=args.seed,
        image_format=args.image_format,
        palette_masks=args.palette_masks,
        channels=1 if args.grayscale else 3,
    )
    print(f"wrote {counted(args.count, 'pair')}: images in {images}, masks in {masks}")
    return 0


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="synth -> convert -> read back, with no arguments",
        description="Make a small synthetic dataset, convert it, read the train split twice "
        "(the second time from the disk cache) and print a summary.",
    )
    p.add_argument(
        "--workdir",
        help="keep the data, shards and cache here (default: a "
        "temporary folder, removed afterwards)",
    )
    p.add_argument("--count", type=int, default=200, help="pairs to make (default 200)")
    p.add_argument("--size", type=int, default=128, help="image height and width (default 128)")
    p.set_defaults(run=_run_demo, tensorflow=True)


def _run_demo(args: argparse.Namespace) -> int:

    from tfshards.demo import run_demo

    workdir = Path(args.workdir) if args.workdir else None
    print(run_demo(workdir, count=args.count, size=args.size, progress=not args.quiet))
    return 0
