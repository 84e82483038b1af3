"""Per-channel image statistics of a split, counted exactly at conversion.

Each shard job counts, per channel, the pixels, the sum and the sum of squares of
the stored samples (unsigned integer sums per record, Python integers across records:
no rounding anywhere), and the minimum and maximum. The conversion adds the counts
of a split's shards and derives mean and standard deviation (population, over every
pixel of the split) once, from integers: the same numbers from any runner (local
processes, Beam, a bucket), any shard order and any number of workers.
"""

from __future__ import annotations

import math

import numpy as np

from tfshards.schemas.manifest import ImageStats

# The square of a sample fits in the next wider unsigned type: 255^2 < 2^16, 65535^2 < 2^32.
_SQUARE_TYPE = {1: np.uint16, 2: np.uint32}


class ChannelSums:
    """Exact per-channel counts of the images a shard job stores."""

    def __init__(self) -> None:
        self.pixels = 0
        self.sums: list[int] = []
        self.squares: list[int] = []
        self.low: list[int] = []
        self.high: list[int] = []

    def add(self, image: np.ndarray) -> None:
        """Count one image, [H, W, C] uint8 or uint16."""
        channels = image.shape[2]
        if not self.sums:
            self.sums, self.squares = [0] * channels, [0] * channels
            self.low, self.high = [None] * channels, [None] * channels
        if not image.size:  # an empty image
            return
        # One contiguous plane per band: reductions along rows of planes are 1.6-2.3x as
        # fast as a histogram per band (0.71 against 1.15 ms for 512x512 RGB).
        planes = np.ascontiguousarray(np.moveaxis(image, -1, 0)).reshape(channels, -1)
        # uint64 sums are exact: a record (under 2 GiB) has under 2^31 samples of a band.
        sums = planes.sum(axis=1, dtype=np.uint64)
        wide = planes.astype(_SQUARE_TYPE[image.dtype.itemsize])
        np.multiply(wide, wide, out=wide)
        squares = wide.sum(axis=1, dtype=np.uint64)
        lows, highs = planes.min(axis=1), planes.max(axis=1)
        for band in range(channels):
            self.sums[band] += int(sums[band])
            self.squares[band] += int(squares[band])
            low, high = int(lows[band]), int(highs[band])
            self.low[band] = low if self.low[band] is None else min(self.low[band], low)
            self.high[band] = high if self.high[band] is None else max(self.high[band], high)
        self.pixels += image.shape[0] * image.shape[1]

    def to_json(self) -> dict:
        return {
            "pixels": self.pixels,
            "sum": self.sums,
            "sum_squares": self.squares,
            "min": self.low,
            "max": self.high,
        }


def split_stats(parts: list[dict | None]) -> ImageStats | None:
    """A split's statistics from its shards' counts (``ChannelSums.to_json``); None when a
    shard has none (journaled by a tfshards without them) or the split holds no pixels."""
    if any(part is None for part in parts):
        return None
    counted = [part for part in parts if part["pixels"]]
    if not counted:
        return None
    pixels = sum(part["pixels"] for part in counted)
    mean, std, low, high = [], [], [], []
    for channel in range(len(counted[0]["sum"])):
        total = sum(part["sum"][channel] for part in counted)
        squares = sum(part["sum_squares"][channel] for part in counted)
        # Exact integers until this one division: (n * sum x^2 - (sum x)^2) / n^2.
        variance = (pixels * squares - total * total) / (pixels * pixels)
        mean.append(total / pixels)
        std.append(math.sqrt(variance))
        low.append(min(part["min"][channel] for part in counted))
        high.append(max(part["max"][channel] for part in counted))
    return ImageStats(pixels=pixels, mean=mean, std=std, min=low, max=high)
