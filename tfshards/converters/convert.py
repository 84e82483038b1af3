"""`tfshards.convert`: pair, validate, split, shuffle, plan, encode, write, manifest."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tfshards import storage
from tfshards.arguments import (
    checked_bool,
    checked_callable,
    checked_int,
    checked_path,
    checked_str,
)
from tfshards.checks.shard_io import local_shard
from tfshards.converters.bucket_output import BucketOutput
from tfshards.converters.image_stats import split_stats
from tfshards.converters.local import write_and_upload, write_shards
from tfshards.converters.mask_values import check_mask_values, sample_mask_values
from tfshards.converters.options import ConvertOptions
from tfshards.converters.output import OutputFolder
from tfshards.converters.pair_table import PairTable, release_freed_memory
from tfshards.converters.pairing import Pair, PairingReport, checked_pairs, pair_files
from tfshards.converters.planning import ShardSpec, plan_shards
from tfshards.converters.progress import ConversionProgress, Effort
from tfshards.converters.shard_job import (
    ShardResult,
)
from tfshards.converters.tiling import AUTO_TILE, planned_bands
from tfshards.converters.validation import image_layout
from tfshards.converters.windows import no_pixel_limit
from tfshards.errors import OptionsError, OutputError, PairError, PairingError
from tfshards.schemas.format import image_encoding, itemsize, record_table_name
from tfshards.schemas.manifest import (
    CompressionInfo,
    ImageInfo,
    Manifest,
    MaskInfo,
    ShardInfo,
    SplitInfo,
    TableInfo,
)
from tfshards.schemas.record_table import RecordTable, shard_rows
from tfshards.storage import FileStat, Location, StorageOptions, stat

log = logging.getLogger("tfshards")
_HEADER_SAMPLE = 32
_SCAN_STEP = 4096  # pairs stat()ed between progress updates


# Writes the planned shards into a folder or bucket prefix (with these storage options) and
# yields their results, in any order.
ShardRunner = Callable[
    [list[ShardSpec], ConvertOptions, int, Location, StorageOptions], Iterable[ShardResult]
]


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion produced, with what it took (the manifest holds no timings)."""

    manifest: Manifest
    path: Location
    seconds: float
    shards_written: int
    shards_reused: int
    pairing: PairingReport
    effort: Effort | None = None  # CPU and bytes of this run
    already_complete: bool = False  # --resume of a complete dataset: nothing was written


@dataclass(frozen=True)
class ConvertRun:
    """How a conversion runs (not what it writes: that is :class:`ConvertOptions`).

    image_pattern, mask_pattern: name patterns such as ``'image_{key}.png'``.
    allow_unpaired: convert the matched pairs and report orphans instead of failing.
    workers: local worker processes (default: all cores); the output is the same for any.
    resume / overwrite: finish an interrupted conversion / replace a previous one.
    progress: a tqdm bar. runner: writes the planned shards (default: local workers;
    ``tfshards.converters.beam.beam_runner(...)`` for an Apache Beam pipeline).
    storage_options: passed to fsspec for inputs and outputs given as URLs (``s3://``,
    ``gs://``...), e.g. ``{"profile": "training"}``; never logged nor written anywhere.
    """

    image_pattern: str | None = None
    mask_pattern: str | None = None
    allow_unpaired: bool = False
    workers: int | None = None
    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    runner: ShardRunner | None = None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        checked_int("workers", self.workers, low=1, none=True)
        for name in ("allow_unpaired", "resume", "overwrite", "progress"):
            checked_bool(name, getattr(self, name))
        for name in ("image_pattern", "mask_pattern"):
            if getattr(self, name) is not None:
                checked_str(name, getattr(self, name))
        checked_callable("runner", self.runner)
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            kind = type(self.storage_options).__name__  # the value may hold credentials
            raise OptionsError(f"storage_options must be a dict or None, got a {kind}")


_RUN_FIELDS = {f.name for f in fields(ConvertRun)}
_OPTION_FIELDS = {f.name for f in fields(ConvertOptions)}


