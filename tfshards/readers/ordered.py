"""The ordered reader: batches that are a function of (seed, epoch, batch), from any position.

    steps (a cursor's start + 0, 1, 2...) -> (epoch, batch) -> record indices (order.py)
      -> one read per batch: decoded pairs from a ready cache, or records by offset
      -> raw/deflate decoded into one array in the same call (sources/pixel_batches.py);
         PNG/JPEG (or records to resize) by TensorFlow, one record at a time
      -> kept in the cache while it is being built
      -> finished (dtype, one-hot) -> a Keras layer seeded from (seed, epoch, batch,
         pipeline)

Each iteration of the dataset starts where its :class:`Cursor` says: the step after the
previous iteration, or where :class:`tfshards.ResumeCallback` puts it. A step is a batch
counted from batch 0 of epoch 0, so ``start=(epoch, batch)`` is one number, and the
state to resume from is a few numbers (``ReadState``).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import tensorflow as tf

from tfshards.errors import OptionsError
from tfshards.readers.cache.store import PairStore
from tfshards.readers.class_crops import class_centres
from tfshards.readers.crops import crop_boxes, cut, pad_boxes, uniform_draws
from tfshards.readers.decode import fill_label
from tfshards.readers.exit_guard import guarded
from tfshards.readers.labels import MaskLabels
from tfshards.readers.order import BatchSchedule, EpochOrder
from tfshards.readers.recycled import RecycledArrays
from tfshards.readers.relabel import relabeller
from tfshards.readers.sampling import SampledOrder
from tfshards.readers.sizing import Sizing, placed, placed_batch
from tfshards.schemas.tfrecord import RecordError, example_fields
from tfshards.sources.pixel_batches import (
    PairDecodeError,
    PixelBatches,
    aligned_empty,
    batches_of,
)
from tfshards.sources.records import SplitRecords

AUTOTUNE = tf.data.AUTOTUNE
NO_RECORDS = np.zeros(0, object)  # a batch that comes decoded carries no records


class Cursor:
    """The step each new iteration starts at; thread-safe (tf.data calls it)."""

    def __init__(self, start: int, per_iteration: int | None) -> None:
        self.next_start = start
        self.per_iteration = per_iteration  # None: one endless iteration
        self.iteration_start = start
        self.iterations = 0
        self._lock = threading.Lock()

    def begin(self) -> int:
        """Begin an iteration: its first step."""
        with self._lock:
            self.iteration_start = self.next_start
            self.iterations += 1
            if self.per_iteration is not None:
                self.next_start += self.per_iteration
            return self.iteration_start

    def move_to(self, step: int) -> None:
        with self._lock:
            self.next_start = step


@dataclass
class OrderedReader:
    """What one ordered ``read()`` call reads, and where its iterations start."""

    order: EpochOrder | SampledOrder
    schedule: BatchSchedule
    records: SplitRecords
    store: PairStore | None
    cursor: Cursor
    shape: tuple[int, int, int]
    identity: dict  # what a saved state must match (see resume.py)
    mask_buffers: RecycledArrays  # the int32 masks fetch delivers
    downloads_ahead: int = 0  # steps whose shards are made local at once, ahead of reading
    pixels: PixelBatches | None = None  # raw/deflate records of the size read: decoded in fetch
    sizing: Sizing | None = None  # crops or pads, placed in fetch (crops.py)
    seed: int = 0  # the crops' draws are keyed by it (and the epoch, batch and position)
    fill: int = 255  # the mask value of pixels a padded pair does not hold
    store_rows: np.ndarray | None = None  # a sampled read's store row of each record
    labels: MaskLabels | None = None  # label maps, applied to masks after the cache

    def batch_indices(self, step: int) -> np.ndarray:
        epoch, batch = self.schedule.position(step)
        return self.schedule.batch(self.order.records(epoch), batch)

    def fetch(self, step: tf.Tensor):
        """py_function body: (indices, records, decoded, images, masks, boxes) of one
        step: its pairs decoded (from a ready store, or raw/deflate records decoded
        here), cut here when crops and pads need no resizing; else its records for
        TensorFlow to decode (PNG/JPEG, records to resize, records of many sizes); boxes:
        where each pair is cut (see ``boxes``)."""
        step = int(step)
        indices = self.batch_indices(step)
        pixels = self._decoded(indices)
        if pixels is None:
            records = self.records.read(indices)
            if self.shape[0] is None:
                sizes = _recorded_sizes(records, self.records.located, indices)
            else:
                sizes = np.tile(np.array(self.shape[:2]), (len(indices), 1))
            boxes = self.boxes(step, sizes, indices)
            height, width, channels = (n or 0 for n in self.delivered_shape)
            empty = np.zeros((0, height, width, channels), np.uint8)
            masks = np.zeros((0, height, width, 1), np.int32)
            return indices, records, False, empty, masks, boxes
        images, masks = pixels
        sizes = np.array([image.shape[:2] for image in images], np.int64).reshape(-1, 2)
        boxes = self.boxes(step, sizes, indices)
        if self.cuts:
            images, masks = self._cut(images, masks, boxes)
        elif self.shape[0] is None:  # to resize (crop_scale): each at the top left
            images, masks = _stacked(images, sizes), _stacked(masks, sizes).astype(np.int32)
        else:
            images, masks = _shared(images), self._wide(masks)
        return indices, NO_RECORDS, True, images, masks, boxes

    def _decoded(self, indices: np.ndarray):
        """The batch's pairs from a ready store, or raw/deflate records decoded here (kept
        in the store while it is built); None when TensorFlow decodes them."""
        store = self.store
        if store is not None and store.ready:
            return store.read(self.rows(indices))
        if self.pixels is None:
            return None
        located = self.records.located
        images, masks, _ = self.pixels.read(self.records, indices, lambda k: located(indices[k]))
        if store is not None:  # being built: kept before the batch is delivered
            store.write(self.rows(indices), images, masks)
        return images, masks

    @property
    def delivered_shape(self) -> tuple[int | None, int | None, int]:
        """The shape of each pair fetch delivers decoded: cut, or whole."""
        sizing = self.sizing
        if self.cuts and sizing is not None and sizing.active:
            return (*sizing.size, self.shape[2])
        return self.shape

    @property
    def cuts(self) -> bool:
        """Decoded pairs are cut here (crops and pads without crop_scale, and batches of
        one pair of its own size); else TensorFlow cuts them."""
        sizing = self.sizing
        if sizing is None or not sizing.active:
            return self.shape[0] is None
        return sizing.crop_scale is None

    def _cut(self, images, masks, boxes: np.ndarray) -> tuple[tf.Tensor, tf.Tensor]:
        """Decoded pairs cut as their boxes say: the batch's images and int32 masks."""
        if not self.sizing.active:  # one pair, of its own size
            image = aligned_empty(images[0].shape)
            image[...] = images[0]
            return _shared(image[None]), tf.constant(masks[0][None], tf.int32)
        out_masks = self.mask_buffers.take(len(boxes))
        out_images = aligned_empty((len(boxes), *out_masks.shape[1:3], self.shape[2]))
        cut(images, masks, boxes, out_images, out_masks, self.fill)
        return _shared(out_images), _shared(out_masks)

    def boxes(self, step: int, sizes: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """[B, 6] int32 of the batch's pairs: their own (height, width), then where each
        is cut (crops.py's box: height and width scaled to, top, left), from draws keyed
        by (seed, epoch, batch, position in the global batch); a pair padded, or read at
        its own size, is cut at (0, 0) to its own size."""
        sizing = self.sizing
        heights, widths = sizes[:, 0], sizes[:, 1]
        if sizing is None or sizing.crop_size is None:
            if sizing is not None and sizing.pad_to is not None:
                self._check_pad_to(sizes, indices)
            cuts = pad_boxes(heights, widths)
        else:
            epoch, batch = self.schedule.position(step)
            first = self.schedule.pipeline * self.schedule.batch_size
            positions = first + np.arange(len(sizes))
            draws = uniform_draws(self.seed, epoch, batch, positions)
            centres = self._class_centres(epoch, batch, indices, positions)
            cuts = crop_boxes(heights, widths, sizing.crop_size, draws, sizing.crop_scale, centres)
        return np.concatenate([sizes.astype(np.int32), cuts], axis=1)

    def _class_centres(
        self, epoch: int, batch: int, indices: np.ndarray, positions: np.ndarray
    ) -> np.ndarray | None:
        """A class-balanced read's crop centres, on the classes the records were drawn
        for (class_crops.py); None for other reads."""
        selection = getattr(self.order, "selection", None)
        if selection is None or selection.balanced is None or selection.table is None:
            return None
        classes = self.schedule.batch(self.order.classes(epoch), batch)
        return class_centres(
            selection.table,
            indices,
            classes,
            selection.balanced.crop_fraction,
            self.sizing.crop_size,
            (self.seed, epoch, batch),
            positions,
        )

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """Store rows of records: their indices, or a sampled read's rows (its store holds
        only the records it can draw)."""
        return indices if self.store_rows is None else self.store_rows[indices]

    def _check_pad_to(self, sizes: np.ndarray, indices: np.ndarray) -> None:
        larger = np.flatnonzero(np.any(sizes > np.array(self.sizing.pad_to), axis=1))
        if len(larger):
            k = int(larger[0])
            height, width = self.sizing.pad_to
            raise OptionsError(
                f"{self.records.located(int(indices[k]))}: a record is larger than "
                f"pad_to=({height}, {width}): it is {sizes[k][0]}x{sizes[k][1]} (HxW); pass "
                "a larger pad_to, or batch_size=1 to read records at their own size"
            )

    def _wide(self, masks: np.ndarray) -> tf.Tensor:
        """uint8 masks as the int32 tensor read() delivers, in a recycled array (see
        recycled.py); the finishing cast is then a no-op."""
        out = self.mask_buffers.take(len(masks))
        np.copyto(out, masks.reshape(out.shape), casting="unsafe")
        return _shared(out)

    def prefetch(self, step: tf.Tensor) -> int:
        """py_function body: the shards of a step's records made local (URL, gzip/zlib)."""
        self.records.prefetch(self.batch_indices(int(step)))
        return int(step)

    def keep(self, indices, images, masks) -> bool:
        """py_function body: pairs TensorFlow decoded into the store while it is built
        (a batch of one size, or one pair of its own size: a list of one)."""
        if self.store is not None and not self.store.ready:
            indices, images, masks = indices.numpy(), images.numpy(), masks.numpy()
            if indices.ndim == 0:
                indices, images, masks = indices[None], [images], [masks]
            self.store.write(self.rows(indices), images, masks)
        return True


def _stacked(pixels: list[np.ndarray], sizes: np.ndarray) -> np.ndarray:
    """Arrays of many sizes at the top left of one zeroed array of the largest size."""
    height, width = sizes.max(axis=0) if len(sizes) else (0, 0)
    out = np.zeros((len(pixels), height, width, pixels[0].shape[-1]), np.uint8)
    for row, one in zip(out, pixels, strict=True):
        row[: one.shape[0], : one.shape[1]] = one
    return out


def _recorded_sizes(
    records: list[bytes], located: Callable[[int], str], indices: np.ndarray
) -> np.ndarray:
    """[B, 2]: each record's (height, width), as it says of itself (a walk over its fields, no
    pixels decoded); TensorFlow checks its pixels against them when it decodes them."""
    sizes = np.zeros((len(records), 2), np.int64)
    for k, record in enumerate(records):
        try:
            fields = example_fields(record)
            sizes[k] = fields["image/height"], fields["image/width"]
        except (RecordError, KeyError, TypeError, ValueError) as exc:
            where = located(int(indices[k]))
            raise PairDecodeError(f"{where}: its height and width cannot be read ({exc})") from exc
    return sizes


def _shared(pixels: np.ndarray) -> tf.Tensor:
    """A tensor of a fresh, 64-byte aligned array's memory, not a copy of it (a py_function
    copies the arrays it returns: about 0.6 ms per 6 MiB batch)."""
    return tf.experimental.dlpack.from_dlpack(pixels.__dlpack__())


def _body(reader: OrderedReader, method: str) -> Callable:
    """``reader.<method>`` as a py_function body that holds the reader weakly.

    TensorFlow keeps every py_function body until the program ends (it ties them to the
    outermost graph), so a body holding the reader would keep a dropped dataset's RAM
    cache and open cache files with it. The dataset (and its iterators, which hold it)
    keeps the reader alive instead; see ``_kept_by``.
    """
    reached, held = attrgetter(method), weakref.ref(reader)

    def call(*args):
        alive = held()
        if alive is None:
            raise RuntimeError(
                "this tfshards.read() dataset was garbage-collected while its pipeline still "
                "ran; keep a reference to the dataset (or its iterator) while reading"
            )
        return reached(alive)(*args)

    call.__name__ = call.__qualname__ = method.replace(".", "_")
    return guarded(call)


def _kept_by(dataset: tf.data.Dataset, reader: OrderedReader) -> None:
    """The dataset holds its reader. A dataset built inside a ``tf.function`` is dropped
    after tracing while its graph lives on: its reader is kept for the program's life,
    as TensorFlow keeps the bodies themselves."""
    dataset._tfshards_reader = reader  # also found by ResumeCallback (resume_callback.py)
    if not tf.executing_eagerly():
        _READERS_OF_GRAPHS.append(reader)


_READERS_OF_GRAPHS: list[OrderedReader] = []


def ordered_batches(reader: OrderedReader, decode, *, repeat: bool, place=None) -> tf.data.Dataset:
    """(image, mask) batches from the cursor's start on, one read per batch: records of
    many sizes decoded and placed by ``decode(records, boxes)``, others decoded whole,
    then cropped or padded by ``place(images, masks, boxes)`` when given."""
    per_iteration = reader.schedule.batches_per_epoch
    begin, prefetch = _body(reader, "cursor.begin"), _body(reader, "prefetch")

    def iteration(_) -> tf.data.Dataset:  # one py_function per iteration, not per batch
        first = tf.ensure_shape(tf.py_function(begin, [], tf.int64), [])
        if repeat:
            return tf.data.Dataset.counter(first)
        return tf.data.Dataset.range(first, first + per_iteration)

    steps = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).flat_map(iteration)
    known = tf.data.INFINITE_CARDINALITY if repeat else per_iteration  # for Keras: flat_map
    steps = steps.apply(tf.data.experimental.assert_cardinality(known))  # hides it
    if reader.downloads_ahead:  # shards downloaded (or inflated) a few batches ahead

        def ahead(step: tf.Tensor) -> tf.Tensor:
            return tf.ensure_shape(tf.py_function(prefetch, [step], tf.int64), [])

        steps = steps.map(ahead, num_parallel_calls=reader.downloads_ahead, deterministic=True)

    load = _loader(reader, decode, place)
    relabel = relabeller(reader.labels)  # label maps: after the cache, which keeps masks as stored

    def relabelled(step: tf.Tensor):
        step, image, mask, indices = load(step)
        return step, image, relabel(indices, mask)

    return steps.map(relabelled, num_parallel_calls=AUTOTUNE, deterministic=True)


