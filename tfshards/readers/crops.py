"""Where each crop of a batch lies: pure NumPy, a function of (seed, epoch, batch, position).

The ordered reader (ordered.py) places every crop before its pixels are decoded, from
the records' sizes alone, then cuts decoded pairs here (:func:`cut`), or has TensorFlow
cut them (records it decodes, and ``crop_scale``'s resizing). Every random number is a
function of ``(seed, epoch, batch, position in the batch)`` (NumPy's PCG64, seeded
through a SeedSequence of (seed, epoch, batch), its rows taken by position), never of a
generator whose state lives in the process, so a batch read again, in another process
or resumed at its (epoch, batch), gets the same crops.

A box is ``(height, width, top, left)``: the size the record is scaled to (its own size
without ``crop_scale``) and the crop's top-left corner in the scaled record. A record
smaller than the crop is padded at its bottom and right (images with 0, masks with the
fill label) and its corner is 0 on that axis.
"""

from __future__ import annotations

import numpy as np

DRAWS = 3  # per crop: the scale factor, the corner's row, the corner's column
_CROPS = 0x63726F70  # "crop": keeps these draws apart from other users of the same key


def uniform_draws(seed: int, epoch: int, batch: int, positions: np.ndarray) -> np.ndarray:
    """``[len(positions), DRAWS]`` floats in [0, 1): row ``k`` holds the draws of
    position ``positions[k]`` of batch ``batch`` (counted over all pipelines' pairs of
    that batch), a function of (seed, epoch, batch, position) alone: the same numbers in
    any process, whichever positions are asked for together. One generator per batch,
    seeded by (seed, epoch, batch), gives position p its p-th row of draws."""
    positions = np.asarray(positions, np.int64)
    if not len(positions):
        return np.zeros((0, DRAWS))
    rng = np.random.default_rng([_CROPS, int(seed), int(epoch), int(batch)])
    return rng.random((int(positions.max()) + 1, DRAWS))[positions]


def crop_corners(
    heights: np.ndarray,
    widths: np.ndarray,
    crop_size: tuple[int, int],
    draws: np.ndarray,
    centres: np.ndarray | None = None,
) -> np.ndarray:
    """Top-left corners ``[B, 2]`` (row, column; int64) of crops of ``crop_size`` in
    records of ``heights`` x ``widths`` (``[B]`` each, in the pixels the crop is cut
    from).

    ``draws``: ``[B, 2]`` uniform numbers in [0, 1) (columns 1 and 2 of
    :func:`uniform_draws`), used where no centre is asked for: the corner is then uniform
    over every place the crop fits. ``centres``: optional ``[B, 2]`` float array of the
    crop centres asked for (row, column, in the same pixels); a row holding NaN or a
    negative number is placed uniformly. A crop centred there is moved to lie inside
    the record (clamped); a record smaller than the crop on an axis gets corner 0 on it
    (it is padded at its bottom/right).

    >>> draws = np.array([[0.0, 0.99], [0.5, 0.5]])
    >>> crop_corners(np.array([10, 300]), np.array([10, 300]), (256, 256), draws,
    ...              centres=np.array([[np.nan, np.nan], [290.0, 5.0]])).tolist()
    [[0, 0], [44, 0]]
    """
    sizes = np.stack([np.asarray(heights, np.int64), np.asarray(widths, np.int64)], axis=1)
    crop = np.asarray(crop_size, np.int64)
    spare = np.maximum(sizes - crop, 0)
    corners = np.minimum(np.floor(np.asarray(draws) * (spare + 1)).astype(np.int64), spare)
    if centres is not None:
        centres = np.asarray(centres, np.float64).reshape(len(sizes), 2)
        asked = np.all(np.isfinite(centres) & (centres >= 0), axis=1)
        centred = np.floor(np.nan_to_num(centres) - crop // 2).astype(np.int64)
        corners[asked] = np.clip(centred[asked], 0, spare[asked])
    return corners


def crop_boxes(
    heights: np.ndarray,
    widths: np.ndarray,
    crop_size: tuple[int, int],
    draws: np.ndarray,
    crop_scale: tuple[float, float] | None = None,
    centres: np.ndarray | None = None,
) -> np.ndarray:
    """Boxes ``[B, 4]`` (int32: scaled height, scaled width, top, left) of a batch's crops:
    each record scaled by a factor drawn in ``crop_scale`` (column 0 of ``draws``, from
    :func:`uniform_draws`), then its crop placed by :func:`crop_corners` (``centres`` in
    the record's own pixels, scaled with it)."""
    sizes = np.stack([np.asarray(heights, np.int64), np.asarray(widths, np.int64)], axis=1)
    if crop_scale is not None:
        low, high = crop_scale
        factor = low + (high - low) * draws[:, :1]
        sizes = np.maximum(np.round(sizes * factor).astype(np.int64), 1)
        if centres is not None:
            centres = np.asarray(centres, np.float64) * factor
    corners = crop_corners(sizes[:, 0], sizes[:, 1], crop_size, draws[:, 1:], centres)
    return np.concatenate([sizes, corners], axis=1).astype(np.int32)


def pad_boxes(heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Boxes of records padded (never cut): their own size, corner (0, 0)."""
    sizes = np.stack([np.asarray(heights), np.asarray(widths)], axis=1)
    return np.concatenate([sizes, np.zeros_like(sizes)], axis=1).astype(np.int32)


def cut(
    images: np.ndarray | list[np.ndarray],
    masks: np.ndarray | list[np.ndarray],
    boxes: np.ndarray,
    out_images: np.ndarray,
    out_masks: np.ndarray,
    fill_label: int,
) -> None:
    """Pairs cut as their boxes say, unscaled, into ``out_images`` [B, h, w, C] and
    ``out_masks`` [B, h, w, 1] (any integer dtype): pair ``k``'s pixels are the top left
    of ``images[k]`` and ``masks[k]`` (rows of a batch array, or arrays of their own
    size); its box is (own height, own width, height, width, top, left) as the ordered
    reader makes it, height and width being its own (no ``crop_scale``). What the crop
    holds of the record goes to the top left; the rest is 0 (images) and ``fill_label``
    (masks), as a record smaller than the crop or the pad is padded."""
    height, width = out_images.shape[1:3]
    for k, (own_height, own_width, _, _, top, left) in enumerate(boxes.tolist()):
        rows, cols = min(height, own_height - top), min(width, own_width - left)
        out_images[k, :rows, :cols] = images[k][top : top + rows, left : left + cols]
        out_masks[k, :rows, :cols] = masks[k][top : top + rows, left : left + cols]
        if rows < height or cols < width:  # the record is smaller: padded
            out_images[k, rows:], out_images[k, :rows, cols:] = 0, 0
            out_masks[k, rows:], out_masks[k, :rows, cols:] = fill_label, fill_label