def convert(
    images: Location,
    masks: Location | None,
    out: Location,
    *,
    options: ConvertOptions | None = None,
    **settings: Any,
) -> Manifest:
    """Convert an image folder and a mask folder into TFRecord shards; return the manifest.

    Any of the three may be a URL (``s3://bucket/images``, ``gs://bucket/shards``); pass
    ``storage_options={...}`` for the filesystem (credentials, endpoint) when the
    environment does not hold them.

    Keywords are fields of :class:`ConvertOptions` (what is written: encoding,
    val_fraction, num_classes, ...) or of :class:`ConvertRun` (how the job runs:
    workers, resume, overwrite, progress, name patterns, ...):

    >>> manifest = tfshards.convert("data/images", "data/masks", "shards",
    ...                             val_fraction=0.1, num_classes=3, seed=0)  # doctest: +SKIP
    >>> manifest.splits["train"].records  # doctest: +SKIP
    180
    """
    checked_path("images", images)
    if masks is not None:
        checked_path("masks", masks)
    checked_path("out", out)
    if options is not None and not isinstance(options, ConvertOptions):
        raise OptionsError(f"options must be a ConvertOptions or None; got {options!r}")
    unknown = sorted(set(settings) - _RUN_FIELDS - _OPTION_FIELDS)
    if unknown:
        raise OptionsError(
            f"convert() got unknown keywords {', '.join(unknown)}; valid: "
            f"{', '.join(sorted(_OPTION_FIELDS | _RUN_FIELDS))}"
        )
    run = ConvertRun(**{k: v for k, v in settings.items() if k in _RUN_FIELDS})
    values = {k: v for k, v in settings.items() if k in _OPTION_FIELDS}
    options = replace(options or ConvertOptions(), **values)
    return run_conversion(images, masks, out, options, run).manifest


def run_conversion(
    images: Location,
    masks: Location | None,
    out: Location,
    options: ConvertOptions,
    run: ConvertRun,
    *,
    cli: bool = False,
) -> ConvertResult:
    """The conversion itself, also returning timing and pairing details (used by the CLI;
    ``cli``: errors name options as flags, ``--overwrite``, not ``overwrite=True``)."""
    progress = ConversionProgress(run.progress)
    out = out if storage.is_url(out) else Path(out)
    finished = False
    try:
        report, options, specs, source = _plan(images, masks, options, run, progress)
        manifest, written, reused, complete = _write_dataset(
            out, specs, options, source, report, run, progress, cli
        )
        finished = True
    finally:
        effort = progress.close(finished=finished)
    if options.tfds_metadata:
        from tfshards.converters.tfds_metadata import export_tfds

        export_tfds(out, storage_options=run.storage_options)
    return ConvertResult(manifest, out, effort.seconds, written, reused, report, effort, complete)


def _plan(
    images: Location,
    masks: Location | None,
    options: ConvertOptions,
    run: ConvertRun,
    progress: ConversionProgress,
) -> tuple[PairingReport, ConvertOptions, list[ShardSpec], dict[str, Any]]:
    """List, pair, check and plan: (pairing report, resolved options, shards, source)."""
    store = run.storage_options
    report = pair_files(
        images,
        masks,
        image_pattern=run.image_pattern,
        mask_pattern=run.mask_pattern,
        storage_options=store,
        listed=progress.listed,
    )
    pairs = checked_pairs(report, allow_unpaired=run.allow_unpaired, where=storage.display(images))
    for problem in report.problems:
        log.warning("%s (left out: --allow-unpaired)", problem)
    masks_where = storage.display(masks if masks is not None else images)
    check_mask_values(sample_mask_values(pairs, storage_options=store), options, where=masks_where)
    with no_pixel_limit():  # a first image too large for Pillow's limit is tiled, not refused
        options = _with_image_layout(options, pairs, store)
    channels = options.channels
    progress.checking(len(pairs))
    stat_of = _input_stats((images, masks if masks is not None else images), store)
    fingerprint, file_bytes = _scan_files(pairs, options, stat_of, progress.bar.update)
    units, bands = pairs, None
    if options.tile_size is None:
        unit_bytes = _estimated_pair_bytes(pairs, file_bytes, options, channels, store)
    else:  # tiles: a large image's bands of tile rows are units of their own (tiling.py)
        units, bands, unit_bytes = planned_bands(pairs, options, channels, store)
    specs = plan_shards(
        units,
        seed=options.seed,
        val_fraction=options.val_fraction,
        test_fraction=options.test_fraction,
        compression=options.compression,
        num_shards=options.num_shards,
        shard_size=options.shard_size,
        pair_bytes=unit_bytes,
        bands=bands,
    )
    del file_bytes
    release_freed_memory()
    source = {
        "images": storage.resolved(images),
        "masks": storage.resolved(masks if masks is not None else images),
        "image_pattern": run.image_pattern,
        "mask_pattern": run.mask_pattern,
        "fingerprint": fingerprint,
    }
    return report, options, specs, source


