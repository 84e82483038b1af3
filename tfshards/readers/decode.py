"""Decoding records with TensorFlow into uint8 (image, mask) pairs, and finishing them.

The ordered reader decodes raw and deflate records of the size it reads in Python, a
batch at a time (``sources/pixel_batches.py``); these decoders serve the rest: PNG/JPEG
and records to resize, records of many sizes (each decoded at its own size, then cut),
and the tf.data service's per-pair path. They come from the format registry
(``schemas/format.py``): raw and deflate records of one size are decoded a whole batch
at a time, PNG/JPEG one record at a time, in parallel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from tfshards.errors import OptionsError
from tfshards.readers.shards import SplitShards
from tfshards.readers.sizing import DEFAULT_PAD_LABEL
from tfshards.schemas.format import MAX_CHANNELS, Encoding, image_encoding, mask_encoding
from tfshards.schemas.record import tf_feature_spec

AUTOTUNE = tf.data.AUTOTUNE
Augment = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
_PIXELS = ("image/encoded", "mask/encoded")
# What each record says of itself, checked against the manifest on the way.
_OWN = ("key", "image/height", "image/width", "image/channels", "mask/channels")


@dataclass(frozen=True)
class PairDecoder:
    """Serialized records -> uint8 (image, mask) of ``shape``, following the manifest.

    Every record's own height, width and channels are checked against the manifest
    (and its pixels' byte count against them) before it is decoded, so a manifest that
    disagrees with its records stops the read at the first such record, naming it;
    with ``records`` set, so does a record count other than the manifest's.
    """

    shape: tuple[int | None, int | None, int]  # (None, None, C): each record's own size
    stored: tuple[int, int, int] | None
    image: Encoding
    mask: Encoding
    where: str = "this dataset"  # the dataset and split, for messages
    records: int | None = None  # the records a pass must hold; None: not counted
    channels: int | None = None  # the manifest's image channels (default: shape's)
    itemsize: int = 1  # bytes per image sample: shape's channels are channels x itemsize

    def __post_init__(self) -> None:
        if self.records is not None and self.records < 0:
            raise ValueError(f"records must be None or at least 0, got {self.records}")
        if self.channels is not None and not 1 <= self.channels <= MAX_CHANNELS:
            raise ValueError(f"channels must be 1..{MAX_CHANNELS}, got {self.channels}")

    @property
    def image_channels(self) -> int:
        """The images' channels (the shape's last axis counts bytes: channels x itemsize)."""
        return self.channels or self.shape[2] // self.itemsize

    @property
    def whole_batches(self) -> bool:
        """True when a batch of records decodes with one op per field, no per-record work."""
        return self.image.batchable and self.mask.batchable and self.stored == self.shape

    def decode_batch(self, serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """[B] serialized records of ``shape`` -> uint8 [B, H, W, C] and [B, H, W, 1]."""
        features = self.checked(tf.io.parse_example(serialized, _spec(_PIXELS + _OWN)))
        height, width = self.shape[:2]
        encoded, channels = features["image/encoded"], self.image_channels
        image = self.image.tf_decode(encoded, height, width, channels, self.itemsize)
        mask = self.mask.tf_decode(features["mask/encoded"], height, width, 1)
        return image, mask

    def parse_sized(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        """[B] serialized records -> their pixel fields and sizes, for ``decode_one``."""
        return tf.io.parse_example(serialized, _spec(_PIXELS + _OWN))

    def decode_one(self, features: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        """One parsed record -> uint8 pair, resized to ``shape`` when it differs."""
        features = self.checked(features)
        height, width = self.shape[:2]
        h, w = features["image/height"], features["image/width"]
        encoded, channels = features["image/encoded"], self.image_channels
        image = self.image.tf_decode(encoded, h, w, channels, self.itemsize)
        mask = self.mask.tf_decode(features["mask/encoded"], h, w, 1)
        image, mask = self._sized_as_recorded(features, image, mask)
        resize = height is not None and (self.stored is None or self.stored[:2] != (height, width))
        if resize:  # else each record keeps its own size (height and width are None)
            image = tf.image.resize(image, (height, width), method="bilinear", antialias=True)
            image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
            mask = tf.image.resize(mask, (height, width), method="nearest")
        return tf.ensure_shape(image, self.shape), tf.ensure_shape(mask, (height, width, 1))

    def checked(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The features (one record or a batch), once their sizes agree with the manifest."""
        channels = self.image_channels
        agree = [
            tf.equal(features["image/channels"], channels),
            tf.equal(features["mask/channels"], 1),
        ]
        if self.stored is not None:
            agree += [
                tf.equal(features["image/height"], self.stored[0]),
                tf.equal(features["image/width"], self.stored[1]),
            ]
        good = tf.reduce_all(tf.stack(agree), axis=0)
        first = tf.reshape(tf.where(tf.logical_not(tf.reshape(good, [-1]))), [-1])[:1]

        def of_first(name: str) -> tf.Tensor:  # the first bad record's value of a feature
            return tf.gather(tf.reshape(features[name], [-1]), first)

        stored = "x".join(str(n) for n in self.stored[:2]) if self.stored else "any size"
        message = _text(
            f"{self.where}: record ", of_first("key"), " disagrees with the manifest: it "
            "holds ", of_first("image/height"), "x", of_first("image/width"), "x",
            of_first("image/channels"), f" (HxWxC) pixels, the manifest says {stored} with "
            f"{channels} channels and masks 1 (this record: mask channels ",
            of_first("mask/channels"), "); the manifest was edited or belongs to other "
            "shards: convert again, and run `tfshards verify` on the dataset",
        )  # fmt: skip
        check = tf.debugging.Assert(tf.reduce_all(good), [message])
        with tf.control_dependencies([check]):
            return {name: tf.identity(value) for name, value in features.items()}

    def _sized_as_recorded(self, features, image: tf.Tensor, mask: tf.Tensor):
        """PNG/JPEG pixels of the height and width their record says, or an error."""
        recorded = tf.stack([features["image/height"], features["image/width"]])
        agree = tf.logical_and(
            tf.reduce_all(tf.equal(tf.shape(image, tf.int64)[:2], recorded)),
            tf.reduce_all(tf.equal(tf.shape(mask, tf.int64)[:2], recorded)),
        )
        image_size, mask_size = tf.shape(image)[:2], tf.shape(mask)[:2]
        message = _text(
            f"{self.where}: record ", features["key"], " says ", recorded[0], "x", recorded[1],
            " (HxW) but its pixels decode to image ", image_size[0], "x", image_size[1],
            " and mask ", mask_size[0], "x", mask_size[1],
        )  # fmt: skip
        check = tf.debugging.Assert(agree, [message])
        with tf.control_dependencies([check]):
            return tf.identity(image), tf.identity(mask)


