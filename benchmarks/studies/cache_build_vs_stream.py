"""A cache-building first epoch against streaming the same read, tfshards trees side by
side.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: flush a building disk cache in a background thread every 64 MiB written
(readers/cache/store.py ``Flusher``), so the fsync before publishing waits for the last
bytes only; batches written outside the store's lock and ``sync_file_range`` under it
were tried and measured no faster.
Run: 2026-12-05. Recorded result: deflate uint8, 2,000 pairs of 256x256, the build ran
0.73x its stream at +0.111 ms CPU per pair before, 0.82x at +0.109 to +0.113 ms after
(two runs of 4 rounds); raw uint8 0.60x at +0.086 ms before, 0.72x at +0.103 ms after.
Raw output: benchmarks/README.md, "Caches that live with their dataset".
Since 2026-12-06 the write-behind is kept for builds larger than a tenth of memory or
2 GiB only (``flushed_while_built``); this study, 8 rounds, backs that too (benchmarks/
README.md, "A small cache build left to the page cache").

    python benchmarks/studies/cache_build_vs_stream.py SHARDS --trees before=/tree/a,after=.

Each tree runs in its own process per round (trees alternating, first tree first on even
rounds): one untimed stream epoch, then twice a build into a fresh cache folder and a
stream of the same read, each after ``os.sync()`` and a 1 s pause and timed to its last
batch (the iterator's deletion, which can wait for TensorFlow's autotuning thread, is
left out). Prints per tree the median pairs/s with its spread and the CPU ms per pair of
builds and streams, and the build's ratio and CPU difference to its stream.
Takes: about 1 minute per round at 2,000 pairs of 256x256.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

EPOCHS = r"""
import json, os, resource, shutil, sys, time
import tfshards

path, dtype, cache = sys.argv[1], sys.argv[2], sys.argv[3]


def epoch(**cached):
    os.sync()
    time.sleep(1)
    started, count = time.perf_counter(), 0
    before = resource.getrusage(resource.RUSAGE_SELF)
    for image, _ in tfshards.read(path, seed=0, image_dtype=dtype, **cached):
        count += int(image.shape[0])
        after, seconds = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"pairs_per_s": count / seconds, "cpu_ms": 1000 * cpu / count}


epoch()
passes = {"build": [], "stream": []}
for _ in range(2):
    shutil.rmtree(cache, ignore_errors=True)
    passes["build"].append(epoch(cache=cache))
    passes["stream"].append(epoch())
shutil.rmtree(cache, ignore_errors=True)
print("RESULT", json.dumps(passes))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="a converted dataset (raw or deflate, one size)")
    parser.add_argument("--trees", default="this=.", help="name=path,... (default this=.)")
    parser.add_argument("--dtype", default="uint8", choices=("uint8", "float32"))
    parser.add_argument("--rounds", type=int, default=4, help="processes per tree (default 4)")
    args = parser.parse_args()
    trees = dict(pair.split("=", 1) for pair in args.trees.split(","))
    passes = {name: {"build": [], "stream": []} for name in trees}
    with tempfile.TemporaryDirectory(prefix="tfshards-build-study-") as scratch:
        for round_ in range(args.rounds):
            order = list(trees.items()) if round_ % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                for kind, rows in one_process(tree, args, f"{scratch}/cache").items():
                    passes[name][kind] += rows
    for name, kinds in passes.items():
        report(name, kinds)


def one_process(tree: str, args: argparse.Namespace, cache: str) -> dict[str, list[dict]]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", EPOCHS, args.shards, args.dtype, cache],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{tree}: the epochs failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[0].removeprefix("RESULT "))


def report(name: str, kinds: dict[str, list[dict]]) -> None:
    medians = {}
    for kind, rows in kinds.items():
        rates = [row["pairs_per_s"] for row in rows]
        cpu = statistics.median(row["cpu_ms"] for row in rows)
        rate = statistics.median(rates)
        medians[kind] = rate, cpu
        spread = (max(rates) - min(rates)) / rate
        print(f"{name} {kind}: {rate:.0f} pairs/s (spread {spread:.2f}), {cpu:.3f} ms CPU/pair")
    (build, build_cpu), (stream, stream_cpu) = medians["build"], medians["stream"]
    print(f"{name} build/stream: {build / stream:.2f}x, CPU {build_cpu - stream_cpu:+.3f} ms/pair")


if __name__ == "__main__":
    main()
