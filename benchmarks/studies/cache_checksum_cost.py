"""The disk cache's checksum per pair: its CPU on a warm (cached) epoch, checks on and off.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: every pair read from a disk cache entry is checked against the CRC-32 taken
when it was written (readers/cache/store.py ``pair_checksums``), on every warm epoch, with
no option to turn it off; issue 43 allowed it at most 10% of the warm epoch's CPU. The CRC
is zlib's CRC-32 by ISA-L, not google-crc32c's CRC-32C, which ran at less than half its
speed here (both printed below).
Run: 2026-12-07, on a 2-core VM shared with other jobs (spreads 0.2-1.0).
Recorded result: the check's own CPU (the store's read on minus off) 0.0068 ms per pair at
256x256 and 0.0194 at 512x512: 6.6% and 5.4% of a checked uint8 warm epoch, 3.8% and
1.9% of a float32 one. Whole warm epochs, on/off CPU per pair, medians of 11 (of the
minimums): uint8 1.146 (1.100) at 256x256, 1.051 (1.056) at 512x512; float32 1.038
(1.020) and 1.011 (0.956). So the 10% holds for the check itself and for float32 epochs
(read()'s default); a uint8 epoch at 256x256, which is little more than a copy from
the page cache, took 10-15% more CPU with the check in this run (1.07-1.36 in the
three earlier runs, of earlier versions: results file). CRC-32 by ISA-L ran 48 GB/s,
CRC-32C by google-crc32c 25.
Raw output: benchmarks/studies/results/cache_checksum_cost.md

    python benchmarks/studies/cache_checksum_cost.py [--count 2000] [--sizes 256,512]
        [--passes 7] [--dtypes uint8,float32]

Per size: ``tfshards.synth`` pairs (RGB, 4 classes; ``--count`` at 256x256, as many bytes
at other sizes), converted raw, read ordered (shuffled, batches of 32) with a disk cache:
one epoch builds it, one more warms it up, then ``--passes`` rounds of two warm epochs,
checks on and off (the store's private switch ``_CHECKED``), alternating which goes
first. Each epoch is timed to its last batch: CPU ms per pair of the whole process
(``time.process_time``; user and system from ``resource.getrusage``) and pairs/s.
Prints medians with their spread ((max - min) / median) and the on/off ratio of CPU per
pair (of the medians, and of the minimums: the passes least disturbed by other jobs).
Then the check's own cost: the ready store's ``read`` alone (one thread, no TensorFlow),
an epoch of batches per pass, on and off alternating, its CPU ms per pair on minus off,
and that as a share of the checked epoch's CPU; last, CRC-32 (ISA-L) and CRC-32C
(google-crc32c) in GB/s over a batch of pairs in memory. Compare ratios of one run only: the machine
this ran on is shared (2 cores, other jobs running).
Takes: about 4 minutes at the defaults.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="pairs at 256x256 (2000)")
    parser.add_argument("--sizes", default="256,512", help="image sides (default 256,512)")
    parser.add_argument("--passes", type=int, default=7, help="rounds of on and off (7)")
    parser.add_argument("--dtypes", default="uint8,float32", help="image dtypes read")
    args = parser.parse_args()
    print("| size | pairs | dtype | checks | CPU ms/pair | spread | user | sys | pairs/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary, speeds = [], {}
    with tempfile.TemporaryDirectory(prefix="checksum-cost-") as scratch:
        for side in (int(s) for s in args.sizes.split(",")):
            count = max(BATCH, args.count * 256**2 // side**2)
            shards = dataset(Path(scratch) / f"{side}", count, side)
            speeds[side] = crc_speeds(side)
            cache = Path(scratch) / f"cache-{side}"
            epochs = {d: warm_epochs(shards, cache, d, args.passes) for d in args.dtypes.split(",")}
            reads = store_reads(shards, cache, args.passes)
            check = statistics.median(reads[True]) - statistics.median(reads[False])
            print(
                f"store.read alone, {side}x{side}: on {statistics.median(reads[True]):.4f}, off "
                f"{statistics.median(reads[False]):.4f} CPU ms/pair (min {min(reads[True]):.4f}, "
                f"{min(reads[False]):.4f}): the check {check:.4f}",
                flush=True,
            )
            for dtype, times in epochs.items():
                on, off = (statistics.median(times[c]["cpu"]) for c in (True, False))
                low = min(times[True]["cpu"]) / min(times[False]["cpu"])
                summary.append((side, dtype, on / off, low, check, check / on))
    print()
    print("| size | dtype | epoch CPU on/off (medians) | (minimums) | the check, ms/pair "
          "| its share of the checked epoch |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for side, dtype, ratio, low, check, share in summary:
        print(f"| {side}x{side} | {dtype} | {ratio:.3f} | {low:.3f} | {check:.4f} | {share:.1%} |")
    print()
    print("| size | CRC-32 (ISA-L) GB/s | CRC-32C (google-crc32c) GB/s |")
    print("|---|---|---|")
    for side, (crc32, crc32c) in speeds.items():
        print(f"| {side}x{side} | {crc32:.1f} | {crc32c:.1f} |")


def dataset(root: Path, count: int, side: int) -> Path:
    import tfshards

    images, masks = tfshards.synth(root / "data", count=count, size=side, classes=4)
    tfshards.convert(
        images, masks, root / "shards", encoding="raw", val_fraction=0.0, workers=1,
        progress=False,
    )  # fmt: skip
    return root / "shards"


def warm_epochs(shards: Path, cache: Path, dtype: str, passes: int) -> dict:
    import tfshards
    from tfshards.readers.cache import store

    ds = tfshards.read(shards, batch_size=BATCH, image_dtype=dtype, seed=0, cache=cache)
    epoch(ds)  # builds the cache (or reads one a previous dtype built)
    tfshards.list_caches(cache)  # waits for its publishing
    epoch(ds)  # warm-up
    names = ("cpu", "user", "sys", "rate", "pairs")
    times = {checked: {name: [] for name in names} for checked in (True, False)}
    try:
        for round_ in range(passes):
            for checked in (True, False) if round_ % 2 == 0 else (False, True):
                store._CHECKED = checked
                for name, value in epoch(ds).items():
                    times[checked][name].append(value)
    finally:
        store._CHECKED = True
    side = ds.element_spec[0].shape[1]
    for checked, runs in times.items():
        cpu = statistics.median(runs["cpu"])
        spread = (max(runs["cpu"]) - min(runs["cpu"])) / cpu
        print(
            f"| {side}x{side} | {runs['pairs'][0]} | {dtype} | {'on' if checked else 'off'} "
            f"| {cpu:.4f} | {spread:.2f} | {statistics.median(runs['user']):.4f} "
            f"| {statistics.median(runs['sys']):.4f} | {statistics.median(runs['rate']):.0f} |",
            flush=True,
        )
    return times


def epoch(ds) -> dict:
    """One epoch, to its last batch: CPU, user and system ms per pair, and pairs/s."""
    usage, cpu = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
    started, pairs = time.perf_counter(), 0
    for images, _ in ds:
        pairs += int(images.shape[0])
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu": 1000 * cpu / pairs,
        "user": 1000 * (after.ru_utime - usage.ru_utime) / pairs,
        "sys": 1000 * (after.ru_stime - usage.ru_stime) / pairs,
        "rate": pairs / wall,
        "pairs": pairs,
    }


def store_reads(shards: Path, cache: Path, passes: int) -> dict[bool, list[float]]:
    """CPU ms per pair of the ready store's ``read`` alone (one thread, no TensorFlow),
    an epoch's batches per pass, checks on and off alternating: the check's own cost."""
    import numpy as np

    import tfshards
    from tfshards.readers.cache import store

    ds = tfshards.read(shards, batch_size=BATCH, image_dtype="uint8", seed=0, cache=cache)
    pairs = ds._tfshards_reader.store
    assert pairs.ready, "the cache was built by warm_epochs"
    order = np.random.default_rng(0).permutation(pairs.records)
    batches = [order[start : start + BATCH] for start in range(0, len(order), BATCH)]
    times = {True: [], False: []}
    try:
        for round_ in range(passes):
            for checked in (True, False) if round_ % 2 == 0 else (False, True):
                store._CHECKED = checked
                started = time.process_time()
                for batch in batches:
                    pairs.read(batch)
                times[checked].append(1000 * (time.process_time() - started) / len(order))
    finally:
        store._CHECKED = True
    return times


def crc_speeds(side: int, batches: int = 50) -> tuple[float, float]:
    """GB/s of the two CRCs over a batch of pairs in memory (best of 5, CPU time)."""
    import numpy as np

    from tfshards.readers.cache.store import _crc32_at
    from tfshards.schemas.tfrecord import crc32c_at

    pairs = np.random.default_rng(0).integers(0, 256, (BATCH, side * side * 4), dtype=np.uint8)
    size, at = pairs[0].nbytes, pairs.ctypes.data
    speeds = []
    for extend in (_crc32_at(), crc32c_at()):
        best = float("inf")
        for _ in range(5):
            started = time.process_time()
            for _ in range(batches):
                for k in range(BATCH):
                    extend(0, at + k * size, size)
            best = min(best, time.process_time() - started)
        speeds.append(batches * pairs.nbytes / best / 1e9)
    return speeds[0], speeds[1]


if __name__ == "__main__":
    main()
