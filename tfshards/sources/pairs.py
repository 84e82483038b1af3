"""``tfshards.Pairs``: a split's pairs by index as NumPy arrays, without TensorFlow.

One object serves PyTorch's ``DataLoader`` (a map-style dataset: ``len`` and ``[i]``,
with ``__getitems__`` for whole batches) and Grain's ``MapDataset.source`` (a random-
access source, with ``_getitems``). Pair ``i`` is record ``i`` of the split in the
manifest's order: one ``pread`` at its offset (``records.py``), both CRCs checked,
then the pure-Python record decoder that ``verify`` uses.

Values are those of ``tfshards.read(path, image_dtype="uint8", shuffle=False)`` for the
same record: the image ``uint8 [H, W, C]`` (``uint16`` for a dataset of uint16 images:
the manifest's ``image.dtype``, as ``read(image_dtype="uint16")``), the mask's class
indices ``[H, W, 1]`` (``uint8`` here, ``int32`` in ``read``: the same numbers in a
quarter of the bytes).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tfshards import storage
from tfshards.arguments import checked_bool, checked_callable, checked_path, checked_str
from tfshards.errors import OptionsError
from tfshards.malloc_arenas import keep_freed_batches
from tfshards.readers.options import ReadOptions, read_options
from tfshards.readers.shards import split_shards
from tfshards.schemas.format import stored_dtype
from tfshards.schemas.record import decode_record
from tfshards.schemas.tfrecord import parse_example
from tfshards.sources.pixel_batches import PairDecodeError, batches_of
from tfshards.sources.records import SplitRecords

Pair = tuple[np.ndarray, np.ndarray]
Transform = Callable[[np.ndarray, np.ndarray], tuple[Any, Any]]


class Pairs:
    """The pairs of one split of a tfshards dataset, by index.

    >>> pairs = tfshards.Pairs("shards", split="train")  # doctest: +SKIP
    >>> image, mask = pairs[0]          # uint8 [H, W, C], uint8 [H, W, 1]
    >>> pairs.key(0)                    # the pair's key, e.g. "images/003"

    ``transform(image, mask) -> (image, mask)`` runs on every pair, e.g.
    :func:`tfshards.torch_pair` for CHW float tensors; ``with_keys=True`` returns
    ``(image, mask, key)`` triples instead of pairs.
    ``label_map``: masks read in other classes, as ``read(label_map=...)`` takes it.
    Several datasets: ``Pairs({name: path or Source}, weights=..., epoch_size=...,
    seed=...)`` (sources/mixed_pairs.py), whose ``epoch(e)`` is ``read``'s epoch ``e``.
    ``records``: only these records of the split, as ``read(records=...)`` takes them
    (keys, a boolean mask or indices); pair ``i`` is then the ``i``-th of them in the
    manifest's order.
    ``options``: a ``ReadOptions`` whose shard cache settings (``storage_options``,
    ``shard_cache``, ``shard_cache_limit``) apply to a dataset at a URL; its tf.data
    knobs do not apply here. gzip/zlib shards are inflated once into the user cache
    folder on first use (``tfshards/sources/inflated.py`` states the cost).

    Safe to pickle and to fork: each process opens its own files (a ``DataLoader``
    worker, a Grain worker process), and no file handle or lock crosses a fork, even
    one made while another thread reads (the child starts with fresh locks).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        split: str = "train",
        *,
        transform: Transform | None = None,
        with_keys: bool = False,
        options: ReadOptions | None = None,
        records: Sequence[str] | Sequence[int] | np.ndarray | None = None,
        label_map: Any = None,
    ) -> None:
        keep_freed_batches()  # see malloc_arenas.py
        checked_path("path", path)
        checked_str("split", split)
        checked_callable("transform", transform)
        checked_bool("with_keys", with_keys)
        options = read_options(options)
        shards = split_shards(path, split, storage_options=options.storage_options)
        self.records = SplitRecords.for_options(shards, options)
        self.transform = transform
        self.with_keys = with_keys
        self.manifest = shards.manifest
        self.split = split
        # Raw or deflate records of one size: a batch decoded into one array (fewer copies).
        where = f"{storage.display(shards.root)} (split {split})"
        self.batches = batches_of(shards.manifest, where)
        # records=: pair i is record selected[i] of the split (None: record i)
        self.selected = None if records is None else _selected(records, shards, options)
        self.labels = None  # label_map= (readers/labels.py): masks read in other classes
        if label_map is not None:
            from tfshards.readers.labels import label_map as resolved

            self.labels = resolved(label_map, shards.manifest, where=where)

    def __new__(cls, path: Any = None, *args: Any, **kwargs: Any) -> Pairs:
        if cls is Pairs and isinstance(path, Mapping):  # several datasets: mixed_pairs.py
            from tfshards.sources.mixed_pairs import MixedPairs

            return super().__new__(MixedPairs)
        return super().__new__(cls)

    def __len__(self) -> int:
        return len(self.records) if self.selected is None else len(self.selected)

    def record_index(self, index: int) -> int:
        """The split's record index (manifest order) of pair ``index``."""
        index = _index(index, len(self))
        return index if self.selected is None else int(self.selected[index])

    def __repr__(self) -> str:
        root = storage.display(self.records.shards.root)
        return f"Pairs({root!r}, split={self.split!r}): {len(self)} pairs"

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Many pairs at once, read shard by shard in offset order (PyTorch's batched
        fetch: a ``DataLoader`` with a batch sampler calls it once per batch)."""
        indices = [self.record_index(i) for i in indices]
        if self.batches is None:
            data = self.records.read(indices)
            decoded = [self._decoded(i, d) for i, d in zip(indices, data, strict=True)]
        else:
            images, masks, keys = self.batches.read(
                self.records,
                np.asarray(indices, np.int64),
                lambda k: f"{self.records.located(indices[k])} (pair {indices[k]})",
            )
            decoded = zip(self._samples(images), masks, keys, strict=True)
        return [self._finish(pair) for pair in decoded]

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        """Grain's name for a batched read."""
        return self.__getitems__(indices)

    def key(self, index: int) -> str:
        """The key of pair ``index`` (its relative path without extension)."""
        index = self.record_index(index)
        return self._decoded(index, self.records.read([index])[0])[2]

    def prefetch(self, indices: Sequence[int]) -> None:
        """Download (a dataset at a URL) or inflate (gzip/zlib) the shards of these pairs
        now, e.g. from a thread, so that reading them later waits for neither."""
        self.records.prefetch([self.record_index(i) for i in indices])

    def close(self) -> None:
        self.records.close()

    def _samples(self, images: np.ndarray) -> np.ndarray:
        """Decoded image bytes [B, H, W, C x itemsize] as the stored samples [B, H, W, C]."""
        if self.manifest.image.dtype == "uint8":
            return images
        samples = images.view(stored_dtype(self.manifest.image.dtype))
        return samples.astype(self.manifest.image.dtype, copy=False)  # native byte order

    def _decoded(self, index: int, data: bytes) -> tuple[np.ndarray, np.ndarray, str]:
        try:
            record = decode_record(_parsed(data), self.manifest.image.dtype)
        except ValueError as exc:  # RecordError too
            where = self.records.located(index)
            raise PairDecodeError(f"{where} (pair {index}): {exc}") from exc
        # Raw and deflate pixels are views of read-only bytes: copied, as a DataLoader
        # user may augment in place (and torch warns about read-only arrays).
        image = record.image if record.image.flags.writeable else record.image.copy()
        mask = record.mask if record.mask.flags.writeable else record.mask.copy()
        return image, mask[:, :, None], record.key

    def _finish(self, pair: tuple[np.ndarray, np.ndarray, str]) -> tuple:
        image, mask, key = pair
        if self.labels is not None:
            values = self.labels.values()
            mask = values.astype(np.uint8 if values.max() < 256 else np.int32)[mask]
        if self.transform is not None:
            image, mask = self.transform(image, mask)
        return (image, mask, key) if self.with_keys else (image, mask)


