"""ReadPlan: every decision of one ``tfshards.read`` call, made once, before any stage runs.

The plan holds the split's shards, the decoded shape and decoder, the ordering, the
cache plan, sizing, batching and finishing. The stages (``stages.py``) only look
things up in it; none decides anything the plan already decided.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from tfshards.arguments import checked_size
from tfshards.errors import OptionsError
from tfshards.readers.arguments import check_arguments
from tfshards.readers.cache import user_cache_dir
from tfshards.readers.decode import (
    PairDecoder,
    finisher,
    is_keras_layer,
    layer_augmenter,
    pair_decoder,
)
from tfshards.readers.labels import MaskLabels, read_labels
from tfshards.readers.memory_limits import autotune_ram_budget
from tfshards.readers.options import (
    SHUFFLE_BUFFER_BYTES,
    CachePlan,
    Ordering,
    ReadOptions,
    ordering,
)
from tfshards.readers.order import group_shards
from tfshards.readers.sampling import Selection
from tfshards.readers.selection import select
from tfshards.readers.shards import SplitShards, split_shards
from tfshards.readers.sizing import Sizing
from tfshards.sources.records import SplitRecords
from tfshards.sources.shard_cache import shard_cache_key

Finish = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
Shape = tuple[int | None, int | None, int]


@dataclass(frozen=True)
class Batching:
    """Batch size (per replica), whether the last short batch is dropped, and the count."""

    size: int
    drop_remainder: bool
    records: int

    @property
    def count(self) -> int:
        if self.drop_remainder:
            return self.records // self.size
        return math.ceil(self.records / self.size)


@dataclass(frozen=True)
class Finishing:
    """uint8 pairs -> output: ``finish`` (dtype, per-pair augment, one-hot) and an optional
    Keras layer applied to whole finished batches."""

    finish: Finish
    per_pair_augment: bool
    layer: Finish | None
    image_dtype: str = "float32"  # what ``finish`` delivers: "float32" or "uint8"


@dataclass(frozen=True)
class Downloads:
    """How a remote dataset's shards reach the local shard cache: where, how many bytes at
    most, how many downloads run ahead of the reader, how many shards stay marked in use."""

    folder: Path
    limit: int | None
    ahead: int
    keep: int  # shards marked in use at once
    cycle_length: int | None = None  # at most this many shards read at once


@dataclass(frozen=True)
class ReadPlan:
    """One read() call's decisions. ``ordered`` reads (all but the tf.data service's) are
    batched by the ordered reader (ordered.py), crops and pads included; the tf.data
    service's go through the per-pair stages (stages.py).
    """

    shards: SplitShards
    decoder: PairDecoder
    order: Ordering
    cache: CachePlan
    sizing: Sizing
    batching: Batching
    finishing: Finishing
    options: ReadOptions
    seed: int | None
    pipeline: tuple[int, int]
    service: str | None
    repeat: bool
    downloads: Downloads | None = None  # None: local shards, read where they are
    ram_budget: int | None = None  # bytes for tf.data's autotuned buffers; None: its default
    order_seed: int = 0  # the ordered path's seed: ``seed``, or drawn for this read() call
    unordered: str | None = None  # why the ordered path does not apply; None: it does
    records: SplitRecords | None = None  # the split's records by index (ordered path)
    group_shards: int = 1  # shards whose records one epoch mixes together (order.py)
    selection: Selection | None = None  # records=, sampling=, epoch_size= (sampling.py)
    labels: MaskLabels | None = None  # label_map= (labels.py): masks read in other classes
    mix: Any = None  # several datasets read as one (mixing.py's Mix)

    @property
    def epoch_records(self) -> int:
        """Records of one epoch: the split's, or the selection's epoch size."""
        return self.shards.records if self.selection is None else self.selection.epoch_size

    @property
    def ordered(self) -> bool:
        """Batches are a function of (seed, epoch, batch), read by index (ordered.py)."""
        return self.unordered is None

    @property
    def shape(self) -> Shape:
        return self.decoder.shape

    @property
    def batch_shape(self) -> Shape:
        """The shape of each pair of a batch: cropped or padded, else as decoded."""
        if self.sizing.active:
            return (*self.sizing.size, self.shape[2])
        return self.shape

    def shuffle_buffer(self) -> int:
        """Decoded pairs that fit in SHUFFLE_BUFFER_BYTES (the tf.data service's path)."""
        if self.options.shuffle_buffer is not None:
            return self.options.shuffle_buffer
        shards, (height, width, channels) = self.shards, self.shape
        stored = shards.manifest.splits[shards.split].bytes // max(shards.records, 1)
        # Native sizes are unknown before decoding: decoded pairs take about 3x a stored record.
        record_bytes = height * width * (channels + 1) if height else 3 * stored
        return max(1, min(shards.records, 10_000, SHUFFLE_BUFFER_BYTES // record_bytes))


def plan_read(path: str | os.PathLike, **arguments: Any) -> ReadPlan:
    """The plan of ``read(path, **arguments)`` (read()'s keywords, all given)."""
    a = arguments
    options = a["options"] or ReadOptions()
    cache = CachePlan.of(a["cache"])
    check_arguments(path, a, cache)
    shuffle = a["split"] == "train" if a["shuffle"] is None else a["shuffle"]
    pipeline, batch_size = (0, 1), a["batch_size"]
    if (context := a["input_context"]) is not None:
        pipeline = (context.input_pipeline_id, context.num_input_pipelines)
        batch_size = context.get_per_replica_batch_size(batch_size)
    shards = split_shards(path, a["split"], storage_options=options.storage_options)
    sizing = Sizing(a["crop_size"], options.crop_scale, a["pad_to"])
    _check_sample_type(shards, a, sizing)
    shape = _target_shape(shards, a["image_size"], sizing, batch_size)
    unordered = _unordered_because(a["service"])
    labels = read_labels(shards, a, unordered)
    selection = _selection(path, shards, a, unordered, options, labels)
    if not unordered and pipeline[1] > 1 and cache.kind != "none":
        raise OptionsError(_no_cache_across_pipelines(cache, pipeline[1], shards.records))
    if unordered and pipeline[1] > 1:  # these paths share the shards out by file
        shards = split_shards(
            path,
            a["split"],
            pipeline=pipeline,
            manifest=shards.manifest,
            storage_options=options.storage_options,
        )
    kept = cache.kind != "none" or bool(a["service"])
    order = ordering(shards, options, shuffle=shuffle, seed=a["seed"], cached=kept)
    downloads = _downloads(shards, options, order.cycle_length) if shards.remote else None
    if downloads is not None and downloads.cycle_length is not None:  # fit the limit
        order = replace(order, cycle_length=downloads.cycle_length)
    return ReadPlan(
        shards=shards,
        decoder=pair_decoder(shards, shape, counted=not a["service"]),
        order=order,
        cache=cache,
        sizing=sizing,
        batching=Batching(
            batch_size,
            a["drop_remainder"],
            shards.records if selection is None else selection.epoch_size,
        ),
        finishing=mapped_finishing(shards, a, labels),
        options=options,
        seed=a["seed"],
        order_seed=_resolved_seed(a["seed"], pipeline[1]),
        pipeline=pipeline,
        service=a["service"],
        repeat=a["repeat"],
        downloads=downloads,
        ram_budget=autotune_ram_budget(),
        unordered=unordered,
        records=None if unordered else SplitRecords.for_options(shards, options),
        group_shards=_group_shards(shards, options),
        selection=selection,
        labels=None if labels is None else MaskLabels.of([labels], [0]),
    )


def _selection(
    path: str | os.PathLike,
    shards: SplitShards,
    a: dict[str, Any],
    unordered: str | None,
    options: ReadOptions,
    labels: Any = None,
) -> Selection | None:
    """records=, sampling= and epoch_size= resolved against the split's per-record table."""
    given = [n for n in ("records", "sampling", "epoch_size") if a.get(n) is not None]
    if not given:
        return None
    if unordered is not None:
        raise OptionsError(
            f"{'= and '.join(given)}= need a read by index, and this one cannot be: {unordered}"
        )
    from tfshards.sources.record_tables import split_table

    table = split_table(shards, storage_options=options.storage_options)
    if len(table) != shards.records:
        raise OptionsError(
            f"the per-record table of split {shards.split!r} of {shards.root} has "
            f"{len(table)} rows but the split holds {shards.records} records: it belongs "
            "to another conversion; run `tfshards verify` on the dataset"
        )
    table = table if labels is None else labels.table(table)  # in the shared classes
    return select(table, a.get("records"), a.get("sampling"), a.get("epoch_size"))


def _unordered_because(service: str | None) -> str | None:
    """Why a read cannot take the ordered path (read by index, resumable); None if it can."""
    if service is not None:
        return "the tf.data service decides the order on its workers"
    return None


def _no_cache_across_pipelines(cache: CachePlan, pipelines: int, records: int) -> str:
    """Why a cache with several input pipelines is refused on the ordered path."""
    where = "on disk (cache=True or a folder)"
    if cache.kind == "memory":
        where = "in memory (cache='memory')"
    return (
        f"a cache {where} cannot be combined with input_context ({pipelines} input "
        "pipelines): each pipeline reads only its slice of every epoch's one global order, "
        f"so none reads all {records} records its cache must hold: it would never be "
        "complete, each host would fill a full-size cache of its own, and every epoch "
        "would decode again. Pass cache=None (each "
        "pipeline decodes only its slice), or cache with one input pipeline (no "
        "input_context: strategy.experimental_distribute_dataset splits its batches)"
    )


def _group_shards(shards: SplitShards, options: ReadOptions) -> int:
    """Shards mixed together in an epoch; with a shard cache limit, as many as it holds
    beside the ones downloading ahead."""
    sizes = [shard.bytes for shard in shards.shards]
    group = group_shards(sizes, options.cycle_length, remote=shards.remote)
    if shards.remote and options.shard_cache_limit is not None:
        fit = options.shard_cache_limit // max(1, max(sizes))
        group = max(1, min(group, fit - 2))
    return group


def _resolved_seed(seed: int | None, pipelines: int) -> int:
    """The order's seed: the one given, else one drawn for this read() call; with several
    input pipelines 0, so that pipelines on other hosts share one order."""
    if seed is not None:
        return int(seed)
    if pipelines > 1:
        return 0
    return int(np.random.SeedSequence().entropy % 2**63)


def _downloads(shards: SplitShards, options: ReadOptions, cycle_length: int) -> Downloads:
    """The shard cache of a remote dataset. With a limit, the shards open at once (up to
    twice the cycle length: tf.data opens the next ones early), those downloading ahead
    and the one arriving must fit in it together."""
    root = Path(options.shard_cache) if options.shard_cache else user_cache_dir() / "shards"
    folder = root / shard_cache_key(shards.manifest)
    ahead, limit = options.download_ahead, options.shard_cache_limit
    if limit is None:
        return Downloads(folder, None, ahead, _open_at_once(cycle_length) + ahead)
    largest = max(shard.bytes for shard in shards.shards)
    fit = limit // max(largest, 1)
    if fit < 3:
        raise OptionsError(
            f"shard_cache_limit={limit} bytes holds {fit} of this dataset's shards (the "
            f"largest is {largest / 2**20:.1f} MiB); reading needs room for at least 3: "
            "raise the limit, or convert with smaller shards (--shard-size)"
        )
    cycle = max(c for c in range(1, cycle_length + 1) if _open_at_once(c) + 2 <= fit)
    ahead = max(1, min(ahead, fit - 1 - _open_at_once(cycle)))
    return Downloads(folder, limit, ahead, _open_at_once(cycle), cycle)


def _open_at_once(cycle_length: int) -> int:
    return 1 if cycle_length == 1 else 2 * cycle_length


def mapped_finishing(shards: SplitShards, a: dict[str, Any], labels: Any) -> Finishing:
    """read()'s finishing; with label maps, one-hot in the classes they read into."""
    if labels is None or not a["one_hot"]:
        return _finishing(shards, a)
    from tfshards.readers.relabel import one_hot_finishing

    return one_hot_finishing(_finishing(shards, {**a, "one_hot": False}), labels)


def _finishing(shards: SplitShards, a: dict[str, Any]) -> Finishing:
    """A Keras layer runs on whole finished batches (then one-hot); a function per pair.
    ``a``: read()'s keywords (augment, image_dtype, normalize, one_hot, seed)."""
    augment, one_hot, normalize = a["augment"], a["one_hot"], a["normalize"]
    image_dtype = "float32" if normalize else a["image_dtype"]
    if is_keras_layer(augment):
        layer = layer_augmenter(augment, shards, one_hot, image_dtype, a["seed"])
        finish = finisher(shards, image_dtype, None, False, normalize)
        return Finishing(finish, False, layer, image_dtype)
    finish = finisher(shards, image_dtype, augment, one_hot, normalize)
    return Finishing(finish, augment is not None, None, image_dtype)


def _check_sample_type(shards: SplitShards, a: dict[str, Any], sizing: Sizing) -> None:
    """What a uint16 dataset cannot give: uint8 images (a silent loss of its low bits),
    or images resized while read (image_size, crop_scale), which would blend bytes."""
    if shards.manifest.image.dtype == "uint8":
        return
    where = f"{shards.root} stores uint16 images"
    if a["image_dtype"] == "uint8" and not a["normalize"]:
        raise OptionsError(
            f"image_dtype='uint8' is refused: {where}, and uint8 would drop their low "
            "bits; read uint16 or float32 (value / 65535), or normalize=True"
        )
    if a["image_size"] is not None or sizing.crop_scale is not None:
        what = "image_size" if a["image_size"] is not None else "ReadOptions(crop_scale)"
        raise OptionsError(
            f"{what} is refused: {where}, which tfshards does not resize while reading; "
            "convert with resize=(h, w), or read crop_size without crop_scale"
        )


def _target_shape(
    shards: SplitShards, image_size: tuple[int, int] | None, sizing: Sizing, batch_size: int
) -> Shape:
    """The decoded shape (its last axis counts bytes: channels x itemsize): resized,
    stored, or (None, None, C) to keep each record's own."""
    image = shards.manifest.image
    channels = image.channels * image.itemsize
    if image_size is not None:
        if sizing.active:
            raise OptionsError("pass image_size (resize) or crop_size/pad_to, not both")
        return (*checked_size("image_size", image_size), channels)
    stored = shards.manifest.byte_shape
    if stored is not None:
        _check_pad_to(shards, stored, sizing)
        return stored
    if sizing.active or batch_size == 1:
        return (None, None, channels)
    raise OptionsError(
        "the records of this dataset differ in size, so they cannot be batched as they "
        "are; pass crop_size=(h, w) to train on random crops, pad_to=(h, w) or "
        "batch_size=1 to evaluate at native size, or image_size=(h, w) to resize them all"
    )


def _check_pad_to(shards: SplitShards, stored: Shape, sizing: Sizing) -> None:
    """Records of one known size larger than pad_to: refused now, in tfshards' words (the
    shapes are static, so TensorFlow would fail first, in tf.ensure_shape's)."""
    if sizing.pad_to is None:
        return
    height, width = sizing.pad_to
    if stored[0] > height or stored[1] > width:
        raise OptionsError(
            f"a record is larger than pad_to=({height}, {width}): every record of "
            f"{shards.root} is {stored[0]}x{stored[1]} (HxW, from its manifest); pass a "
            "larger pad_to, or batch_size=1 to read records at their own size"
        )
