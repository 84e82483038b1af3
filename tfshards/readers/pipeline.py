"""`tfshards.read`: a tf.data pipeline over the shards of one split.

Every decision is made once, in a :class:`ReadPlan` (``plan.py``). Every read but the
tf.data service's is the ordered reader's (``ordered.py``: batches read by record index,
crops and pads included, resumable); the tf.data service's is a chain of stages
(``stages.py``), each a ``(Dataset, ReadPlan) -> Dataset`` function:

    shard records (source) -> decoded -> served -> shuffled pairs -> sized -> batched
      -> finished -> counted -> budgeted
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

if TYPE_CHECKING:
    import keras

from tfshards.errors import OptionsError, TfshardsError
from tfshards.malloc_arenas import keep_freed_batches
from tfshards.readers import stages
from tfshards.readers.arguments import check_batches, check_start
from tfshards.readers.cache import DiskCache, default_cache_root
from tfshards.readers.cache.native import NativeStore
from tfshards.readers.cache.store import PairStore
from tfshards.readers.decode import Augment
from tfshards.readers.mix_plan import mixed_store, plan_mix
from tfshards.readers.mixing import Source
from tfshards.readers.options import ReadOptions
from tfshards.readers.ordered import ordered_dataset, store_rows
from tfshards.readers.plan import plan_read
from tfshards.readers.resume import ReadState
from tfshards.readers.sampling import ClassBalanced
from tfshards.readers.source import shard_records
from tfshards.schemas.manifest import Manifest
from tfshards.sources.records import dataset_changed, file_identity

STAGES = (  # the tf.data service's per-pair path
    stages.decoded,
    stages.served,
    stages.shuffled_pairs,
    stages.sized,
    stages.batched,
    stages.finished,
    stages.counted,
    stages.budgeted,
)


def read(
    path: str | os.PathLike | Mapping[str, str | os.PathLike | Source],
    *,
    split: str = "train",
    batch_size: int = 32,
    image_size: tuple[int, int] | None = None,
    crop_size: tuple[int, int] | None = None,
    pad_to: tuple[int, int] | None = None,
    cache: bool | str | os.PathLike | None = None,
    augment: Augment | keras.layers.Layer | None = None,
    seed: int | None = None,
    shuffle: bool | None = None,
    image_dtype: str = "float32",
    normalize: bool = False,
    one_hot: bool = False,
    drop_remainder: bool = False,
    repeat: bool = False,
    input_context: tf.distribute.InputContext | None = None,
    service: str | None = None,
    options: ReadOptions | None = None,
    start: tuple[int, int] | ReadState | None = None,
    records: Sequence[str] | Sequence[int] | np.ndarray | None = None,
    sampling: Sequence[float] | np.ndarray | ClassBalanced | None = None,
    epoch_size: int | None = None,
    label_map: Mapping[int, int | None] | Sequence[int | None] | None = None,
    num_classes: int | None = None,
    weights: Mapping[str, float] | Sequence[float] | None = None,
) -> tf.data.Dataset:
    """Stream ``(image, mask)`` batches of one split of a converted dataset.

    image: float32 in [0, 1] (value / 255, or / 65535 for uint16 images), [B, H, W, C];
    ``image_dtype="uint8"`` or ``"uint16"``: the samples (uint8 of uint16 is refused);
    ``normalize=True``: float32 (value - mean) / std per channel, the train split's.
    mask: int32 class indices [B, H, W, 1] (float32 one-hot [B, H, W, K] with ``one_hot``).

    augment: a Keras 3 augmentation layer (or a ``keras.layers.Pipeline`` or
    ``keras.Sequential`` of them; a Sequential runs as a Pipeline of its layers, so it
    works on every Keras backend), applied to whole batches as
    ``{"images", "segmentation_masks"}`` so each mask moves with its image (give the
    layers a ``seed`` for reproducible runs; with ``image_dtype="uint8"`` the layers'
    float images are rounded and cast back to uint8); or a function
    ``(image, mask) -> (image, mask)`` applied to each pair. Both run after the cache
    and the shuffle, so they stay random every epoch.

    Records of different sizes: ``crop_size=(h, w)`` trains on random crops at native
    resolution (``ReadOptions(crop_scale=(0.5, 2.0))`` scales randomly first; smaller
    pairs are padded, masks with the ignore label, or 255 when none is declared);
    ``pad_to=(h, w)`` or ``batch_size=1`` evaluates at native size; ``image_size``
    resizes every record instead. A crop's place and scale are drawn from a generator
    keyed by (seed, epoch, batch, position in the batch), so crops resume too.

    start: ``(epoch, batch)`` or a :class:`ReadState` to begin at, exactly where an
    uninterrupted read would be (see :class:`tfshards.ResumeCallback`); every read
    resumes, crops and pads included, except through the tf.data service (``service``).

    records: only these records of the split (keys, a boolean mask over its per-record
    table ``tfshards.records(path, split)``, or indices), each once per epoch. sampling:
    a weight per record, or ``tfshards.ClassBalanced(...)``: each epoch draws
    ``epoch_size`` records (default: the records read) as a function of (seed, epoch),
    decided from the table before a pixel is read (docs: "Sampling and subsets").

    label_map ``{class: shared class or None}``, num_classes: masks read in other classes;
    path ``{"a": "a/", "b": "b/"}`` with ``weights`` mixes datasets ("Mixing datasets").

    cache: None streams; "memory" caches in RAM; True caches decoded uint8 pairs on disk
    beside the shards (or in the user cache folder); a path caches there. A disk cache is
    keyed by the shards' hashes and the options, so it is rebuilt when either changes.

    >>> train = tfshards.read("shards/", split="train", batch_size=32,
    ...                       cache=True, seed=0)  # doctest: +SKIP
    >>> model.fit(train, validation_data=tfshards.read("shards/", split="val"))  # doctest: +SKIP
    """
    keep_freed_batches()  # see malloc_arenas.py
    # Every keyword but start= goes to the plan, as given (plan_read checks them all).
    arguments = {name: value for name, value in locals().items() if name != "start"}
    plan = plan_mix(**arguments) if isinstance(path, Mapping) else plan_read(**arguments)
    check_batches(plan)
    if plan.ordered:
        check_start(start, plan)
        return stages.budgeted(ordered_dataset(plan, start, pair_store(plan)), plan)
    if start is not None:
        raise OptionsError(
            f"start= needs a read by index, and this one cannot be: {plan.unordered}"
        )
    dataset = shard_records(plan)
    for stage in STAGES:
        dataset = stage(dataset, plan)
    return dataset


def pair_store(plan) -> PairStore | NativeStore | None:
    """The ordered path's cache: whole decoded records (crops and pads are cut from them
    after) in RAM, on disk, or none; records of many sizes each at its own size."""
    shards, shape = plan.shards, plan.shape
    if plan.cache.kind == "none":
        return None
    if plan.mix is not None:
        return mixed_store(plan)
    records, subset = shards.records, ""
    if (rows := store_rows(plan.selection)) is not None:  # only the records it can draw
        records, subset = int(rows.max()) + 1, plan.selection.digest
    cache, unchanged = None, None
    if plan.cache.kind == "disk":
        root = plan.cache.root or default_cache_root(shards.root)
        cache = DiskCache.for_split(
            root, shards, shape, (0, 1), files="flat", subset=subset, records=records
        )
        stored = shards.manifest.splits[shards.split].bytes * records // max(1, shards.records)
        cache.prepare(stored_bytes=stored)
        unchanged = unchanged_check(plan)
    if shape[0] is None:
        return NativeStore(records, shape[2], cache, unchanged)
    direct = plan.options.direct_reads
    return PairStore(records, shape, cache, unchanged=unchanged, direct_reads=direct)


def unchanged_check(plan):
    """A check, run before a disk cache is published, that the dataset is still the one
    the read began with: its manifest and every shard file (else DatasetChangedError)."""
    shards = plan.shards
    identities = {path: file_identity(path) for path in shards.paths}

    def check() -> None:
        try:
            manifest = Manifest.load(shards.root, plan.options.storage_options)
        except TfshardsError:
            manifest = None
        if manifest != shards.manifest:
            raise dataset_changed(str(shards.root), "its manifest is another one now")
        if shards.remote:
            return  # downloaded shards were checked against the manifest's sha256s
        for path, identity in identities.items():
            if file_identity(path) != identity:
                raise dataset_changed(path, "another file now has its name")

    return check
