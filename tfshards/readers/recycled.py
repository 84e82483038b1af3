"""Batch arrays handed to TensorFlow, and reused once TensorFlow lets go of them.

A 512x512 batch of 32 int32 masks is 32 MiB, over glibc's largest mmap threshold:
made anew for every batch (TensorFlow's cast), its pages were faulted in and zeroed
each time, and under a memory limit each fault first reclaimed page cache (in the
2 GiB cgroup of ``benchmarks/larger_than_ram.py`` the cast was 43% of the stream's CPU,
``perf``). An array from here reaches TensorFlow as a view (by DLPack, no copy); when
TensorFlow frees the tensor the view dies, and its memory is kept for a later batch.
float32 images are left to TensorFlow's conversion (``ordered.delivered_masks`` says why).
"""

from __future__ import annotations

import weakref
from collections import deque

import numpy as np

from tfshards.sources.pixel_batches import aligned_empty


class RecycledArrays:
    """Arrays of ``shape`` and ``dtype`` (their first ``rows`` rows taken), at most
    ``spare`` of them kept free between batches."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype | type, spare: int = 4) -> None:
        self.shape, self.dtype, self.spare = tuple(shape), np.dtype(dtype), spare
        self._free: deque[np.ndarray] = deque()  # appends and pops are atomic
        self.allocated = 0

    def take(self, rows: int) -> np.ndarray:
        """A view of the first ``rows`` rows of a free array (a new one when none is)."""
        try:
            base = self._free.pop()
        except IndexError:
            nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
            base = aligned_empty((nbytes,)).view(self.dtype).reshape(self.shape)
            self.allocated += 1
        view = base[:rows]
        weakref.finalize(view, self._give_back, base).atexit = False
        return view

    def _give_back(self, base: np.ndarray) -> None:
        if len(self._free) < self.spare:
            self._free.append(base)
