"""Sampling at scale: the per-record table's size, an epoch's order under weights and
class balance at 10M records, and a sampled read's first batch from any position.

Compares: the table's bytes per record with the 64-byte target; one epoch's order under
a 10% subset, weights and class balance with the 2 s / 1 GB target; the first batch of
a class-balanced read, from the start and from the middle of epoch 7, with a plain read's.
Takes: about 3 minutes at the defaults on 2 busy cores.

Part 1 (no pixels): a synthetic table of ``--records`` records (default 10M) of 20
classes, 4 present per record (background in all, three others with skewed
frequencies), keys of 10 characters, 512x512 records. Prints its bytes per record in
memory and in its file, then the time and the peak of NumPy memory (tracemalloc, which
NumPy reports its arrays to) of: resolving the sampling once per read (``select``) and
computing one epoch's order (``SampledOrder.records``), for a 10% subset, weights,
``ClassBalanced()`` (class-uniform) and ``ClassBalanced(rule="repeat_factor")``.
Targets (issue 45): at most 64 bytes per record; an epoch's order in at most 2 s and 1 GB.

Part 2 (a converted dataset of ``--pairs`` small pairs): time from ``tfshards.read(...)``
to its first batch (imports done before), fresh processes, alternating: a plain read
from the start, a class-balanced read from the start, and one started at (epoch 7, a
batch in the middle).
Target: a sampled read started anywhere within 1.5x a fresh plain read's first batch.

Part 3, mixing (issue 47): one epoch's order of 10 datasets totalling ``--records``
records (sizes 1:2:...:10, 1,000-record shards), each read whole or by weights, with
the 2 s target; then the CPU time per pair (``time.process_time``, all threads) of
reading two converted datasets of ``--pairs`` 128x128 pairs one after the other, against
one mixed read of the same records (weights by size, ``epoch_size`` their total),
alternating, ``--rounds`` rounds. Target: the mix within 1.05x the CPU per pair.

    python benchmarks/sampling_scale.py                 # about 2 minutes
    python benchmarks/sampling_scale.py --part mixing   # part 3 only
    python benchmarks/sampling_scale.py --records 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import peak_rss_of  # noqa: E402
from tfshards.readers.order import EpochOrder  # noqa: E402
from tfshards.readers.sampling import ClassBalanced, SampledOrder  # noqa: E402
from tfshards.readers.selection import select  # noqa: E402
from tfshards.schemas.record_table import RecordTable, smallest_unsigned  # noqa: E402

CLASSES, PRESENT = 20, 4


def synthetic_table(records: int, seed: int = 0) -> RecordTable:
    """``records`` rows: class 0 in all, three distinct others, rarer for higher classes."""
    rng = np.random.default_rng(seed)
    odds = 1.0 / np.arange(1, CLASSES) ** 1.2
    first = rng.choice(np.arange(CLASSES - 1), records, p=odds / odds.sum())
    step = rng.integers(1, 7, records)
    others = 1 + (first[:, None] + step[:, None] * np.arange(PRESENT - 1)) % (CLASSES - 1)
    ids = np.sort(np.concatenate([np.zeros((records, 1), np.int64), others], axis=1), axis=1)
    counts = rng.integers(1, 512 * 512 // PRESENT, (records, PRESENT))
    powers = 10 ** np.arange(9, -1, -1, dtype=np.int64)  # keys "0000000000", "0000000001"...
    keys = (48 + np.arange(records, dtype=np.int64)[:, None] // powers % 10).astype(np.uint8)
    return RecordTable(
        key_ends=smallest_unsigned(np.arange(1, records + 1, dtype=np.int64) * 10),
        key_bytes=keys.ravel(),
        heights=smallest_unsigned(np.full(records, 512)),
        widths=smallest_unsigned(np.full(records, 512)),
        ignored_pixels=smallest_unsigned(np.zeros(records, np.int64)),
        class_ends=smallest_unsigned(np.arange(1, records + 1, dtype=np.int64) * PRESENT),
        class_ids=smallest_unsigned(ids.ravel()),
        class_counts=smallest_unsigned(counts.ravel()),
        class_cells=rng.integers(1, 2**16, records * PRESENT).astype(np.uint16),
        num_classes=CLASSES,
    )


def measured(work) -> tuple[float, float]:
    """(seconds, peak MiB of NumPy allocations) of ``work(run)``: timed untraced (run 0),
    then run again (run 1) under tracemalloc for its peak."""
    began = time.perf_counter()
    work(0)
    seconds = time.perf_counter() - began
    tracemalloc.start()
    work(1)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, peak


def table_rows(records: int) -> None:
    table = synthetic_table(records)
    file_bytes = len(table.to_bytes())
    print(f"\n## The per-record table, {records:,} records, {CLASSES} classes, {PRESENT} present")
    print("| | bytes | bytes per record | target |\n|---|---|---|---|")
    print(f"| in memory | {table.nbytes:,} | {table.nbytes / records:.1f} | <= 64 |")
    print(f"| its file | {file_bytes:,} | {file_bytes / records:.1f} | |")
    shards = (records // 1000,) * 1000
    base = EpochOrder(shards, True, 0, 8)
    rng = np.random.default_rng(1)
    cases = {
        "10% subset": dict(records=np.flatnonzero(rng.random(records) < 0.1)),
        "weights": dict(sampling=rng.random(records)),
        "ClassBalanced()": dict(sampling=ClassBalanced()),
        "ClassBalanced(repeat_factor)": dict(sampling=ClassBalanced(rule="repeat_factor")),
    }
    print("\n| sampling | select (once per read) s | MiB | one epoch's order s | MiB | target |")
    print("|---|---|---|---|---|---|")
    for name, arguments in cases.items():
        made: dict = {}

        def resolve(_: int, a: dict = arguments, made: dict = made) -> None:
            made["order"] = SampledOrder(
                base, select(table, a.get("records"), a.get("sampling"), None)
            )

        seconds, peak = measured(resolve)
        epoch_seconds, epoch_peak = measured(lambda run, made=made: made["order"].records(3 + run))
        print(
            f"| {name} | {seconds:.2f} | {peak:.0f} | {epoch_seconds:.2f} | {epoch_peak:.0f} | "
            "<= 2 s, <= 1024 MiB |"
        )


FIRST_BATCH = """
import sys, time
import tensorflow
import tfshards
began = time.perf_counter()  # imports apart: from read() to the first batch
kind, path, start = sys.argv[1], sys.argv[2], sys.argv[3]
arguments = dict(batch_size=32, seed=0)
if kind != "plain":
    arguments["sampling"] = tfshards.ClassBalanced(exclude=[0])
