"""`tfshards` subcommands that look at converted datasets: verify, inspect, records, cache,
export-tfds. Wired into the parser by cli/__init__.py."""

from __future__ import annotations

import argparse
import logging
import sys

from tfshards.errors import OptionsError
from tfshards.schemas.format import CACHE_DIR_NAME

log = logging.getLogger("tfshards")


def add_storage_option(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--storage-option KEY=VALUE``, repeatable: fsspec options for URLs (s3://, gs://)."""
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec option for s3://, gs://... locations, repeatable (e.g. "
        "profile=training, endpoint_url=http://127.0.0.1:9000, anon=true); credentials "
        "are better left to the environment or config files. Never printed.",
    )


def add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="list or clear the disk caches of a dataset",
        description="Show the disk cache entries (state and size) under DIR, a dataset folder "
        "(its cache beside the shards and, for a read-only folder, the one under the user "
        "cache folder) or a cache folder given to read(cache=...), or remove them. An entry "
        "is stale when its dataset's shards changed (convert --overwrite) or are gone: it "
        "is never read again. Only folders proven to be tfshards cache entries are listed "
        "or removed; a folder that is neither a dataset's nor holds cache entries is "
        "refused. No TensorFlow is imported.",
    )
    p.add_argument("action", choices=("list", "clear"), help="list entries, or remove them")
    p.add_argument("dir", help=f"dataset folder (its {CACHE_DIR_NAME}) or cache folder")
    p.add_argument("--stale", action="store_true", help="clear: remove the stale entries only")
    p.set_defaults(run=_run_cache)


def _run_cache(args: argparse.Namespace) -> int:
    from tfshards.readers.cache import clear_caches, list_caches

    if args.action == "clear":
        freed = clear_caches(args.dir, stale=args.stale)
        which = "stale caches" if args.stale else "caches"
        print(f"removed the {which} under {args.dir}: {freed / 2**20:.1f} MiB freed")
        return 0
    if args.stale:
        raise OptionsError("--stale goes with `cache clear` (`cache list` shows every state)")
    entries = list_caches(args.dir)
    if not entries:
        print(f"no caches under {args.dir}")
    for entry in entries:
        print(entry.describe())
    return 0


def add_export_tfds(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export-tfds",
        help="write the metadata TFDS needs to load the shards",
        description="Write dataset_info.json and features.json beside the shards, so that "
        "tfds.builder_from_directory(DIR) loads every split with TFDS's own reader, as "
        "(image, mask) pairs with as_supervised=True. TFDS can represent uncompressed shards "
        "whose records share one size, with PNG/JPEG images (keep, png, jpeg) or images and "
        "masks both raw or both deflate (ZLIB tensors); other datasets are refused with the "
        "reason.",
    )
    p.add_argument("dir", help="dataset folder or URL (holding tfshards.json)")
    p.add_argument("--name", default="tfshards_dataset", help="TFDS dataset name")
    add_storage_option(p)
    p.add_argument(
        "--class-names",
        metavar="A,B,...",
        help="names of the classes 0..K-1, stored with the mask feature (default: none)",
    )
    p.set_defaults(run=_run_export_tfds, tensorflow=True)