def _output(out: Location, run: ConvertRun, cli: bool) -> OutputFolder | BucketOutput:
    modes = {"resume": run.resume, "overwrite": run.overwrite, "cli": cli}
    if storage.is_url(out):
        return BucketOutput(out, **modes, storage_options=run.storage_options)
    return OutputFolder(out, **modes)


def _write_dataset(
    out: Location,
    specs: list[ShardSpec],
    options: ConvertOptions,
    source: dict[str, Any],
    report: PairingReport,
    run: ConvertRun,
    progress: ConversionProgress,
    cli: bool,
) -> tuple[Manifest, int, int, bool]:
    """Write the shards not yet done, then the manifest; (manifest, written, reused,
    already complete).

    Overwriting a complete local dataset builds the new one beside it and swaps it in at
    the end.
    """

    def fill(folder: OutputFolder | BucketOutput, target: Location):
        """Write the shards a folder lacks; return its manifest (not yet published)."""
        begun = folder.begin(source["fingerprint"])
        if isinstance(begun, Manifest):
            return begun, 0, len(specs), True
        todo = [spec for spec in specs if spec.file_name not in begun]
        if begun:
            log.info("resuming: %d of %d shards already complete", len(begun), len(specs))
        results = dict(begun)
        channels, store = options.channels, run.storage_options
        progress.converting(sum(len(spec.pairs) for spec in todo))
        if run.runner is None:
            write = write_and_upload if storage.is_url(target) else write_shards
            results_of = write(todo, options, channels, target, run.workers, store, progress)
        else:
            results_of = run.runner(todo, options, channels, target, store)
        for result in results_of:
            folder.record(result)
            results[result.file] = result
        _say_auto_tiled(results.values())
        manifest = _manifest(specs, results, options, source, report)
        manifest = _with_record_tables(target, manifest, specs, results, store)
        return manifest, len(todo), len(begun), False

    with _output(out, run, cli) as folder:
        if not (isinstance(folder, OutputFolder) and folder.replacing):
            done = fill(folder, out)
            folder.publish(done[0])
            return done
        with OutputFolder(folder.staging, resume=False, overwrite=False) as staging:
            done = fill(staging, folder.staging)
        folder.replace_with(folder.staging, done[0])
    return done


def _say_auto_tiled(results: Iterable[ShardResult]) -> None:
    """The message for images too large for one record, tiled without --tile."""
    count = sum(result.auto_tiled for result in results)
    if count:
        log.warning(
            "%d images over Pillow's pixel limit (%d pixels) would not fit one record: each "
            "was cut into %dx%d tiles (choose the size with --tile, see docs/large-images.md)",
            count,
            Image.MAX_IMAGE_PIXELS,
            AUTO_TILE,
            AUTO_TILE,
        )


