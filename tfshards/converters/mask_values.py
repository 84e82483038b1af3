"""Mask values that would surprise a loss function, caught before anything is written.

Keras' sparse losses want class indices 0..K-1. Binary masks saved as 0 and 255
(the most common way they exist on disk) would reach the loss as label 255.
Before writing, a sample of masks is read: 0/255 masks stop the job with the
fix (``--binary-masks``); other gaps in the values get a warning naming them.
After writing, the manifest records every split's values, and ``read()``
refuses 0/255 masks that no option accounted for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from PIL import Image

from tfshards import storage
from tfshards.converters.options import ConvertOptions
from tfshards.converters.pairing import Pair
from tfshards.errors import TfshardsError
from tfshards.storage import StorageOptions

SAMPLE_MASKS = 16
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
            with (
                storage.open_file(pair.mask, "rb", storage_options) as handle,
                Image.open(handle) as mask,
            ):
                pixels = np.asarray(mask if mask.mode in ("L", "P", "1") else mask.convert("L"))
        except Exception:  # noqa: BLE001 - the conversion reports unreadable files per pair
            continue
        values.update(int(v) for v in np.unique(pixels))
    return values


def check_mask_values(values: set[int], options: ConvertOptions, where: str) -> None:
    """Stop on 0/255 binary masks no option accounts for; warn on other gaps."""
    if options.binary_masks or options.mask_map is not None or options.num_classes is not None:
        return  # the user said what the values mean
    values = values - {options.ignore_label}
    if not values:
        return
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


def describe_values(values: set[int] | Sequence[int]) -> str:
    ordered = sorted(values)
    shown = ", ".join(str(v) for v in ordered[:12])
    return shown + (f", ... ({len(ordered)} values)" if len(ordered) > 12 else "")