def _selected(records: Any, shards, options: ReadOptions) -> np.ndarray:
    """``records=`` as record indices; keys are looked up in the split's per-record table."""
    from tfshards.readers.selection import subset_indices
    from tfshards.sources.record_tables import split_table

    def positions(keys: list[str]) -> np.ndarray:
        table = split_table(shards, storage_options=options.storage_options)
        return table.keys.positions(keys)

    return subset_indices(records, shards.records, positions)


_TEXT_FIELDS = ("key", "image/format", "mask/format")


def _parsed(data: bytes) -> dict:
    """The record's features, the pixel bytes as views into ``data`` (parsing a large
    record by slicing copies its pixels once per nesting level: four times)."""
    features = parse_example(memoryview(data))
    for name in _TEXT_FIELDS:
        if isinstance(features.get(name), memoryview):
            features[name] = bytes(features[name])
    return features


def _index(index: int, length: int) -> int:
    """A Python or NumPy integer in range, negative ones counted from the end (a float, a
    string or a bool is refused, not rounded or parsed into another pair's index)."""
    try:
        if isinstance(index, bool | np.bool_):
            raise TypeError
        position = operator.index(index)  # what Python's sequences take as an index
    except TypeError:
        raise IndexTypeError(
            f"pair index {index!r} is not an integer: pair indices are integers (Python or "
            "NumPy), negative ones counted from the end"
        ) from None
    if position < 0:
        position += length
    if not 0 <= position < length:
        raise IndexError(f"pair index {index} out of range for {length} pairs")
    return position


class IndexTypeError(OptionsError, TypeError):
    """A pair index that is not an integer: an OptionsError, and the TypeError that Python
    sequences raise for it."""


def torch_pair(image: np.ndarray, mask: np.ndarray) -> tuple[Any, Any]:
    """``transform`` for PyTorch: image ``float32 [C, H, W]`` in [0, 1] (``value / 255``,
    or ``value / 65535`` for uint16 images: the floats of
    ``tfshards.read(image_dtype="float32")``, bit for bit), mask ``int64 [H, W]`` class
    indices (what ``torch.nn.CrossEntropyLoss`` takes as its target)."""
    import torch

    scale = np.float32(1 / np.iinfo(image.dtype).max)
    floats = np.multiply(image, scale, dtype=np.float32)
    chw = np.ascontiguousarray(floats.transpose(2, 0, 1))
    return torch.from_numpy(chw), torch.from_numpy(mask[:, :, 0].astype(np.int64))