def _run_export_tfds(args: argparse.Namespace) -> int:
    from tfshards.converters.tfds_metadata import export_tfds
    from tfshards.storage import parse_options

    names = args.class_names.split(",") if args.class_names else None
    written = export_tfds(
        args.dir,
        name=args.name,
        class_names=names,
        storage_options=parse_options(args.storage_option),
    )
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check every shard and record against the manifest",
        description="Read every record of every shard: sizes and sha256 against the manifest, "
        "TFRecord CRCs, record counts, every record parses and decodes, image and mask shapes "
        "agree, mask values below num_classes, keys unique across splits, each split's "
        "per-record table (size, sha256, rows; with every record, each row against its "
        "mask). Exit 0 when all holds, 1 naming each bad shard or table.",
    )
    p.add_argument("dir", help="dataset folder or URL such as s3://bucket/shards")
    p.add_argument("--quick", action="store_true", help="check sizes and hashes only")
    add_storage_option(p)
    p.set_defaults(run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from tfshards.checks.verify import verify
    from tfshards.schemas.manifest import Manifest
    from tfshards.storage import parse_options

    options = parse_options(args.storage_option)
    manifest = Manifest.load(args.dir, options)  # no manifest: one line and exit 1, no table
    total = sum(len(s.shards) for s in manifest.splits.values())
    with tqdm(total=total, unit="shard", disable=args.quiet) as bar:
        report = verify(args.dir, quick=args.quick, progress=bar.update, storage_options=options)
    print(report.table())
    if not report.ok:
        print(f"tfshards verify: error: {args.dir} failed verification", file=sys.stderr)
    return 0 if report.ok else 1


def add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarize a dataset; draw a preview grid",
        description="Print splits, counts, shard sizes, encodings, source, seed, skipped pairs, "
        "the class pixel histogram and suggested class weights (median frequency balancing).",
    )
    p.add_argument(
        "dir",
        nargs="+",
        help="dataset folder or URL such as s3://bucket/shards; several (NAME=DIR or DIR) "
        "with --weights: print one epoch of them mixed, per dataset and class",
    )
    p.add_argument(
        "--weights",
        type=float,
        nargs="+",
        metavar="W",
        help="with several datasets: how often each is seen, one per dataset, in order",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_storage_option(p)
    p.add_argument("--preview", metavar="PNG", help="draw random pairs: image, mask, overlay")
    p.add_argument("--count", type=int, default=8, help="pairs in the preview (default 8)")
    p.add_argument("--split", help="split to preview (default: the first)")
    p.add_argument("--seed", type=int, default=0, help="which pairs to preview (default 0)")
    p.add_argument(
        "--bands",
        type=_bands_arg,
        metavar="R,G,B",
        help="image channels (0-based) the preview shows as red, green, blue (default: the "
        "first three, or the first as gray); uint16 images are stretched per band",
    )
    p.add_argument(
        "--sampling",
        choices=("class_uniform", "repeat_factor"),
        help="also print each class's share of pixels and records in one epoch of "
        "read(sampling=tfshards.ClassBalanced(rule=...)) beside every record once "
        "(from the per-record table; of --split, default train)",
    )
    p.add_argument(
        "--exclude",
        type=int,
        nargs="*",
        default=[],
        metavar="CLASS",
        help="with --sampling: classes never drawn for, e.g. background (default none)",
    )
    p.add_argument(
        "--epoch-size", type=int, help="with --sampling: records per epoch (default: all)"
    )
    p.set_defaults(run=_run_inspect)


def _bands_arg(text: str) -> tuple[int, ...]:
    """``--bands 3,2,1``: channel indices (checked against the dataset by the preview)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected R,G,B channel indices, got {text!r}") from None


def _run_inspect(args: argparse.Namespace) -> int:
    import json

    from tfshards.checks.inspect import dataset_summary, summary_text, write_preview
    from tfshards.storage import parse_options

    options = parse_options(args.storage_option)
    if len(args.dir) > 1 or args.weights is not None:
        return _print_mix(args, options)
    args.dir = args.dir[0]
    if not args.sampling and (args.exclude or args.epoch_size is not None):
        raise OptionsError("inspect: --exclude and --epoch-size go with --sampling RULE")
    summary = dataset_summary(args.dir, storage_options=options)
    print(json.dumps(summary, indent=2) if args.json else summary_text(summary))
    if args.preview:
        rows = write_preview(
            args.dir,
            args.preview,
            count=args.count,
            seed=args.seed,
            split=args.split,
            bands=args.bands,
            storage_options=options,
        )
        log.info("wrote a preview of %d pairs to %s", rows, args.preview)
    if args.sampling:
        _print_exposure(args, options)
    return 0


def _print_mix(args: argparse.Namespace, options) -> int:
    """inspect DIR DIR... --weights W W...: one epoch of the datasets mixed."""
    from tfshards.checks.mix_report import mix_exposure

    if args.weights is None:
        raise OptionsError("inspect: several datasets need --weights, one per dataset")
    if args.preview or args.sampling or args.exclude:
        raise OptionsError("inspect: --preview, --sampling and --exclude take one dataset")
    sources = dict(_named(d) for d in args.dir)
    if len(sources) != len(args.dir):
        raise OptionsError(f"inspect: a dataset is named twice in {args.dir}")
    report = mix_exposure(
        sources,
        weights=args.weights,
        epoch_size=args.epoch_size,
        split=args.split or "train",
        storage_options=options,
    )
    if args.json:
        import json

        print(json.dumps(report.as_dict(), indent=2))
        return 0
    print(report.describe())
    return 0


def _named(given: str) -> tuple[str, str]:
    """``NAME=DIR`` as (NAME, DIR); a DIR alone (a path may hold "=": runs/lr=0.1/shards)
    is its own name."""
    name, sep, path = given.partition("=")
    if sep and name and not any(c in name for c in "/\\:"):
        return name, path
    return given, given


def _print_exposure(args: argparse.Namespace, options) -> None:
    """inspect --sampling: one epoch's class shares under ClassBalanced, from the table."""
    from tfshards.checks.exposure import exposure
    from tfshards.readers.sampling import ClassBalanced

    balanced = ClassBalanced(rule=args.sampling, exclude=args.exclude)
    report = exposure(
        args.dir,
        args.split or "train",
        sampling=balanced,
        epoch_size=args.epoch_size,
        storage_options=options,
    )
    print(f"\n{balanced.describe()}")
    print(report.describe())


def add_records(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "records",
        help="load (or build once) a split's per-record table; summarize it per class",
        description="Load the per-record table of a split (what each record holds: key, "
        "size, pixels of each class and where they lie), checked against the manifest, and "
        "print how many records hold each class and each class's share of the pixels. A "
        "dataset converted before tfshards wrote tables gets its table built by one pass "
        "over its masks and kept in the user cache folder (as tfshards.records() does). No "
        "TensorFlow is imported. Exit 0 when the table loads, 1 when it is damaged or "
        "disagrees with the manifest (the error names the file), 2 on bad usage.",
    )
    p.add_argument("dir", help="dataset folder or URL such as s3://bucket/shards")
    p.add_argument("--split", default="train", help="the split (default train)")
    add_storage_option(p)
    p.set_defaults(run=_run_records)


def _run_records(args: argparse.Namespace) -> int:
    from tfshards.schemas.manifest import Manifest
    from tfshards.sources.record_tables import records
    from tfshards.storage import parse_options

    options = parse_options(args.storage_option)
    table = records(args.dir, args.split, storage_options=options, progress=not args.quiet)
    listed = Manifest.load(args.dir, options).splits[args.split].record_table
    where = f"{listed.file}, {listed.bytes} bytes" if listed else "built, in the user cache"
    print(f"{args.split}: {len(table)} records, {table.num_classes} classes ({where})")
    print(_class_summary(table))
    return 0


_WIDTHS = (5, 10, 10, 14, 9)


def _class_summary(table) -> str:  # noqa: ANN001 - a RecordTable (imported in _run_records)
    """Per class: the records that hold it and its share of the labelled pixels."""
    import numpy as np

    holding = np.bincount(table.class_ids, minlength=table.num_classes)
    pixels = table.class_totals()
    total, count = max(int(pixels.sum()), 1), max(len(table), 1)
    heads = ("class", "records", "of records", "pixels", "of pixels")
    lines = [" ".join(f"{head:>{width}s}" for head, width in zip(heads, _WIDTHS, strict=True))]
    for klass in range(table.num_classes):
        share = (holding[klass] / count, pixels[klass] / total)
        lines.append(
            f"{klass:5d} {int(holding[klass]):10d} {share[0]:10.1%} "
            f"{int(pixels[klass]):14d} {share[1]:9.2%}"
        )
    ignored = int(table.ignored_pixels.sum(dtype=np.int64))
    if ignored:
        lines.append(f"ignored pixels (ignore_label): {ignored}")
    return "\n".join(lines)