def _loader(reader: OrderedReader, decode, place):
    """The map function of ``ordered_batches``: step -> (step, image, mask, indices)."""
    fetch, keep = _body(reader, "fetch"), _body(reader, "keep")
    # Closures below hold plain values, not the reader (see _body).
    shape, tf_decodes = reader.shape, reader.pixels is None
    keeps_decoded = tf_decodes and reader.store is not None  # else the store is kept by fetch
    keeps_native = shape[0] is None and reader.store is not None
    cuts = reader.cuts
    delivered = reader.delivered_shape
    sized = reader.sizing is not None and reader.sizing.active
    ready = reader.store is not None and reader.store.ready  # a disk cache built before

    def load(step: tf.Tensor):
        indices, records, decoded, images, masks, boxes = tf.py_function(
            fetch, [step], [tf.int64, tf.string, tf.bool, tf.uint8, tf.int32, tf.int32]
        )
        boxes = tf.ensure_shape(boxes, [None, 6])
        records = tf.ensure_shape(records, [None])
        image = tf.ensure_shape(images, [None, *delivered])
        mask = tf.ensure_shape(masks, [None, *delivered[:2], 1])

        def from_pixels(boxes=boxes):  # decoded by fetch: cut there, or to cut here
            if cuts or place is None:
                return image, mask
            return place(image, mask, boxes)

        if shape[0] is None and ready:  # a ready cache: every batch comes decoded
            return step, *from_pixels(), indices
        if shape[0] is None and sized:  # records of many sizes, cropped or padded
            # Either the pixels or the records are empty: both ways run, one on nothing
            # (a tf.cond here took 8 ms per batch of 16 crops from a memory cache, this
            # 6 ms: TensorFlow's control flow in a tf.data function, not the pixels).
            count = tf.shape(image)[0]
            image, mask = from_pixels(boxes[:count])
            more = decode(records, boxes[count:], indices[count:], keep if keeps_native else None)
            return step, tf.concat([image, more[0]], 0), tf.concat([mask, more[1]], 0), indices
        if shape[0] is None:  # a batch of one record of its own size, decoded or read
            image, mask = tf.cond(
                tf.ensure_shape(decoded, []),
                lambda: from_pixels(boxes),
                lambda: decode(records, boxes, indices, keep if keeps_native else None),
            )
            return step, image, mask, indices

        def decoded_by_tensorflow():  # PNG/JPEG or records to resize
            image, mask = decode(records)
            if keeps_decoded:  # the store keeps uint8 masks: before the cast
                kept = tf.py_function(keep, [indices, image, mask], tf.bool)
                with tf.control_dependencies([kept]):
                    image, mask = tf.identity(image), tf.identity(mask)
            mask = tf.cast(mask, tf.int32)  # as fetch delivers them
            return (image, mask) if place is None else place(image, mask, boxes)

        if not tf_decodes:
            return step, *from_pixels(), indices
        image, mask = tf.cond(
            tf.ensure_shape(decoded, []), lambda: from_pixels(), decoded_by_tensorflow
        )
        return step, image, mask, indices

    return load