def _text(*parts: str | tf.Tensor) -> tf.Tensor:
    """One string from text and tensors (numbers, strings, one-element vectors), for the
    messages of checks that run inside the pipeline."""
    strings = []
    for part in parts:
        if isinstance(part, str):
            strings.append(part)
            continue
        if part.dtype != tf.string:
            part = tf.strings.as_string(part)
        strings.append(tf.strings.reduce_join(tf.reshape(part, [-1]), separator=","))
    return tf.strings.join(strings)


def pair_decoder(
    shards: SplitShards, shape: tuple[int, int, int], *, counted: bool = True
) -> PairDecoder:
    """The decoder of a split's records; ``counted``: check each pass holds the manifest's
    record count (not where a pass sees a part of them, as on tf.data service workers)."""
    manifest = shards.manifest
    return PairDecoder(
        shape,
        manifest.byte_shape,
        image_encoding(manifest.image.encoding),
        mask_encoding(manifest.mask.encoding),
        # No quotes: TensorFlow escapes them in the messages of checks.
        where=f"{shards.root} (split {shards.split})",
        records=shards.records if counted else None,
        channels=manifest.image.channels,
        itemsize=manifest.image.itemsize,
    )


def counted_batches(
    batches: tf.data.Dataset, decoder: PairDecoder, *, batch_size: int, drop_remainder: bool
) -> tf.data.Dataset:
    """Batches of serialized records of one pass, stopped with an error at the first batch
    past the manifest's record count, or at the end of a pass that holds fewer.

    Counted per batch, not per record: a scan step costs tens of microseconds of CPU.
    """
    if decoder.records is None:
        return batches
    # Records a pass delivers: a dropped remainder never reaches the count.
    expected = decoder.records - (decoder.records % batch_size if drop_remainder else 0)
    where = decoder.where
    full = f" in full batches of {batch_size}" if drop_remainder else ""

    def count(seen: tf.Tensor, batch: tf.Tensor):
        end = tf.equal(tf.size(batch), 0)  # the marker below; a real batch is never empty
        total = seen + tf.size(batch, tf.int64)
        fine = tf.where(end, tf.equal(seen, expected), tf.less_equal(total, expected))
        message = _text(
            where, tf.where(end, ": the shards hold ", ": the shards hold more than "),
            tf.where(end, seen, expected), f" records{full} where its manifest lists "
            f"{decoder.records}; a shard was replaced or the manifest edited: convert "
            "again, and run `tfshards verify` on the dataset",
        )  # fmt: skip
        check = tf.debugging.Assert(fine, [message])
        with tf.control_dependencies([check]):
            return total, tf.identity(batch)

    marker = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))
    counted = batches.concatenate(marker).scan(tf.constant(0, tf.int64), count)
    counted = counted.filter(lambda batch: tf.size(batch) > 0)
    if drop_remainder:  # the marker relaxed the static batch size; tell it again
        counted = counted.map(lambda batch: tf.ensure_shape(batch, [batch_size]))
    return counted


