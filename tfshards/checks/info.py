"""What a model needs from a converted dataset: its class count and class weights.

    >>> tfshards.info("shards/").num_classes  # doctest: +SKIP
    3
    >>> model.fit(train, class_weight=tfshards.class_weights("shards/"))  # doctest: +SKIP

Read from the manifest only (no TensorFlow, no shard is opened). ``inspect``, the
TFDS metadata and :func:`class_weights` take the class count from :func:`info`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfshards import storage
from tfshards.errors import ManifestError, OptionsError
from tfshards.schemas.manifest import Manifest
from tfshards.storage import Location, StorageOptions

WEIGHT_METHODS = ("median_frequency", "inverse_frequency")


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset's class count, declared or inferred, beside its manifest.

    num_classes: declared at conversion (``--num-classes``, ``--binary-masks``, or the
    largest target of ``--mask-map`` + 1), else inferred as the largest class found in
    any split + 1, and then ``num_classes_inferred`` is True.
    """

    path: Location
    manifest: Manifest
    num_classes: int
    num_classes_inferred: bool
    label_map: Any = None  # a LabelMap (readers/labels.py): counts in its classes

    @property
    def ignore_label(self) -> int | None:
        if self.label_map is not None and (self.label_map.lookup == -1).any():
            return self.label_map.ignore
        return self.manifest.mask.ignore_label

    def class_pixels(self, split: str) -> list[int]:
        """Pixels per class 0..num_classes-1 in one split (ignored pixels left out)."""
        if split not in self.manifest.splits:
            raise ManifestError(
                f"{storage.display(self.path)}: no split {split!r}; this dataset has "
                f"{', '.join(self.manifest.splits)}"
            )
        pixels = list(self.manifest.splits[split].class_pixels)
        if self.label_map is not None:
            return self.label_map.class_pixels(pixels)
        pixels = pixels[: self.num_classes]
        return pixels + [0] * (self.num_classes - len(pixels))


def info(
    path: Location,
    *,
    storage_options: StorageOptions = None,
    label_map: Any = None,
    num_classes: int | None = None,
) -> DatasetInfo:
    """The dataset's class count (declared or inferred) and manifest; path may be a URL.
    With ``label_map`` (and ``num_classes``, as ``read`` takes them), the classes read
    through the map: its class count, and pixel counts merged or dropped by it."""
    from tfshards.arguments import checked_path
    from tfshards.readers.labels import check_one_dataset, manifest_classes
    from tfshards.readers.labels import label_map as resolved

    if isinstance(path, Mapping):
        raise OptionsError(
            "info() reads one dataset; for several, tfshards.mix_exposure(...) gives their "
            "classes' shares and class_weights(...) their weights"
        )
    check_one_dataset(label_map, num_classes, None)
    checked_path("path", path)  # a tfshards.Source alone, say, as read() refuses it
    manifest = Manifest.load(path, storage_options)
    classes, inferred = manifest_classes(manifest)
    if label_map is None:
        return DatasetInfo(path, manifest, classes, inferred)
    mapped = resolved(label_map, manifest, where=storage.display(path), num_classes=num_classes)
    return DatasetInfo(path, manifest, mapped.num_classes, inferred, mapped)


def class_weights(
    path: Location,
    *,
    split: str = "train",
    method: str = "median_frequency",
    storage_options: StorageOptions = None,
    records: Any = None,
    sampling: Any = None,
    epoch_size: int | None = None,
    label_map: Any = None,
    num_classes: int | None = None,
    weights: Any = None,
) -> dict[int, float]:
    """``{class: weight}`` for ``model.fit(class_weight=...)``, from a split's pixel counts.

    With ``label_map`` (as ``read`` takes it), in the classes read through it. With
    several datasets (``path={name: path or Source}`` and ``weights``, as ``read`` mixes
    them), from the pixels one epoch of the mix shows, in the shared classes.
    With ``records``, ``sampling`` or ``epoch_size`` (as ``read`` takes them), from the
    pixels one epoch of that read shows on average (``tfshards.exposure``), so a sampling
    that already shows a rare class more is not corrected for twice.

    median_frequency: median(frequency of the classes present) / frequency of the class.
    inverse_frequency: pixels / (classes present x pixels of the class).
    A class without pixels in the split gets 0; the ignore label, when declared, gets 0
    (Keras looks every mask value up in this mapping, so it must be there).
    """
    if method not in WEIGHT_METHODS:
        raise OptionsError(f"method must be one of {', '.join(WEIGHT_METHODS)}; got {method!r}")
    if isinstance(path, Mapping):  # several datasets, as read() mixes them
        from tfshards.readers.mixing import refuse_one_for_all

        refuse_one_for_all({"records": records, "sampling": sampling, "label_map": label_map})
        return _mixed_weights(
            path, split, method, storage_options, weights, epoch_size, num_classes
        )
    from tfshards.readers.labels import check_one_dataset

    check_one_dataset(label_map, num_classes, weights)
    dataset = info(
        path, storage_options=storage_options, label_map=label_map, num_classes=num_classes
    )
    pixels = dataset.class_pixels(split)
    if records is not None or sampling is not None or epoch_size is not None:
        from tfshards.checks.exposure import exposure

        shown = exposure(
            path,
            split,
            records=records,
            sampling=sampling,
            epoch_size=epoch_size,
            storage_options=storage_options,
            label_map=dataset.label_map,
        ).pixels
        pixels = [float(shown[c]) if c < len(shown) else 0.0 for c in range(len(pixels))]
    weights = dict(enumerate(weights_from_pixels(pixels, method)))
    if dataset.ignore_label is not None:
        weights[dataset.ignore_label] = 0.0
    return weights


def _mixed_weights(
    sources: Mapping, split: str, method: str, storage_options, weights, epoch_size, num_classes
) -> dict[int, float]:
    """class_weights of a mix: from the pixels one epoch of it shows, shared classes."""
    from tfshards.checks.mix_report import mix_exposure
    from tfshards.readers.mixing import sources_of

    report = mix_exposure(
        sources,
        weights=weights,
        epoch_size=epoch_size,
        split=split,
        num_classes=num_classes,
        storage_options=storage_options,
    )
    out = dict(enumerate(weights_from_pixels(report.pixels.sum(axis=0).tolist(), method)))
    first = next(iter(sources_of(sources).values()))
    ignore = Manifest.load(first.path, storage_options).mask.ignore_label
    out[255 if ignore is None else ignore] = 0.0  # label maps ignore pixels with it
    return out


def weights_from_pixels(pixels: list[float], method: str) -> list[float]:
    present = [n for n in pixels if n]
    if not present:
        return [0.0] * len(pixels)
    if method == "median_frequency":
        median = statistics.median(present)
        return [median / n if n else 0.0 for n in pixels]
    total = sum(present)
    return [total / (len(present) * n) if n else 0.0 for n in pixels]
