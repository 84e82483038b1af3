"""Mask values that would surprise a loss function, caught before anything is written.

Keras' sparse losses want class indices 0..K-1. Binary masks saved as 0 and 255
(the most common way they exist on disk) would reach the loss as label 255.
Before writing, a sample of masks is read: 0/255 masks stop the job with the
fix (``--binary-masks``); masks that look like photos (more distinct values than a
label map plausibly has: images and masks swapped) stop it too; other gaps in the
values get a warning naming them.
After writing, the manifest records every split's values, and ``read()``
refuses 0/255 masks that no option accounted for.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence

import numpy as np
from PIL import Image

from tfshards import storage
from tfshards.converters import deep_files
from tfshards.converters.options import ConvertOptions
from tfshards.converters.pairing import Pair
from tfshards.converters.windows import TIFF_SUFFIXES, middle_window, no_pixel_limit
from tfshards.errors import TfshardsError
from tfshards.storage import StorageOptions

SAMPLE_MASKS = 16
SAMPLE_PIXELS = 2**24  # a larger mask is sampled by a window (TIFF) or not at all
# More distinct values than this in the sampled masks, or more than _SPREAD_VALUES spread
# over most of 0..255, look like photos rather than label maps (ADE20K has 151 classes:
# such datasets say so with --num-classes).
MAX_PLAUSIBLE_CLASSES = 64
_SPREAD_VALUES, _SPREAD_RANGE = 32, 200
log = logging.getLogger("tfshards")


class MaskValuesError(TfshardsError):
    """The masks hold values a loss cannot take as class indices, and no option says why."""


def sample_mask_values(
    pairs: Sequence[Pair], count: int = SAMPLE_MASKS, storage_options: StorageOptions = None
) -> set[int]:
    """Distinct values of up to ``count`` masks spread over the dataset (unreadable: skipped)."""
    step = max(1, len(pairs) // count)
    values: set[int] = set()
    for pair in pairs[::step][:count]:
        try:
            pixels = _mask_sample(pair, storage_options)
        except Exception:  # noqa: BLE001 - the conversion reports unreadable files per pair
            continue
        values.update(int(v) for v in np.unique(pixels))
    return values


def _mask_sample(pair: Pair, storage_options: StorageOptions) -> np.ndarray:
    if _is_large_tiff(pair.mask, storage_options):  # a slide's mask: a window of it
        return middle_window(pair.mask, storage_options)
    data = storage.read_bytes(pair.mask, storage_options)
    array = deep_files.array_of(data, pair.mask)  # a .npy or a 16-bit TIFF mask
    if array is not None:
        return array
    with Image.open(io.BytesIO(data)) as mask:
        return np.asarray(mask if mask.mode in ("L", "P", "1") else mask.convert("L"))


def _is_large_tiff(path, storage_options: StorageOptions) -> bool:
    """A TIFF mask of more than SAMPLE_PIXELS pixels (its header read, not its pixels)."""
    if not str(path).lower().endswith(TIFF_SUFFIXES):
        return False
    try:
        with (
            no_pixel_limit(),
            storage.open_file(path, "rb", storage_options) as handle,
            Image.open(handle) as mask,
        ):
            return mask.width * mask.height > SAMPLE_PIXELS
    except (OSError, Image.UnidentifiedImageError):  # e.g. 16-bit bands: read as an array
        return False


def check_mask_values(values: set[int], options: ConvertOptions, where: str) -> None:
    """Stop on photo-like masks and on 0/255 binary masks no option accounts for; warn on
    other gaps."""
    if options.binary_masks:
        _check_binary(values, where)
    if options.binary_masks or options.mask_map is not None or options.num_classes is not None:
        return  # the user said what the values mean
    values = values - {options.ignore_label}
    if not values:
        return
    if looks_like_photos(values):
        raise MaskValuesError(
            f"{where}: the masks look like images, not class labels: the sampled masks hold "
            f"{len(values)} distinct values ({describe_values(values)}). Are --images and "
            "--masks swapped? If these are labels, say how many classes with --num-classes K "
            "(or remap them with --mask-map)"
        )
    if values <= {0, 255} and 255 in values:
        raise MaskValuesError(
            f"{where}: the masks hold the values 0 and 255 (binary masks saved as black and "
            "white), which a Keras loss would read as class 255. Pass --binary-masks (0 -> "
            "class 0, 255 -> class 1), or --mask-map to say what each value means, or "
            "--num-classes 256 to store them as they are"
        )
    if sorted(values) != list(range(max(values) + 1)):
        log.warning(
            "%s: the sampled masks hold the values %s, not 0..K-1; if that is not what your "
            "loss expects, remap them with --mask-map (e.g. 0:0,128:1,255:2)",
            where,
            describe_values(values),
        )


def looks_like_photos(values: set[int]) -> bool:
    """More distinct values than a label map plausibly has, or many spread like a photo's."""
    if len(values) > MAX_PLAUSIBLE_CLASSES:
        return True
    return len(values) > _SPREAD_VALUES and max(values) - min(values) >= _SPREAD_RANGE


def _check_binary(values: set[int], where: str) -> None:
    unexpected = values - {0, 1, 255}
    if not unexpected:
        return
    swapped = (
        " The masks look like images: are --images and --masks swapped?"
        if looks_like_photos(values)
        else " Describe them with --mask-map or --num-classes instead."
    )
    raise MaskValuesError(
        f"{where}: --binary-masks expects masks of 0 and 255 (or 0 and 1), but the sampled "
        f"masks also hold {describe_values(unexpected)}.{swapped}"
    )


def describe_values(values: set[int] | Sequence[int]) -> str:
    ordered = sorted(values)
    shown = ", ".join(str(v) for v in ordered[:12])
    return shown + (f", ... ({len(ordered)} values)" if len(ordered) > 12 else "")