def _input_stats(
    roots: tuple[Location, Location], store: StorageOptions
) -> Callable[[Location], FileStat]:
    """How to stat an input file: ``os.stat`` for local folders; for a bucket prefix, one
    recursive listing per prefix (sizes and ETags), not one request per object."""
    if not (storage.is_url(roots[0]) or storage.is_url(roots[1])):
        return lambda path: stat(path, store)
    listed = {
        os.fspath(storage.join(root, name)): found
        for root in dict.fromkeys(roots)
        for name, found in storage.walk_stats(root, store).items()
    }

    def listed_stat(path: Location) -> FileStat:
        try:
            return listed[os.fspath(path)]
        except KeyError:
            raise FileNotFoundError(2, "removed while listing the inputs", str(path)) from None

    return listed_stat


def _scan_files(
    pairs: PairTable,
    options: ConvertOptions,
    stat_of: Callable[[Location], FileStat],
    scanned: Callable[[int], None],
) -> tuple[str, np.ndarray]:
    """One stat per file: the resume fingerprint and each pair's source bytes.

    The fingerprint identifies the inputs (paths, sizes, versions: mtimes, ETags) and the
    options, to guard --resume; nothing per file is kept but one int64 per pair.
    """
    settings = options.to_json()
    if options.on_error == "fail":
        # The decode limit only lets a pair through or stops the conversion; it changes no
        # byte of a shard that completed, so --resume after raising it (as its error
        # says) reuses them. With on_error="skip" it decides which pairs were skipped.
        del settings["decode_limit"]
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    sizes = np.zeros(len(pairs), np.int64)
    for index, pair in enumerate(pairs):
        if index % _SCAN_STEP == 0:
            scanned(min(_SCAN_STEP, len(pairs) - index))
        for path in (pair.image, pair.mask):
            try:
                found = stat_of(path)
            except OSError as exc:
                where = exc.filename or exc
                raise PairingError(f"{where}: cannot read ({exc.strerror or exc})") from exc
            sizes[index] += found.size
            digest.update(
                f"{pair.key}\0{path}\0{found.size}\0{found.version}\n".encode(
                    "utf-8", "surrogateescape"
                )
            )
    return digest.hexdigest(), sizes


def _with_image_layout(options: ConvertOptions, pairs: PairTable, store: StorageOptions):
    """Options resolved, with the channels and dtype 'auto' takes from the first image
    (with ``on_error="skip"``, the first readable one: an unreadable first image is
    skipped as any other); an encoding that cannot store those is refused, naming the
    image."""
    channels, dtype = options.channels, options.image_dtype
    first = pairs[0]
    if channels is None or dtype is None:
        first, found = _first_layout(pairs, options.on_error == "skip", store)
        channels, dtype = channels or found[0], dtype or found[1]
    reason = image_encoding(options.encoding).refuses(channels, dtype)
    if reason is not None:
        raise OptionsError(f"{storage.display(first.image)}: {reason}")
    try:
        return options.resolved(channels, dtype)
    except OptionsError as exc:  # e.g. 65 bands: named with the image they came from
        raise OptionsError(f"{storage.display(first.image)}: {exc}") from None


def _first_layout(
    pairs: PairTable, skip: bool, store: StorageOptions
) -> tuple[Pair, tuple[int, str]]:
    """(pair, its image's layout) of the first pair whose image reads (only the first
    unless ``skip``); the first pair's PairError when none does."""
    failed = None
    for pair in pairs if skip else [pairs[0]]:
        try:
            return pair, image_layout(pair, store)
        except PairError as exc:
            failed = failed or exc
    raise failed


def _estimated_pair_bytes(
    pairs: PairTable,
    file_bytes: np.ndarray,
    options: ConvertOptions,
    channels: int,
    store: StorageOptions,
) -> np.ndarray:
    """Bytes each pair will take in a shard, before compression (for shard counts)."""
    if not image_encoding(options.encoding).batchable:  # raw, deflate: sizes follow pixels
        return file_bytes
    if options.resize is not None:
        height, width = options.resize
        pixels = height * width
    else:
        sizes = []
        for pair in pairs[:_HEADER_SAMPLE]:
            try:
                with storage.open_file(pair.image, "rb", store) as f, Image.open(f) as image:
                    sizes.append(image.width * image.height)
            except Exception:  # noqa: BLE001 - an unreadable file is reported when encoded
                continue
        pixels = sum(sizes) // max(len(sizes), 1)
    return np.full(len(pairs), pixels * (channels * itemsize(options.image_dtype) + 1), np.int64)


