"""The script behind read_buffer_2026-12-03.md: TFRecordDataset read-ahead 256 KiB vs 1 MiB.

A one-off study. Decision: the reader leaves TFRecordDataset's read-ahead at TensorFlow's
default (256 KiB locally) unless ReadOptions(read_buffer_bytes=...) is set. Run:
2026-12-03. Recorded result: 5336 pairs/s and 0.175 CPU ms/pair (256 KiB) against 4651 and
0.179 (1 MiB): alike within this machine's noise.

Run from a folder holding `braw/` (tfshards synth bdata --count 1500 --size 160, then
tfshards convert --encoding raw into braw/), with the tfshards of that day, whose
ReadOptions(read_buffer_bytes=...) passed the buffer to TFRecordDataset.
"""

import os
import statistics
import time

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tfshards  # noqa: E402


def epoch(buffer: int) -> tuple[float, float]:
    """(pairs/s, CPU ms per pair) of one epoch."""
    dataset = tfshards.read(
        "braw",
        batch_size=32,
        image_dtype="uint8",
        seed=0,
        options=tfshards.ReadOptions(read_buffer_bytes=buffer),
    )
    wall, cpu = time.perf_counter(), time.process_time()
    pairs = sum(int(images.shape[0]) for images, _ in dataset)
    return pairs / (time.perf_counter() - wall), (time.process_time() - cpu) * 1000 / pairs


results: dict[int, list[tuple[float, float]]] = {2**18: [], 2**20: []}
epoch(2**20)  # warm-up
for _ in range(11):  # alternating, so both see the same machine load
    for size, runs in results.items():
        runs.append(epoch(size))
for size, runs in results.items():
    rates = [rate for rate, _ in runs]
    cpu = statistics.median(ms for _, ms in runs)
    print(
        f"| buffer {size // 1024} KiB | {statistics.median(rates):.0f} pairs/s "
        f"(min {min(rates):.0f}, max {max(rates):.0f}) | {cpu:.3f} CPU ms/pair |"
    )
