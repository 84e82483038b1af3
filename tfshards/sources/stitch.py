"""``tfshards.Stitcher``: per-tile predictions written back into a source-sized array.

Predictions are accumulated, weighted, in a float32 ``[height, width, classes]`` array
and the weights in a ``[height, width]`` one, both memory-mapped files beside the output
(deleted when done), so a slide never has to fit in memory: adding a tile touches only
its window's pages, and :meth:`Stitcher.finish` writes the output a band of rows at a
time.

- A tile's prediction is either class indices ``[h, w]`` (each pixel votes for its
  class) or per-class scores ``[h, w, classes]`` (e.g. softmax outputs).
- ``blend="mean"``: every tile's pixels weigh 1, so an overlapped pixel gets the mean
  of its tiles' scores (or the majority of their votes). ``blend="gaussian"``: a pixel
  weighs ``exp(-d^2 / 2 sigma^2)`` by its distance ``d`` from the tile's centre along
  each axis, ``sigma`` an eighth of the tile's size (as MONAI's sliding-window
  inference does), floored at 1e-3 so a pixel that one tile alone covers keeps a weight;
  tile edges, where a model sees the least context, count the least.
- ``output="labels"``: the class of the highest blended score (ties: the lowest class),
  uint8 for up to 256 classes, else int32. ``output="scores"``: the blended scores,
  float32 ``[height, width, classes]``, summing to 1 where class indices were stacked.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import numpy as np

from tfshards.arguments import checked_int
from tfshards.errors import OptionsError, StitchError
from tfshards.schemas.tiles import Window

BLENDS = ("mean", "gaussian")
OUTPUTS = ("labels", "scores")
_BAND_BYTES = 64 * 2**20  # bytes of accumulated scores finished at a time
_GAUSSIAN_FLOOR = 1e-3


class Stitcher:
    """Blend per-tile predictions into one prediction of a ``height`` x ``width`` image.

    >>> stitcher = Stitcher(700, 1000, classes=3, out="pred.npy")  # doctest: +SKIP
    >>> stitcher.add(Window(0, 0, 512, 512), scores)  # [512, 512, 3]  # doctest: +SKIP
    >>> labels = stitcher.finish()  # uint8 [700, 1000], a memmap of pred.npy  # doctest: +SKIP

    ``out``: a ``.npy`` file to write (``np.load(out, mmap_mode="r")`` opens it later);
    None: an unnamed temporary file, mapped while the returned array lives. An existing
    ``out`` is replaced only with ``overwrite=True``; it appears whole at ``finish()``.
    """

    def __init__(
        self,
        height: int,
        width: int,
        *,
        classes: int,
        out: str | os.PathLike | None = None,
        blend: str = "mean",
        output: str = "labels",
        overwrite: bool = False,
    ) -> None:
        self.height = checked_int("height", height, low=1)
        self.width = checked_int("width", width, low=1)
        self.classes = checked_int("classes", classes, low=1)
        for name, value, valid in (("blend", blend, BLENDS), ("output", output, OUTPUTS)):
            if value not in valid:
                raise OptionsError(f"{name} must be one of {', '.join(valid)}; got {value!r}")
        self.blend, self.output = blend, output
        self.out = None if out is None else _checked_out(Path(out), overwrite)
        folder = self.out.parent if self.out is not None else None
        self._sums = _scratch((self.height, self.width, self.classes), folder)
        self._weights = _scratch((self.height, self.width), folder)
        self.tiles = 0

    def add(self, window: Window, prediction: np.ndarray) -> None:
        """Add one tile's prediction: class indices [h, w] (or [h, w, 1] of integers) or
        scores [h, w, classes], ``h`` x ``w`` the window's size."""
        if self._sums is None:
            raise StitchError("this Stitcher has finished; make a new one")
        if not isinstance(window, Window):
            raise OptionsError(
                f"window must be a tfshards.Window(row, column, height, width); got {window!r}"
            )
        if window.bottom > self.height or window.right > self.width:
            raise StitchError(f"window {window} reaches past the {self.height}x{self.width} image")
        votes = self._as_scores(np.asarray(prediction), window)
        weight = _weights(window.height, window.width, self.blend)
        rows, cols = window.slices
        self._sums[rows, cols] += votes * weight[:, :, None]
        self._weights[rows, cols] += weight
        self.tiles += 1

    def _as_scores(self, prediction: np.ndarray, window: Window) -> np.ndarray:
        size = (window.height, window.width)
        if prediction.ndim == 3 and prediction.shape[2] == 1 and prediction.dtype.kind in "iub":
            prediction = prediction[:, :, 0]
        if prediction.ndim == 2 and prediction.dtype.kind in "iub":
            if prediction.shape != size:
                raise StitchError(f"labels of shape {prediction.shape} for a {size} window")
            if prediction.size and (prediction.min() < 0 or prediction.max() >= self.classes):
                raise StitchError(
                    f"class index {int(prediction.max())} (or {int(prediction.min())}) is "
                    f"not in 0..{self.classes - 1}"
                )
            return prediction[:, :, None] == np.arange(self.classes, dtype=prediction.dtype)
        if prediction.shape != (*size, self.classes):
            raise StitchError(
                f"a prediction of shape {prediction.shape}: expected class indices {size} "
                f"or scores {(*size, self.classes)}"
            )
        if prediction.dtype.kind not in "iuf":
            raise StitchError(f"scores of dtype {prediction.dtype}: expected real numbers")
        scores = prediction.astype(np.float32, copy=False)
        if not np.isfinite(scores).all():  # a NaN would be argmax's pick, silently
            raise StitchError(
                f"scores for window {window} hold {int(np.sum(~np.isfinite(scores)))} NaN "
                "or infinite values (a model that diverged, or float16 overflow)"
            )
        return scores

    def finish(self) -> np.ndarray:
        """The blended prediction (see the module docstring), as a memmap; the scratch
        files are deleted. StitchError if some pixel had no tile."""
        if self._sums is None:
            raise StitchError("this Stitcher has finished already")
        labels = self.output == "labels"
        shape = (self.height, self.width) if labels else (self.height, self.width, self.classes)
        dtype = (np.uint8 if self.classes <= 256 else np.int32) if labels else np.float32
        band = max(1, _BAND_BYTES // (self.width * self.classes * 4))
        self._check_covered(band)  # before ``out`` is written: no partial output is left
        result = _output(self.out, shape, dtype)
        for top in range(0, self.height, band):
            rows = slice(top, min(top + band, self.height))
            weights, sums = self._weights[rows], self._sums[rows]
            result[rows] = sums.argmax(axis=2) if labels else sums / weights[:, :, None]
        result.flush()
        if self.out is not None:
            os.replace(result.filename, self.out)  # the mapping follows the file
        self._sums = self._weights = None  # unmapped: their files are gone already
        return result

    def _check_covered(self, band: int) -> None:
        for top in range(0, self.height, band):
            weights = self._weights[top : top + band]
            if not weights.all():
                row = top + int(np.flatnonzero(~weights.all(axis=1))[0])
                raise StitchError(
                    f"row {row} has pixels no tile covered: add every tile of the source"
                )


def _checked_out(out: Path, overwrite: bool) -> Path:
    """``out`` as given, if a file can be written there (refused now, not after every
    tile was added); an existing file only with ``overwrite`` (it may be the user's)."""
    if out.is_dir():
        raise OptionsError(f"out must be a .npy file to write, got the folder {out}")
    if not out.parent.is_dir():
        raise OptionsError(f"out: the folder {out.parent} does not exist; create it first")
    if out.exists() and not overwrite:
        raise OptionsError(f"out: {out} exists; pass overwrite=True to replace it")
    return out


def _scratch(shape: tuple[int, ...], folder: Path | None) -> np.ndarray:
    """A zeroed float32 memmap on a file deleted at once (the mapping keeps it alive)."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".tfshards-stitch-") as handle:
        return np.memmap(handle.name, np.float32, "w+", shape=shape)


def _output(out: Path | None, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A memmap to write the result into: a hidden file beside ``out`` that ``_publish``
    renames, so an interrupted finish never leaves a complete-looking ``out``."""
    if out is not None:
        partial = out.with_name(f".tfshards-stitched-{os.getpid()}-{out.name}")
        return np.lib.format.open_memmap(partial, "w+", dtype, shape)
    with tempfile.NamedTemporaryFile(prefix=".tfshards-stitched-") as handle:
        return np.memmap(handle.name, dtype, "w+", shape=shape)


@functools.lru_cache(maxsize=8)
def _weights(height: int, width: int, blend: str) -> np.ndarray:
    """float32 [height, width]: how much each pixel of a tile of this size counts."""
    if blend == "mean":
        weights = np.ones((height, width), np.float32)
    else:
        weights = np.outer(_gaussian(height), _gaussian(width)).astype(np.float32)
        np.maximum(weights, _GAUSSIAN_FLOOR, out=weights)
    weights.flags.writeable = False
    return weights


def _gaussian(length: int) -> np.ndarray:
    distance = np.arange(length) - (length - 1) / 2
    sigma = max(length / 8, 1e-6)
    return np.exp(-(distance**2) / (2 * sigma**2))