def ordered_dataset(plan, start, store: PairStore | None) -> tf.data.Dataset:
    """The whole ordered pipeline of a plan (``plan.ordered``), from ``start``: None (the
    beginning), ``(epoch, batch)`` or a ``ReadState``."""
    reader = ordered_reader(plan, start, store)
    sizing, fill = plan.sizing, fill_label(plan.shards)
    place = functools.partial(placed_batch, sizing=sizing, fill_label=fill)
    if plan.shape[0] is None:
        decode = sized_decoder(plan.decoder, sizing, fill)
    else:
        decode = batch_decoder(plan.decoder)
        place = place if sizing.active else None
    batches = ordered_batches(reader, decode, repeat=plan.repeat, place=place)
    finishing = plan.finishing
    finish = finishing.finish
    if finishing.per_pair_augment:  # a function of one pair: mapped over the batch
        finish = _per_pair(finish, plan.batch_shape)
    index, count = plan.pipeline

    def finished(step, image, mask):
        image, mask = finish(image, mask)
        if finishing.layer is not None:
            # The layer's draws are seeded by the batch's place among all pipelines'
            # batches (step s of pipeline p is batch p of round s), so pipelines draw
            # apart and each (seed, epoch, batch, pipeline) draws the same every time.
            image, mask = finishing.layer(image, mask, step * count + index)
        return image, mask

    # Sequential when a layer draws random numbers: its draws are seeded per batch, and a
    # layer's seed generator is one variable shared by every call.
    if finishing.layer is not None:
        batches = batches.map(finished)
    else:
        batches = batches.map(finished, num_parallel_calls=AUTOTUNE, deterministic=True)
    dataset = batches.prefetch(AUTOTUNE)
    _kept_by(dataset, reader)
    return dataset


