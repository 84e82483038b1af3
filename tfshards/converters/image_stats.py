"""Per-channel image statistics of a split, counted exactly at conversion.

Each shard job counts, per channel, the pixels, the sum and the sum of squares of
the stored samples (Python integers, from a histogram of each record's band:
no rounding anywhere), and the minimum and maximum. The conversion adds the counts
of a split's shards and derives mean and standard deviation (population, over every
pixel of the split) once, from integers: the same numbers from any runner (local
processes, Beam, a bucket), any shard order and any number of workers.
"""

from __future__ import annotations

import math

import numpy as np

from tfshards.schemas.manifest import ImageStats

# Every value of a uint8 / uint16 sample (by itemsize), and its square, for the histograms.
_VALUES = {
    size: (np.arange(2 ** (8 * size), dtype=np.int64), np.arange(2 ** (8 * size)) ** 2)
    for size in (1, 2)
}


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
        values, squares = _VALUES[image.dtype.itemsize]
        for band in range(channels):
            counts = np.bincount(image[:, :, band].ravel(), minlength=values.size)
            present = np.flatnonzero(counts)
            if not present.size:  # an empty image
                continue
            # int64 holds these: a record (under 2 GiB) has under 2^31 samples of a band.
            self.sums[band] += int(counts @ values)
            self.squares[band] += int(counts @ squares)
            low, high = int(present[0]), int(present[-1])
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
