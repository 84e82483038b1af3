"""Reading a split larger than the page cache: through it, or past it (``O_DIRECT``).

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: a split (or disk cache) larger than half the memory, of records of 256 KiB or
more on average, is read past the page cache, with four reads in flight per batch
(``tfshards/direct_reads.py``), in place of asking for a batch's records with
``POSIX_FADV_WILLNEED`` and reading them through the page cache.
Run: 2026-12-07, 2-core VM (ext4 on a virtio disk), 6,000 raw RGB 512x512 records
(5.9 GiB) under a 2 GiB memory cgroup. Recorded result: 0.42 ms of CPU per record
through the page cache (0.40 of it system time), 0.14 ms direct (0.08 the copy out of
the aligned buffer), records/s 3,027 buffered, 3,326-3,368 direct (3 rounds).
Raw output: results/direct_reads.md here; benchmarks/README.md, "Reads past the page
cache".

    sudo python benchmarks/studies/direct_reads.py --dataset /tmp/ltr-bench/rgb512-6000/here/raw

Only the reads, no decoding and no TensorFlow: every record of ``--split`` once, in
the order an epoch reads them (groups of shards, shuffled within each group, as
``readers/order.py``), 32 to a batch, each batch read by one of ``--fetchers`` threads
(tf.data runs several fetch calls at once). Ways, alternating over ``--rounds``, each
in a fresh process:
- ``buffered``: the batch's records asked for with ``POSIX_FADV_WILLNEED``, then each
  read by ``preadv`` through the page cache (the reader before this study);
- ``direct-1``: each record read past the page cache, one at a time per batch;
- ``direct``: the same with ``READS_IN_FLIGHT`` reads of a batch at once (the reader now).
Each process runs in its own memory cgroup of ``--limit-mib`` when run as root (the
page cache of the data counts against it); without root the data's pages are dropped
before each process, and the page cache is not limited (say so when you quote it).
Prints pairs/s, user and system CPU ms per record, medians over rounds with min-max.
Takes: about 20 s per pass for 6 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _benchmarks_path  # noqa: F401 - benchmarks/ on sys.path
import numpy as np
from _common import drop_pages, markdown_table
from larger_than_ram import MemoryCgroup

WAYS = ("buffered", "direct-1", "direct")
BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True, help="a tfshards dataset folder")
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit-mib", type=int, default=2048, help="memory cgroup limit (MiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fetchers", type=int, default=2, help="batches read at once")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    cgroup = MemoryCgroup(args.limit_mib * 2**20)
    how = f"a {args.limit_mib} MiB cgroup each" if cgroup.usable else "NO cgroup (not root)"
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; {how}")
    rows = []
    for number in range(1, args.rounds + 1):
        for way in WAYS:
            job = {"dataset": str(args.dataset), "split": args.split, "way": way,
                   "fetchers": args.fetchers}  # fmt: skip
            rows.append({"round": number, "way": way, **run_child(job, cgroup)})
            print(markdown_table(rows[-1:]), flush=True)
    print(markdown_table(summary(rows)))


def run_child(job: dict, cgroup: MemoryCgroup) -> dict:
    for path in Path(job["dataset"]).glob(f"{job['split']}-*"):
        drop_pages(path)
    group = cgroup.create(f"tfshards-direct-{os.getpid()}") if cgroup.usable else None

    def enter() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    done = subprocess.run(
        [sys.executable, __file__, "--dataset", job["dataset"], "--child", json.dumps(job)],
        capture_output=True, text=True, preexec_fn=enter, check=True,
    )  # fmt: skip
    peak = cgroup.peak_mib() if group is not None else None
    if group is not None:
        cgroup.remove()
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    return {**json.loads(line[7:]), "cgroup_peak_MiB": round(peak) if peak else ""}


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for way in WAYS:
        mine = [r for r in rows if r["way"] == way]
        line = {"way": way}
        for name in ("pairs_per_s", "user_ms", "sys_ms"):
            values = [r[name] for r in mine]
            line[name] = f"{statistics.median(values):g} ({min(values):g}-{max(values):g})"
        out.append(line)
    return out


def child(job: dict) -> dict:
    from tfshards import direct_reads
    from tfshards.readers.order import EpochOrder, group_shards
    from tfshards.readers.shards import split_shards
    from tfshards.sources import records as records_module
    from tfshards.sources.records import SplitRecords

    records = SplitRecords(split_shards(Path(job["dataset"]), job["split"]))
    way = job["way"]
    records.ask_ahead = way == "buffered"
    records.reads_direct = way != "buffered"
    if way == "direct-1":
        records_module.READS_IN_FLIGHT = 1
    shards = records.shards.shards
    group = group_shards([shard.bytes for shard in shards], None)
    order = EpochOrder(tuple(shard.records for shard in shards), True, 0, group).records(0)
    batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
    local = threading.local()

    def read_one(position: int, fd: int, start: int, length: int, where: str) -> None:
        out = getattr(local, "out", None)
        if out is None or len(out) < length:
            out = local.out = np.empty(length, np.uint8)
        if direct_reads.unbuffered(fd):  # read aligned, then copied out, as the reader does
            out[:length] = np.frombuffer(direct_reads.read_span(fd, start, length), np.uint8)
        else:  # straight into the batch's memory, as the reader did
            os.preadv(fd, [out[:length]], start)

    return timed(lambda batch: records.read_each(batch, read_one), batches, job["fetchers"])


def timed(read_batch, batches: list, fetchers: int) -> dict:
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    with ThreadPoolExecutor(fetchers) as pool:
        list(pool.map(read_batch, batches))
    seconds, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    pairs = sum(len(batch) for batch in batches)
    return {
        "pairs": pairs,
        "pairs_per_s": round(pairs / seconds),
        "user_ms": round(1e3 * (after.ru_utime - before.ru_utime) / pairs, 3),
        "sys_ms": round(1e3 * (after.ru_stime - before.ru_stime) / pairs, 3),
    }


if __name__ == "__main__":
    main()
