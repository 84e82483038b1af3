"""What a long conversion shows while it runs, and what it took at the end.

One clock from the start of the job: while the folders are listed the bar counts
files (a listing of millions of files takes minutes and must not look hung), while
files are checked it counts pairs, then it shows pairs written with pairs/s, source
MB/s, the time since the start and tqdm's ETA. The summary counts the CPU time of the
launching process and of its finished worker processes.
"""

from __future__ import annotations

import multiprocessing
import queue
import resource
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm


def cpu_seconds() -> float:
    """User + system CPU of this process and of its children that have ended."""
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass(frozen=True)
class Effort:
    """What a conversion took: wall seconds (planning included), CPU seconds, source bytes."""

    seconds: float
    plan_seconds: float
    cpu_seconds: float
    pairs: int
    source_bytes: int

    @property
    def cpu_ms_per_pair(self) -> float:
        return 1000 * self.cpu_seconds / max(self.pairs, 1)

    def __str__(self) -> str:
        return (
            f"{self.pairs} pairs in {self.seconds:.1f} s ({self.plan_seconds:.1f} s listing "
            f"and planning), {self.pairs / max(self.seconds, 1e-9):.0f} pairs/s, "
            f"{self.source_bytes / max(self.seconds, 1e-9) / 1e6:.1f} MB/s of source files, "
            f"CPU {self.cpu_ms_per_pair:.2f} ms per pair (all processes)"
        )


class ConversionProgress:
    """A tqdm bar through the phases of one conversion (disabled: counts only)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.started = time.perf_counter()
        self._cpu_started = cpu_seconds()
        self.planned_at: float | None = None
        self.pairs = 0
        self.source_bytes = 0
        self._converting_at = self.started
        self.bar = self._bar("listing", "file", None)

    def _bar(self, phase: str, unit: str, total: int | None) -> tqdm:
        return tqdm(
            desc=phase, unit=f" {unit}s", total=total, disable=not self.enabled, dynamic_ncols=True
        )

    def listed(self, files: int) -> None:
        self.bar.update(files)

    def checking(self, pairs: int) -> None:
        """Files are stat()ed (sizes, resume fingerprint): count pairs."""
        self.bar.close()
        self.bar = self._bar("checking", "pair", pairs)

    def converting(self, pairs: int) -> None:
        self.bar.close()
        self.planned_at = time.perf_counter()
        self._converting_at = self.planned_at
        self.bar = self._bar("converting", "pair", pairs)

    def update(self, pairs: int, source_bytes: int) -> None:
        self.pairs += pairs
        self.source_bytes += source_bytes
        self.bar.update(pairs)
        now = time.perf_counter()
        rate = self.source_bytes / max(now - self._converting_at, 1e-9) / 1e6
        since = tqdm.format_interval(now - self.started)
        self.bar.set_postfix_str(f"{rate:.1f} MB/s, {since} since start", refresh=False)

    def drain(self, updates: multiprocessing.Queue) -> None:
        """Count the updates the workers have sent so far."""
        while True:
            try:
                self.update(*updates.get_nowait())
            except queue.Empty:
                return

    def drain_to_end(self, updates: multiprocessing.Queue) -> None:
        """Count every update, once the workers have exited.

        A worker's last update can still be in the pipe when its result arrives (the two
        travel on separate queues), so reading until the queue looks empty missed pairs:
        a summary of 7 pairs for 40. A process flushes what it put before it exits, so a
        marker put now comes after every update.
        """
        updates.put(None)
        for update in iter(updates.get, None):
            self.update(*update)
        updates.close()  # and its feeder thread in this process, started by the put
        updates.join_thread()

    def close(self, *, finished: bool = True) -> Effort:
        """End the bar; when shown and the job finished, end with a line of what it took
        (an interrupted or failed job ends with its error line only)."""
        self.bar.close()
        now = time.perf_counter()
        planned = self.planned_at if self.planned_at is not None else now
        effort = Effort(
            seconds=now - self.started,
            plan_seconds=planned - self.started,
            cpu_seconds=cpu_seconds() - self._cpu_started,
            pairs=self.pairs,
            source_bytes=self.source_bytes,
        )
        if self.enabled and self.pairs and finished:
            tqdm.write(f"tfshards: converted {effort}", file=sys.stderr)
        return effort
