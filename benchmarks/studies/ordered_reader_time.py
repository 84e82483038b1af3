"""Where the ordered reader's time goes: thread CPU time in each of its Python pieces, per
pair, beside the process's CPU ms per pair, for one path per run.

A one-off study, kept for the decisions it backs (rerun it when those pieces change):
Decision: raw and deflate records of the size read are parsed and copied or inflated into
one batch array inside the fetch call (sources/pixel_batches.py) instead of reaching
TensorFlow as a ``tf.string`` tensor to parse and decode; a building disk cache writes
its pairs with ``os.pwrite`` instead of through a fresh memory map.
Run: 2026-12-04, over the 2,000 256x256 pairs of read_throughput.py's before/after run,
the machine loaded by other runs (only the CPU columns mean anything).
Recorded result: raw stream uint8, 0.41-0.49 ms of process CPU per pair, of which the
fetch call 0.09-0.14; timed alone, records.read 0.165 ms per pair and ``tf.constant`` of
the 32 returned ``bytes`` objects 0.142, as much as the whole read, both under the GIL.
The cache-building epoch (deflate, uint8) 2.03 ms per pair, of which the cache write
through a memory map 0.41. Cached epochs: the gather 0.15-0.19 of 0.38-0.45 (uint8).
Raw output: benchmarks/results/read_before_after_ordered.md (its last section); the
tables in benchmarks/README.md, "Where the time goes in the ordered reader" and "The
cache write after the table above".

Compares: the reader's Python pieces (batch read, pread + CRC, cache gather, cache
write) with the whole process's CPU per pair.
Takes: about a minute per path at 2000 pairs of 256x256.

    python benchmarks/read_throughput.py --count 2000 --size 256 --reuse /tmp/rt
    python benchmarks/studies/ordered_reader_time.py /tmp/rt raw_stream_uint8

Paths: raw_stream_uint8, deflate_stream_uint8 (streams of the raw and deflate
conversions that read_throughput.py --reuse leaves in the folder), cached_uint8 and
cached_float32 (a disk cache of the deflate conversion in FOLDER/profile-cache: built by
the first cached run, whose building epoch is printed too). Each: one warm-up epoch,
then 3 timed epochs. The pieces are wrapped with time.thread_time (the CPU of the thread
that runs them, i.e. the py_function bodies): Cursor.step (per batch until Cursor.begin,
once per iteration, replaced it; skipped where absent), OrderedReader.fetch (the per-
batch read and decode), SplitRecords.read and read_record (pread + CRC checks),
PairStore .read (the cache gather) and PairStore.write (the cache write). Records of the
size read are decoded inside fetch (sources/pixel_batches.py); what is not in the pieces
is TensorFlow's: the pipeline's own steps, casting and finishing. raw_stream_uint8 also
times, in this thread over 60 batches, the parts of a batch read: records.read, os.pread
alone, CRC32C of the data alone, and tf.constant of the 32 returned bytes objects (what
a py_function did with them before raw and deflate records were decoded in fetch;
PNG/JPEG records still go that way). About a minute per path at 2000 pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

SPENT: dict[str, float] = defaultdict(float)


def timed(name, function):
    def wrapper(*args, **kwargs):
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT[name] += time.thread_time() - started

    return wrapper


def instrument() -> None:
    import tfshards.readers.cache.store as store
    import tfshards.readers.ordered as ordered
    import tfshards.sources.records as records

    pieces = {
        "cursor.step": (ordered.Cursor, "step"),  # per batch until it became Cursor.begin
        "fetch": (ordered.OrderedReader, "fetch"),
        "store.write (cache write)": (store.PairStore, "write"),
        "records.read": (records.SplitRecords, "read"),
        "read_record (pread + CRC)": (records, "read_record"),
        "store.read (cache gather)": (store.PairStore, "read"),
    }
    for name, (owner, attribute) in pieces.items():
        if hasattr(owner, attribute):
            setattr(owner, attribute, timed(name, getattr(owner, attribute)))
        else:
            print(f"{name}: not in this version of tfshards, not timed")


def epoch(dataset) -> dict:
    SPENT.clear()
    cpu, started, pairs = time.process_time(), time.perf_counter(), 0
    for image, _ in dataset:
        pairs += int(image.shape[0])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - started
    result = {"pairs_per_s": round(pairs / wall), "process_cpu_ms_per_pair": 1000 * cpu / pairs}
    result.update({f"{k} ms/pair": 1000 * v / pairs for k, v in sorted(SPENT.items())})
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}


def parts_of_a_batch(reader) -> None:
    import google_crc32c
    import tensorflow as tf

    records = reader.records
    batches = [reader.batch_indices(step) for step in range(60)]
    data = [records.read(indices) for indices in batches]
    pairs = sum(len(b) for b in batches)
    fd, offsets = records._open(0)

    def pread_only(k):
        for j in range(len(batches[k])):
            os.pread(fd, int(offsets.lengths[j]), int(offsets.starts[j]))

    parts = {
        "records.read (pread + CRC + copies)": lambda k: records.read(batches[k]),
        "os.pread alone": pread_only,
        "CRC32C of the data alone": lambda k: [google_crc32c.value(d) for d in data[k]],
        "tf.constant of the 32 bytes objects": lambda k: tf.constant(data[k]),
    }
    for label, part in parts.items():
        started = time.thread_time()
        for k in range(len(batches)):
            part(k)
        print(f"  {label}: {1000 * (time.thread_time() - started) / pairs:.3f} ms/pair")


PATHS = ("raw_stream_uint8", "deflate_stream_uint8", "cached_uint8", "cached_float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a read_throughput.py --reuse folder")
    parser.add_argument("path", choices=PATHS, help="the read path to time")
    args = parser.parse_args()
    folder, path = args.folder, args.path
    instrument()
    import tfshards

    cache = folder / "profile-cache"
    make = {
        "raw_stream_uint8": lambda: tfshards.read(folder / "raw", image_dtype="uint8", seed=0),
        "deflate_stream_uint8": lambda: tfshards.read(
            folder / "deflate", image_dtype="uint8", seed=0
        ),
        "cached_uint8": lambda: tfshards.read(
            folder / "deflate", cache=cache, image_dtype="uint8", seed=0
        ),
        "cached_float32": lambda: tfshards.read(folder / "deflate", cache=cache, seed=0),
    }
    building = path.startswith("cached") and not cache.exists()
    dataset = make[path]()
    first = epoch(dataset)
    if building:
        print(path, "cache-building epoch", json.dumps(first))
    for _ in range(3):
        print(path, json.dumps(epoch(dataset)), flush=True)
    if path == "raw_stream_uint8":
        parts_of_a_batch(dataset._tfshards_reader)


if __name__ == "__main__":
    main()
