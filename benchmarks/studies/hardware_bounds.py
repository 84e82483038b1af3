"""What this machine's disk and memory allow, apart from tfshards: the bounds behind
issue 29's targets that were not met.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: a disk cache too large for the page cache asks for every pair of a batch at
once (``POSIX_FADV_WILLNEED``, readers/cache/store.py ``_ask_for_rows``), since shuffled
1 MiB reads run far below an in-order read with one in flight and near it with four.
Run: 2026-12-06, 2-core Intel Xeon VM. Recorded result: shuffled 1 MiB reads 0.34x an
in-order read with one thread, 0.94x with four; reading while writing as much 0.29x;
a uint8 -> int32 widening 1.42-1.83x as fast on two cores as on one, pure Python
1.15-2.27x (the VM's cores are shared). Raw output: results/hardware_bounds.md here;
benchmarks/README.md, "A batch's pairs asked for at once".

    python benchmarks/studies/hardware_bounds.py --folder /tmp --gib 4

Measures, on a file of ``--gib`` GiB written in ``--folder`` (use the disk the caches
live on; at least twice a memory cgroup's limit so the write is not absorbed):
- **writing** it from a reused buffer in 8 MiB pieces, then ``fdatasync``: MB/s;
- **reading it cold** (its pages dropped with ``POSIX_FADV_DONTNEED`` after the sync, so
  no root is needed): in order in 1 MiB reads, and in a random order of 1 MiB reads (a
  512x512 RGB uint8 pair with its mask is 1 MiB, the unit a cached epoch reads in a
  shuffled order) with 1 and 4 threads, read-ahead off as the disk cache has it;
- **reading it cold in order while writing as many bytes to another file** and syncing
  them, as a cache-building epoch must;
- **memory bandwidth**: a uint8 -> int32 widening of 64 MiB repeated in one process,
  then in two processes at once (the work a reader does per mask), against pure Python
  arithmetic the same way: how much a second core adds to each.
Prints a table and the ratios that bound the targets: reading while writing against
reading alone (a cache-building epoch against the bare read), shuffled against in-order
reads (a cached epoch against the bare read).
Takes: about 1-2 minutes for 4 GiB.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _benchmarks_path  # noqa: F401  (benchmarks/ on sys.path)
import numpy as np
from _common import drop_pages

PIECE = 8 << 20
READ = 1 << 20


def write_file(path: Path, size: int) -> float:
    """MB/s of writing ``size`` bytes and syncing them to the disk."""
    piece = np.random.default_rng(0).integers(0, 256, PIECE, dtype=np.uint8).tobytes()
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for offset in range(0, size, PIECE):
            os.pwrite(fd, piece, offset)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return size / (time.perf_counter() - started) / 1e6


def read_cold(path: Path, size: int, *, shuffled: bool, threads: int) -> float:
    """MB/s of reading the whole file in 1 MiB reads: in order, or shuffled with
    ``POSIX_FADV_RANDOM`` (no read-ahead), as the disk cache reads its pairs."""
    drop_pages(path)
    offsets = list(range(0, size, READ))
    if shuffled:
        random.Random(0).shuffle(offsets)
    fd = os.open(path, os.O_RDONLY)
    if shuffled:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda offset: os.pread(fd, READ, offset), offsets))
    finally:
        os.close(fd)
    return size / (time.perf_counter() - started) / 1e6


def read_while_writing(path: Path, size: int) -> float:
    """MB/s read of the file in order while a thread writes as many bytes to another
    file and syncs them: what a cache-building epoch asks of the disk (it writes what it
    reads), timed until both are done."""
    drop_pages(path)
    copy = path.with_suffix(".copy")
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(1) as pool:
            writing = pool.submit(write_file, copy, size)
            fd = os.open(path, os.O_RDONLY)
            try:
                for offset in range(0, size, READ):
                    os.pread(fd, READ, offset)
            finally:
                os.close(fd)
            writing.result()
    finally:
        copy.unlink(missing_ok=True)
    return size / (time.perf_counter() - started) / 1e6


def widen(repeats: int) -> float:
    """Seconds to widen 64 MiB of uint8 to int32, ``repeats`` times (a fresh array each
    time, as a reader's masks go out to memory)."""
    source = np.ones(64 << 20, dtype=np.uint8)
    started = time.perf_counter()
    for _ in range(repeats):
        source.astype(np.int32)
    return time.perf_counter() - started


def python_arithmetic(repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        total = 0
        for i in range(2_000_000):
            total += i * i % 7
    return time.perf_counter() - started


def scaling(work, repeats: int) -> dict:
    """Seconds of ``work`` alone, and the slower of two copies run at once: their ratio
    is what a second core adds (2.0 when it doubles the throughput)."""
    alone = work(repeats)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        both = max(pool.map(work, [repeats, repeats]))
    return {"alone_s": round(alone, 2), "two_at_once_s": round(both, 2),
            "throughput_x": round(2 * alone / both, 2)}  # fmt: skip


def disk_rows(path: Path, size: int, passes: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {
        "write + fdatasync": [],
        "cold read, in order": [],
        "cold read, shuffled 1 MiB, 1 thread": [],
        "cold read, shuffled 1 MiB, 4 threads": [],
        "cold read in order while writing as much": [],
    }
    for _ in range(passes):
        results["write + fdatasync"].append(write_file(path, size))
        results["cold read, in order"].append(read_cold(path, size, shuffled=False, threads=1))
        for threads in (1, 4):
            name = f"cold read, shuffled 1 MiB, {threads} thread{'s' * (threads > 1)}"
            results[name].append(read_cold(path, size, shuffled=True, threads=threads))
        results["cold read in order while writing as much"].append(read_while_writing(path, size))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path("/tmp"), help="default: /tmp")
    parser.add_argument("--gib", type=float, default=4.0, help="file size; default: 4")
    parser.add_argument("--passes", type=int, default=3, help="default: 3")
    args = parser.parse_args()
    size = int(args.gib * (1 << 30)) // PIECE * PIECE
    path = args.folder / "hardware_bounds.bin"
    try:
        disk = disk_rows(path, size, args.passes)
    finally:
        path.unlink(missing_ok=True)
    print("| disk | MB/s median | all passes |\n|---|---|---|")
    for name, values in disk.items():
        print(f"| {name} | {statistics.median(values):,.0f} | "
              f"{', '.join(f'{v:,.0f}' for v in values)} |")  # fmt: skip
    median = {name: statistics.median(values) for name, values in disk.items()}
    in_order = median["cold read, in order"]
    print()
    for name in list(median)[2:]:
        print(f"{name} / in-order read: {median[name] / in_order:.2f}")
    print("\n| work | alone s | two at once s | throughput of two |\n|---|---|---|---|")
    for name, work, repeats in (("uint8 -> int32, 64 MiB", widen, 20),
                                ("pure Python arithmetic", python_arithmetic, 3)):  # fmt: skip
        row = scaling(work, repeats)
        print(f"| {name} | {row['alone_s']} | {row['two_at_once_s']} | {row['throughput_x']}x |")


if __name__ == "__main__":
    main()