def _with_record_tables(
    out: Location,
    manifest: Manifest,
    specs: list[ShardSpec],
    results: dict[str, ShardResult],
    store: StorageOptions,
) -> Manifest:
    """Write each split's per-record table beside its shards (before the manifest, which
    lists it): the shards' rows in the split's manifest order, with the split's classes
    (``--num-classes`` when given, else the largest class present + 1)."""
    splits = {}
    for name, split in manifest.splits.items():
        tables = [
            _shard_table(out, results[spec.file_name], manifest, store)
            for spec in specs
            if spec.split == name
        ]
        data = RecordTable.concatenated(tables, len(split.class_pixels)).to_bytes()
        file = record_table_name(name)
        storage.write_bytes(storage.join(out, file), data, store)
        table = TableInfo(file, len(data), hashlib.sha256(data).hexdigest())
        splits[name] = replace(split, record_table=table)
    return replace(manifest, splits=splits)


def _shard_table(
    out: Location, result: ShardResult, manifest: Manifest, store: StorageOptions
) -> RecordTable:
    """A shard's rows of the table: from its result, or, for a shard journaled by a
    tfshards without tables (then reused by --resume), from the masks in its file."""
    table = result.table()
    if table is not None:
        return table
    where = storage.display(storage.join(out, result.file))
    with local_shard(out, result.file, store) as local:
        if local is None:
            raise OutputError(f"{where}: missing, though the resume journal lists it")
        ignore = manifest.mask.ignore_label
        rows = list(shard_rows(local, manifest.compression.type, ignore, where))
    return RecordTable.from_rows(rows, 256)


def _manifest(
    specs: list[ShardSpec],
    results: dict[str, ShardResult],
    options: ConvertOptions,
    source: dict[str, Any],
    report: PairingReport,
) -> Manifest:
    splits: dict[str, SplitInfo] = {}
    for split in dict.fromkeys(spec.split for spec in specs):
        shard_results = [results[s.file_name] for s in specs if s.split == split]
        pixels = [
            sum(column) for column in zip(*(r.class_pixels for r in shard_results), strict=True)
        ]
        ignored = pixels[options.ignore_label] if options.ignore_label is not None else 0
        if options.ignore_label is not None:  # kept out of the class histogram and values
            pixels[options.ignore_label] = 0
        classes = options.num_classes or (
            max(i for i, n in enumerate(pixels) if n) + 1 if any(pixels) else 1
        )
        splits[split] = SplitInfo(
            records=sum(r.records for r in shard_results),
            bytes=sum(r.bytes for r in shard_results),
            class_pixels=pixels[:classes],
            mask_values=[value for value, count in enumerate(pixels) if count],
            ignored_pixels=ignored,
            shards=[
                ShardInfo(r.file, r.records, r.bytes, r.sha256, r.crc32c) for r in shard_results
            ],
            image_stats=split_stats([r.image_stats for r in shard_results]),
        )
    sizes = {size for r in results.values() for size in r.image_sizes}
    height, width = next(iter(sizes)) if len(sizes) == 1 else (None, None)
    return Manifest(
        image=ImageInfo(options.encoding, options.channels, height, width, options.image_dtype),
        mask=MaskInfo(
            options.mask_encoding,
            options.num_classes,
            [list(entry) for entry in options.mask_map or ()],
            options.ignore_label,
        ),
        compression=CompressionInfo(options.compression, options.compression_level),
        seed=options.seed,
        options=options.to_json(),
        source=source,
        splits=splits,
        skipped=[s for spec in specs for s in results[spec.file_name].skipped],
        unpaired={
            "images": len(report.unmatched_images),
            "masks": len(report.unmatched_masks),
            "duplicate_keys": len(report.duplicate_keys),
            "ignored_files": report.ignored_files,
        },
    )
