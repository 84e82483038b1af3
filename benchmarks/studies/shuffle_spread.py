"""How well an epoch's order mixes: the ordered reader's groups against the previous
shuffle buffer.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: replace the shuffle buffer by an order drawn per (seed, epoch), mixed in groups
of shards (tfshards/readers/order.py), so that any batch can be computed directly.
Run: 2026-12-04. Recorded result: with 20,000 pairs, 160 shards, 150 KB records, pairs
adjacent in a shard land 536 positions apart on average (median 466) against 429 (295)
with the previous 64 MiB buffer; epoch-to-epoch correlation 0.000 against -0.030.
Raw output: this folder's README.md (the table row).

    python benchmarks/studies/shuffle_spread.py [--pairs 20000 --shards 160 --record-kb 150]

The new order is computed by tfshards' own code (``readers/order.py``). The previous
reader is modelled (no TensorFlow run): shards in a random order, 8 read round-robin
(tf.data's deterministic interleave, block 1), then a shuffle buffer of 64 MiB of
serialized records (tf.data's: fill, emit a random slot, refill it). Printed per order:
the mean and median distance, in an epoch, between two pairs adjacent in a shard (and
so in the disk cache), and the correlation of pairs' positions in two epochs.
Takes a few seconds.
"""

from __future__ import annotations

import argparse

import numpy as np

from tfshards.readers.order import EpochOrder, group_shards


def previous_order(counts: list[int], buffer: int, rng: np.random.Generator) -> np.ndarray:
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pending = [list(range(first[s], first[s] + counts[s])) for s in rng.permutation(len(counts))]
    slots = [pending.pop(0) for _ in range(min(8, len(pending)))]
    stream = []
    while slots:
        for slot in list(slots):
            stream.append(slot.pop(0))
            if not slot:
                index = slots.index(slot)
                if pending:
                    slots[index] = pending.pop(0)
                else:
                    slots.pop(index)
    out, held = [], stream[:buffer]
    for record in stream[buffer:] + [None] * len(held):
        pick = int(rng.integers(len(held)))
        out.append(held[pick])
        if record is None:
            held.pop(pick)
        else:
            held[pick] = record
    return np.array(out)


def spread(order: np.ndarray, counts: list[int]) -> tuple[float, float]:
    position = np.empty(len(order), np.int64)
    position[order] = np.arange(len(order))
    last = np.cumsum(counts) - 1  # the last record of each shard has no neighbour in it
    neighbours = np.setdiff1d(np.arange(len(order) - 1), last)
    distance = np.abs(position[neighbours + 1] - position[neighbours])
    return float(distance.mean()), float(np.median(distance))


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    pa, pb = np.empty_like(a), np.empty_like(b)
    pa[a], pb[b] = np.arange(len(a)), np.arange(len(b))
    return float(np.corrcoef(pa, pb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--shards", type=int, default=160)
    parser.add_argument("--record-kb", type=int, default=150, help="a stored record's size")
    args = parser.parse_args()
    counts = [len(range(s, args.pairs, args.shards)) for s in range(args.shards)]
    shard_bytes = [c * args.record_kb * 1024 for c in counts]
    group = group_shards(shard_bytes, None)
    new = EpochOrder(tuple(counts), True, 0, group)
    buffer = min(10_000, 64 * 2**20 // (args.record_kb * 1024))
    rng = np.random.default_rng(0)
    old = [previous_order(counts, buffer, rng) for _ in range(2)]
    rows = [
        (f"ordered reader (groups of {group} shards)", new.records(0), new.records(1)),
        (f"previous reader (buffer of {buffer} records, 8 shards)", *old),
    ]
    print("| order | mean distance | median distance | epoch-to-epoch correlation |")
    print("|---|---|---|---|")
    for name, first, second in rows:
        mean, median = spread(first, counts)
        print(f"| {name} | {mean:.0f} | {median:.0f} | {correlation(first, second):.3f} |")


if __name__ == "__main__":
    main()