if start != "-":
    arguments["start"] = tuple(int(v) for v in start.split(","))
next(iter(tfshards.read(path, **arguments)))
RESULT = {"seconds": time.perf_counter() - began}
"""


def first_batch_rows(pairs: int, rounds: int) -> None:
    import tfshards

    with tempfile.TemporaryDirectory() as tmp:
        images, masks = tfshards.synth(Path(tmp) / "src", count=pairs, size=64, classes=4)
        out = Path(tmp) / "shards"
        tfshards.convert(images, masks, out, options=tfshards.ConvertOptions(encoding="raw"))
        tfshards.records(out)  # the table exists before the first read, as after conversion
        middle = (pairs // 32) // 2
        runs = {
            "plain, start": ("plain", "-"),
            "ClassBalanced, start": ("balanced", "-"),
            f"ClassBalanced, (7, {middle})": ("balanced", f"7,{middle}"),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, (kind, start) in runs.items():
                code = FIRST_BATCH.replace(
                    "sys.argv[1], sys.argv[2], sys.argv[3]", f"{kind!r}, {str(out)!r}, {start!r}"
                )
                times[name].append(peak_rss_of(code)["seconds"])
    plain = statistics.median(times["plain, start"])
    print(f"\n## First batch, fresh processes, {pairs} pairs of 64x64, {rounds} rounds")
    print("| read | median s | spread s | vs plain | target |\n|---|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"| {name} | {median:.2f} | {min(values):.2f}-{max(values):.2f} | "
            f"{median / plain:.2f}x | <= 1.5x |"
        )


def mix_order_rows(records: int) -> None:
    """One epoch's order of 10 sources totalling ``records``: whole, and by weights."""
    from tfshards.readers.mixing import mix_order
    from tfshards.readers.sampling import Selection

    sizes = [records * k // 55 for k in range(1, 11)]
    shards = [(1000,) * (size // 1000) + ((size % 1000,) if size % 1000 else ()) for size in sizes]
    rng = np.random.default_rng(0)
    cases = {
        "whole": [Selection(n, None, None, n) for n in sizes],
        "weights": [Selection(n, None, rng.random(n), n) for n in sizes],
    }
    shares = np.full(10, 0.1)  # the small sources repeated, the large ones sampled
    print(f"\n## A mix's epoch order, 10 datasets, {records:,} records")
    print("| sources read | one epoch's order s | MiB | vs one dataset's | target |")
    print("|---|---|---|---|---|")
    alone = EpochOrder(sum(shards, ()), True, 0, 8)  # one dataset of as many records
    base, peak = measured(lambda run: alone.records(3 + run))
    print(f"| one dataset, every record once (reference) | {base:.2f} | {peak:.0f} | 1.00x | |")
    for name, selections in cases.items():
        order = mix_order(shards, [8] * 10, selections, shares, records, 0, True)
        seconds, peak = measured(lambda run, order=order: order.records(3 + run))
        print(f"| {name} | {seconds:.2f} | {peak:.0f} | {seconds / base:.2f}x | <= 2 s |")


def _cpu_per_pair(read) -> float:
    began, pairs = time.process_time(), 0
    for image, _ in read:
        pairs += int(image.shape[0])
    return (time.process_time() - began) * 1000 / pairs


def mix_cost_rows(pairs: int, rounds: int) -> None:
    """CPU ms per pair: two datasets read one after the other vs mixed, alternating."""
    import tfshards

    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for k, count in enumerate((pairs, pairs // 2)):
            root = Path(tmp) / f"d{k}"
            images, masks = tfshards.synth(root / "src", count=count, size=128, classes=4, seed=k)
            options = tfshards.ConvertOptions(encoding="raw")
            tfshards.convert(images, masks, root / "shards", options=options)
            paths[f"d{k}"] = root / "shards"
        total = pairs + pairs // 2
        settings = dict(batch_size=32, seed=0, image_dtype="uint8")
        alone = [tfshards.read(p, **settings) for p in paths.values()]
        mixed = tfshards.read(paths, weights=[2, 1], epoch_size=total, **settings)
        times: dict[str, list[float]] = {"one at a time": [], "mixed": []}
        for _ in range(rounds + 1):  # the first round warms the page cache, not counted
            one = sum(_cpu_per_pair(r) * len(r) for r in alone) / sum(map(len, alone))
            both = _cpu_per_pair(mixed)
            times["one at a time"].append(one)
            times["mixed"].append(both)
    base = statistics.median(times["one at a time"][1:])
    print(f"\n## CPU per pair, {total} pairs of 128x128 in two datasets, {rounds} rounds")
    print("| read | median ms per pair | spread | vs one at a time | target |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        values = values[1:]
        print(
            f"| {name} | {statistics.median(values):.3f} | {min(values):.3f}-"
            f"{max(values):.3f} | {statistics.median(values) / base:.2f}x | <= 1.05x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000, help="table rows (10M)")
    parser.add_argument("--pairs", type=int, default=2000, help="converted pairs (2000)")
    parser.add_argument("--rounds", type=int, default=5, help="first-batch rounds (5)")
    parser.add_argument("--part", choices=("all", "mixing"), default="all")
    args = parser.parse_args()
    if args.part == "all":
        table_rows(args.records)
        first_batch_rows(args.pairs, args.rounds)
    mix_order_rows(args.records)
    mix_cost_rows(args.pairs, args.rounds)


if __name__ == "__main__":
    main()