def ordered_reader(plan, start, store: PairStore | None) -> OrderedReader:
    from tfshards.readers.resume import read_identity, start_step

    shards = plan.shards
    order = EpochOrder(
        tuple(shard.records for shard in shards.shards),
        plan.order.shuffle,
        plan.order_seed,
        plan.group_shards,
    )
    if plan.mix is not None:  # several datasets (mixing.py)
        order = plan.mix.order(plan.order.shuffle, plan.order_seed)
    elif plan.selection is not None:
        order = SampledOrder(order, plan.selection)
    index, count = plan.pipeline
    schedule = BatchSchedule(
        order.size, plan.batching.size, count, index, plan.batching.drop_remainder
    )
    per_iteration = None if plan.repeat else schedule.batches_per_epoch
    identity = read_identity(plan, schedule)
    step = start_step(start, identity, schedule)
    local = plan.records.downloads is None and not plan.records.kind.compressed
    if store is not None and not store.ready and plan.cache.kind == "disk":
        plan.records.read_through_page_cache()  # a disk cache to build: see there
    decoder = plan.decoder
    # Raw/deflate records of the size read (no resizing): decoded in the fetch call.
    resized = decoder.stored != decoder.shape
    pixels = (
        None if resized or plan.shape[0] is None else batches_of(shards.manifest, decoder.where)
    )
    return OrderedReader(
        order,
        schedule,
        plan.records,
        store,
        Cursor(step, per_iteration),
        plan.shape,
        identity,
        # Rows of the largest batch: a batch_size beyond the split allocates no more.
        delivered_masks(plan, min(schedule.batch_size, order.size)),
        0 if local else plan.options.download_ahead,
        pixels,
        plan.sizing,
        plan.order_seed,
        fill_label(shards),
        None if plan.mix is not None else store_rows(plan.selection),  # a mix: by source
        plan.labels,
    )