def decoded_batches(
    records: tf.data.Dataset,
    decoder: PairDecoder,
    *,
    batch_size: int,
    drop_remainder: bool,
) -> tf.data.Dataset:
    """Serialized records (whole_batches only) -> uint8 batches, one decode op per batch,
    in order (the short batch last, whatever the thread timing)."""
    # A parallel batch: gathering 32 records of ~200 KB out of the shuffle buffer is a
    # copy from memory far larger than the CPU caches, the single-threaded stage otherwise.
    batches = records.batch(
        batch_size,
        drop_remainder=drop_remainder,
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
    batches = counted_batches(
        batches, decoder, batch_size=batch_size, drop_remainder=drop_remainder
    )
    return batches.map(decoder.decode_batch, num_parallel_calls=AUTOTUNE, deterministic=True)


def decoded_pairs(
    records: tf.data.Dataset,
    decoder: PairDecoder,
    parse_batch_size: int,
    *,
    deterministic: bool,
) -> tf.data.Dataset:
    """Serialized records -> uint8 pairs, in record order when ``deterministic``."""
    if decoder.whole_batches:
        return decoded_batches(
            records,
            decoder,
            batch_size=parse_batch_size,
            drop_remainder=False,
        ).unbatch()

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        return tf.io.parse_example(serialized, _spec(_PIXELS + _OWN))

    batches = counted_batches(
        records.batch(parse_batch_size), decoder, batch_size=parse_batch_size, drop_remainder=False
    )
    parsed = batches.map(parse, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    return parsed.unbatch().map(
        decoder.decode_one, num_parallel_calls=AUTOTUNE, deterministic=deterministic
    )


def _spec(names: tuple[str, ...]) -> dict:
    spec = tf_feature_spec()
    return {name: spec[name] for name in names}


def finisher(
    shards: SplitShards,
    image_dtype: str,
    augment: Augment | None,
    one_hot: bool,
    normalize: bool = False,
) -> Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """uint8 pairs (one or a batch; uint16 images as their bytes) -> output dtypes, with
    augment and one-hot."""
    encode = one_hot_encoder(shards) if one_hot else None
    output = image_output(shards, image_dtype, normalize)

    def finish(image: tf.Tensor, mask: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        if image.dtype == tf.uint8:
            image = output(image)
        mask = tf.cast(mask, tf.int32)
        if augment is not None:
            image, mask = augment(image, mask)
        return image, mask if encode is None else encode(mask)

    return finish


def one_hot_encoder(shards: SplitShards) -> Callable[[tf.Tensor], tf.Tensor]:
    """int32 masks [..., 1] -> float32 one-hot [..., K]; ignored pixels are all-zero."""
    classes = _num_classes(shards)
    ignore = shards.manifest.mask.ignore_label

    def encode(mask: tf.Tensor) -> tf.Tensor:
        labels = mask[..., 0]
        vectors = tf.one_hot(labels, classes, dtype=tf.float32)  # zero above the depth
        if ignore is not None and ignore < classes:
            vectors *= tf.cast(labels != ignore, tf.float32)[..., None]
        return vectors

    return encode


def is_keras_layer(augment) -> bool:
    """A Keras 3 layer (or Sequential of them): applied to whole batches, image and mask."""
    if augment is None:
        return False
    import keras  # already loaded with TensorFlow's reader

    return isinstance(augment, keras.layers.Layer)


def layer_augmenter(
    layer, shards: SplitShards, one_hot: bool, image_dtype: str = "float32", seed: int | None = None
):
    """Finished batches -> the same through a Keras augmentation layer, then one-hot.

    Keras 3 augmentation layers transform ``segmentation_masks`` with the images
    (flips, rotations, zooms, crops; masks with nearest-neighbour interpolation)
    and leave masks alone for photometric changes. Pixels a layer fills
    (``fill_mode="constant"``) become the ignore label (:func:`fill_label`), not the
    layer's ``fill_value``. Layers compute in floats: with ``image_dtype="uint8"``
    their images are rounded, clipped to 0..255 and cast back, so the dtype asked for
    is the dtype delivered. A ``keras.Sequential`` runs as a ``keras.layers.Pipeline``
    of its layers, which stays in tf.data on every backend.
    """
    encode = one_hot_encoder(shards) if one_hot else None
    layer = as_pipeline(layer)
    if image_dtype == "uint16" and shards.manifest.image.dtype == "uint16":
        _check_value_ranges(layer)
    offset, label = fill_offset(layer), fill_label(shards, layer)

    def augment(
        image: tf.Tensor, mask: tf.Tensor, step: tf.Tensor | None = None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """``step`` (the batch's place among all input pipelines' batches) reseeds the
        layer's generators first, so a batch's random draws depend on its position, not
        on how many came before."""
        if step is not None:
            with tf.control_dependencies(reseeded(layer, step, seed)):
                image, mask = tf.identity(image), tf.identity(mask)
        # Masks enter shifted by ``offset``: a moved pixel stays >= offset, a filled one
        # holds the fill value, below it (exact: masks move by nearest neighbour). About
        # 3% more CPU for flip + rotation + zoom at 256x256, where a second mask channel
        # marking moved pixels cost 13-17% (measured side by side, 2026-12-07).
        out = layer({"images": image, "segmentation_masks": mask + offset}, training=True)
        image, mask = out["images"], unshifted(out["segmentation_masks"], offset, label)
        if image_dtype in ("uint8", "uint16") and image.dtype != tf.as_dtype(image_dtype):
            top = tf.as_dtype(image_dtype).max
            image = tf.cast(tf.clip_by_value(tf.round(image), 0, top), image_dtype)
        return image, mask if encode is None else encode(mask)

    return augment


def _check_value_ranges(layer) -> None:
    """OptionsError for a layer whose ``value_range`` (Keras' photometric layers: 0..255
    unless told) stops below 65535: it would clip uint16 pixels to it, silently."""
    for inner in getattr(layer, "layers", None) or ():  # a Pipeline's layers
        _check_value_ranges(inner)
    value_range = getattr(layer, "value_range", None)
    if value_range is not None and float(value_range[1]) < 65535:
        raise OptionsError(
            f"augment: {type(layer).__name__} has value_range={tuple(value_range)} but "
            "image_dtype='uint16' images hold 0..65535, which it would clip to that range; "
            "pass value_range=(0, 65535) to the layer"
        )


def unshifted(moved: tf.Tensor, offset: int, label: int) -> tf.Tensor:
    """Masks shifted by ``offset`` through a layer -> int32 classes, ``label`` where the
    layer filled (below ``offset``; compared before rounding, for fractional fills)."""
    filled = moved < tf.cast(offset, moved.dtype)
    classes = tf.cast(tf.round(moved) if moved.dtype.is_floating else moved, tf.int32)
    return tf.where(filled, tf.constant(label, tf.int32), classes - offset)


# Masks shifted past this could lose exactness in a layer computing in float16
# (integers exact to 2048), with classes up to 255 on top.
_LARGEST_OFFSET = 2048 - 256


def fill_offset(layer) -> int:
    """1 + the largest constant any layer inside ``layer`` fills with (its ``fill_value``;
    at least 0, Keras's default), rounded down: masks shifted by it stay above every fill.
    Float fills cast to int32 masks truncate toward 0, which stays below it too."""
    fills = [0.0]
    for inner in layer._flatten_layers(include_self=True):
        value = getattr(inner, "fill_value", None)
        if isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value):
            fills.append(float(value))
    offset = int(np.floor(max(fills))) + 1
    if offset > _LARGEST_OFFSET:
        raise OptionsError(
            f"augment={type(layer).__name__} fills with fill_value={max(fills)}; tfshards "
            f"tells filled mask pixels from classes by fill values below {_LARGEST_OFFSET}"
        )
    return offset


def fill_label(shards: SplitShards, layer=None) -> int:
    """The mask value of pixels no record holds (filled by a layer, padded by pad_to or a
    crop): the dataset's ignore label, else DEFAULT_PAD_LABEL. With no ignore label and
    DEFAULT_PAD_LABEL a class, a ``layer`` that fills constants is refused."""
    ignore = shards.manifest.mask.ignore_label
    if ignore is not None:
        return ignore
    if layer is not None and _num_classes(shards) > DEFAULT_PAD_LABEL and _fills(layer):
        raise OptionsError(
            f"augment={type(layer).__name__} fills pixels with a constant and "
            f"{shards.root} declares no ignore label, while {DEFAULT_PAD_LABEL} is one of "
            "its classes: convert with --ignore-label, or use fill_mode='reflect'"
        )
    return DEFAULT_PAD_LABEL


def _fills(layer) -> bool:
    """Whether a layer inside ``layer`` fills pixels with a constant."""
    return any(
        getattr(inner, "fill_mode", None) == "constant"
        or getattr(inner, "pad_to_aspect_ratio", False)
        for inner in layer._flatten_layers(include_self=True)
    )


def reseeded(layer, step: tf.Tensor, seed: int | None) -> list[tf.Tensor]:
    """Set every seed generator of ``layer`` (and of the layers inside it) to
    ``[base + n, step]``, inside tf.data: ``base`` is the generator's own seed (the
    layer's ``seed=``), else read()'s ``seed``, else a number drawn once per process;
    ``n`` numbers the generators so that no two draw alike. On a non-TensorFlow backend
    Keras draws in tf.data from a TensorFlow twin of each generator
    (``_get_seed_generator("tensorflow")``); that one is set. Returns the assignments."""
    import keras

    native = keras.backend.backend() == "tensorflow"
    assignments = []
    for number, (owner, generator) in enumerate(_generators(layer, native)):
        base = generator._initial_seed
        if base is None:
            base = getattr(owner, "seed", None) if seed is None else seed
        if base is None:
            base = _process_seed()
        offset = (int(base) + 7919 * number) % 2**63  # seeds up to 2**63 - 1 stay in int64
        key = tf.stack([tf.constant(offset, tf.int64), step])
        assignments.append(_assign(generator.state, tf.cast(key, generator.state.dtype)))
    return assignments


def _generators(layer, native: bool) -> list:
    """(layer, seed generator) pairs of a layer and the layers inside it."""
    found = []
    for inner in layer._flatten_layers(include_self=True):
        if not native and hasattr(inner, "_get_seed_generator") and hasattr(inner, "generator"):
            inner.backend.set_backend("tensorflow")
            try:
                found.append((inner, inner._get_seed_generator("tensorflow")))
            finally:
                inner.backend.reset()
            continue
        found += [(inner, generator) for generator in getattr(inner, "_seed_generators", [])]
    return found


@functools.cache
def _process_seed() -> int:
    """Layers and reads without a seed: random in each process, as Keras's own are."""
    return int(np.random.SeedSequence().entropy % 2**31)


def _assign(variable, value: tf.Tensor):
    """Assign to a Keras variable's TensorFlow variable (whatever the Keras backend)."""
    target = getattr(variable, "value", variable)
    if isinstance(target, tf.Variable):
        return target.assign(value)
    return variable.assign(value)


def as_pipeline(layer):
    """A Keras layer that runs inside tf.data on any backend.

    A ``keras.Sequential`` is a Model: on JAX or PyTorch it converts its symbolic tf.data
    inputs to that backend's arrays and fails ("Cannot convert a symbolic tf.Tensor").
    Its layers, run one after the other as a ``keras.layers.Pipeline``, do what it does
    and stay in tf.data. Other models are refused on those backends, naming the way out.
    """
    import keras

    if isinstance(layer, keras.Sequential):
        return keras.layers.Pipeline([as_pipeline(inner) for inner in _sequence_of(layer)])
    if isinstance(layer, keras.Model) and keras.backend.backend() != "tensorflow":
        raise OptionsError(
            f"augment={type(layer).__name__} (a keras.Model) cannot run inside tf.data on "
            f"the {keras.backend.backend()} backend; pass the augmentation layers as "
            "keras.layers.Pipeline([...]) (or keras.Sequential([...]))"
        )
    return layer


def _sequence_of(model) -> list:
    import keras

    return [inner for inner in model.layers if not isinstance(inner, keras.layers.InputLayer)]


def image_output(
    shards: SplitShards, image_dtype: str, normalize: bool = False
) -> Callable[[tf.Tensor], tf.Tensor]:
    """Image bytes [..., H, W, C x itemsize] -> what read() delivers: the stored samples
    as ``image_dtype`` (uint8 -> uint16 widens; uint16 -> uint8 is refused by the plan),
    float32 as value / 255 (uint8) or value / 65535 (uint16), or with ``normalize``
    float32 (value - mean) / std per channel, from the manifest's statistics
    (:func:`normalizing_stats`)."""
    image_info = shards.manifest.image
    channels, stored = image_info.channels, image_info.dtype
    stats = normalizing_stats(shards) if normalize else None

    def output(image: tf.Tensor) -> tf.Tensor:
        if stored == "uint16":  # little-endian byte pairs -> samples
            lead = tf.shape(image)[:-1]
            pairs = tf.reshape(image, tf.concat([lead, [channels, 2]], 0))
            image = tf.bitcast(pairs, tf.uint16)
        if stats is not None:
            mean, std = stats
            return (tf.cast(image, tf.float32) - mean) / std
        if image_dtype == "float32":
            if stored == "uint8":
                return to_float_image(image)
            return tf.cast(image, tf.float32) * tf.constant(1 / 65535, tf.float32)
        return tf.cast(image, image_dtype)

    return output


def normalizing_stats(shards: SplitShards) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) float32 per channel for ``normalize``: the train split's statistics
    for every split (val and test are transformed as the model was trained), else the
    read split's; a channel whose std is 0 is divided by 1."""
    splits = shards.manifest.splits
    split = splits.get("train") or splits[shards.split]
    if split.image_stats is None:
        raise OptionsError(
            f"normalize=True needs the per-channel statistics in {shards.root}'s manifest, "
            "which this dataset's conversion did not count (an older tfshards): convert again"
        )
    mean = np.asarray(split.image_stats.mean, np.float32)
    std = np.asarray(split.image_stats.std, np.float32)
    return mean, np.where(std > 0, std, np.float32(1))


def to_float_image(image: tf.Tensor) -> tf.Tensor:
    """uint8 -> float32 in [0, 1], value / 255, in one pass over the pixels.

    Dequantize's MIN_COMBINED mode over [0, 1] computes value * (1 / 255): the same
    floats, bit for bit, as a cast then a multiply (tested), without the intermediate
    float tensor those two ops write and read again (0.39 against 0.63 ms of CPU per
    512x512 RGB image here)."""
    return tf.raw_ops.Dequantize(
        input=tf.bitcast(image, tf.quint8),
        min_range=0.0,
        max_range=1.0,
        mode="MIN_COMBINED",
        dtype=tf.float32,
    )


def _num_classes(shards: SplitShards) -> int:
    manifest = shards.manifest
    if manifest.mask.num_classes:
        return manifest.mask.num_classes
    return max(len(split.class_pixels) for split in manifest.splits.values())
