"""uint8 -> float32 images: cast then multiply, against the one-pass Dequantize tfshards uses.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: The reader converts uint8 images to float32 with one ``Dequantize`` op
(tfshards/readers/decode.py), bit-identical to ``x * (1/255)``.
Run: 2026-12-03. Recorded result: Dequantize took 0.61x the CPU of a cast then a
multiply at 256x256 and at 512x512.
Raw output: benchmarks/README.md of that date; now in this folder's README.md.

    python benchmarks/studies/float_conversion.py [--repeats 7] [--batches 20]

For batches of 32 RGB images at 256x256 and 512x512, in a tf.function, pinned to one
core (os.sched_setaffinity) so CPU time is the op's own: CPU ms per image, median of
the repeats with the spread, and the ratio. Both give the same floats, bit for bit
(checked here on every uint8 value, and in tests/test_read.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed passes (default 7)")
    parser.add_argument("--batches", type=int, default=20, help="batches per pass (default 20)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import numpy as np
    import tensorflow as tf

    from tfshards.readers.decode import to_float_image

    every = tf.constant(np.arange(256, dtype=np.uint8))
    expected = np.arange(256, dtype=np.float32) * np.float32(1.0 / 255.0)
    assert np.array_equal(to_float_image(every).numpy(), expected), "not bit-identical"
    ways = {
        "cast then multiply": tf.function(lambda x: tf.cast(x, tf.float32) * (1.0 / 255.0)),
        "Dequantize (tfshards)": tf.function(to_float_image),
    }
    print("| image | way | CPU ms per image | spread | vs cast then multiply |")
    print("|---|---|---|---|---|")
    for side in (256, 512):
        images = tf.cast(tf.random.uniform([BATCH, side, side, 3], 0, 256, tf.int32), tf.uint8)
        times = {name: [] for name in ways}
        for way in ways.values():
            way(images)  # trace
        for _ in range(args.repeats):  # alternating, so load hits both alike
            for name, way in ways.items():
                started = time.process_time()
                for _ in range(args.batches):
                    way(images)
                per_image = (time.process_time() - started) / (args.batches * BATCH)
                times[name].append(1000 * per_image)
        base = statistics.median(times["cast then multiply"])
        for name, runs in times.items():
            median = statistics.median(runs)
            spread = (max(runs) - min(runs)) / median
            ratio = median / base
            print(f"| {side}x{side}x3 | {name} | {median:.3f} | {spread:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