def store_rows(selection) -> np.ndarray | None:
    """A sampled read's store row of each record (-1: never drawn), or None (by index)."""
    if selection is None or (selection.uniform and selection.subset is None):
        return None
    drawable = np.flatnonzero(selection.expected() > 0)
    rows = np.full(selection.records, -1, np.int64)
    rows[drawable] = np.arange(len(drawable))
    return rows


def delivered_masks(plan, batch_size: int) -> RecycledArrays:
    """Recycled arrays for the int32 masks fetch delivers. float32 images are not made
    here: TensorFlow's conversion in the finishing map (``to_float_image``) took less
    CPU per pair, and at 512x512 in a 2 GiB cgroup streamed 1.05-1.42x faster, than
    one NumPy multiply per batch into recycled arrays (benchmarks/README.md, issue 44;
    the same multiply split over two threads was slower still)."""
    height, width, _ = plan.shape
    sizing = plan.sizing
    if sizing.active and sizing.crop_scale is None:  # cut by fetch (OrderedReader.cuts)
        height, width = sizing.size
    if height is None:  # records of many sizes, not cut by fetch: no recycled masks
        height = width = 0
    return RecycledArrays((batch_size, height, width, 1), np.int32)


def batch_decoder(decoder):
    """[B] serialized records (PNG/JPEG, or to resize) -> uint8 [B, H, W, C] and
    [B, H, W, 1] of the plan's shape, one record at a time."""
    height, width, channels = decoder.shape
    signature = (
        tf.TensorSpec((height, width, channels), tf.uint8),
        tf.TensorSpec((height, width, 1), tf.uint8),
    )

    def decode(records: tf.Tensor):
        features = decoder.parse_sized(records)
        return tf.map_fn(decoder.decode_one, features, fn_output_signature=signature)

    return decode


