"""Timing passes over datasets and sampling peak RSS while they run."""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from collections.abc import Iterable


def timed_pass(dataset: Iterable) -> tuple[int, float]:
    """Iterate once; return (elements along each batch's first axis, seconds to the last).

    The clock stops when the last batch arrives, not when the iterator reports its end:
    with tf.data autotuning on, that report waits for the autotuner's next wake-up
    (seconds, measured here: passes then end at 0.64 s x 2^k), which training with a
    known cardinality never waits for, and which would swamp short passes.
    """
    count, seconds, _ = timed_pass_cpu(dataset)
    return count, seconds


def timed_pass_cpu(dataset: Iterable) -> tuple[int, float, float]:
    """Like :func:`timed_pass`, also returning this process's CPU seconds to the last batch."""
    started, cpu = time.perf_counter(), time.process_time()
    count, last, last_cpu = 0, started, cpu
    for batch in dataset:
        first = batch[0] if isinstance(batch, tuple | list) else batch
        count += int(first.shape[0]) if getattr(first, "shape", None) else 1
        last, last_cpu = time.perf_counter(), time.process_time()
    return count, last - started, last_cpu - cpu


def current_rss_mib() -> float:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PeakRss:
    """Samples this process's RSS every 20 ms while in the `with` block; `peak_mib` after."""

    def __init__(self) -> None:
        self.peak_mib = current_rss_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_mib = max(self.peak_mib, current_rss_mib())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mib = max(self.peak_mib, current_rss_mib())


def median_and_spread(values: list[float]) -> tuple[float, float]:
    """Median, and (max - min) / median as the relative spread."""
    middle = statistics.median(values)
    return middle, (max(values) - min(values)) / middle if middle else 0.0


def drop_page_cache() -> bool:
    """Drop the OS page cache where permitted (Linux, privileged); True if it was dropped."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
        return True
    except OSError:
        return False