def sized_decoder(decoder, sizing: Sizing, fill: int):
    """``decode(records, boxes, indices, keep)``: [B] serialized records of many sizes ->
    uint8 images and int32 masks of the batch's shape, each record decoded at its own
    size, handed to ``keep`` (a py_function body, or None) and cut as its box says."""
    channels = decoder.shape[2]
    height, width = sizing.size or (None, None)
    signature = (
        tf.TensorSpec((height, width, channels), tf.uint8),
        tf.TensorSpec((height, width, 1), tf.int32),
    )

    def one(features, box, index, keep):
        image, mask = decoder.decode_one(features)
        if keep is not None:  # the store keeps each pair at its own size, uint8
            kept = tf.py_function(keep, [index, image, mask], tf.bool)
            with tf.control_dependencies([kept]):
                image, mask = tf.identity(image), tf.identity(mask)
        return placed(image, tf.cast(mask, tf.int32), box, sizing, fill)

    def decode(records: tf.Tensor, boxes: tf.Tensor, indices: tf.Tensor, keep):
        features = decoder.parse_sized(records)
        if not sizing.active:  # a batch of one, at the record's own size
            first = {name: value[0] for name, value in features.items()}
            image, mask = one(first, boxes[0], indices[0], keep)
            return image[None], mask[None]
        return tf.map_fn(
            lambda arguments: one(*arguments, keep),
            (features, boxes, indices),
            fn_output_signature=signature,
        )

    return decode


def _per_pair(finish, shape):
    """A function of one pair, over a batch (its output types found by tracing it once)."""
    height, width, channels = shape
    traced = tf.function(finish).get_concrete_function(
        tf.TensorSpec((height, width, channels), tf.uint8),
        tf.TensorSpec((height, width, 1), tf.uint8),
    )
    signature = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype), traced.structured_outputs
    )

    def per_pair(images, masks):
        return tf.map_fn(lambda pair: finish(*pair), (images, masks), fn_output_signature=signature)

    return per_pair
