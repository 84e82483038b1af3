"""ISA-L's levels against zlib: CPU per pair, size, and whether the bytes are reproducible.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: ISA-L level 3 for every zlib level 1-9 (reproducible bytes at 3-5% of a
conversion's pairs/s).
Run: 2026-12-04. Recorded result: deviating processes out of 150: 6 and 0 at ISA-L level
1 (two runs), 1 and 1 at level 2, 0 and 0 at level 3; levels 1-2 cost 0.62-0.69 ms per
256x256 RGB pair against level 3's 0.85 and zlib level 1's 4.0.
Raw output: results/deflate_levels.md.

    python benchmarks/studies/deflate_levels.py --count 200 --size 256 --processes 150

Speed: every image and mask of ``tfshards synth`` pairs compressed in this process, one
library/level at a time, median of --passes (the passes listed). Reproducibility: for
each library/level, --processes fresh Python processes (two at a time) compress small
pairs (the test suite's size, 24x32) in four threads, --rounds times over. Each
input's reference stream is the one most processes wrote (so a parent or child that
deviates cannot set it); a process counts as deviating when any of its streams differs,
and "inputs with other bytes" sums, over processes, the inputs that did. The streams
all inflate to the same pixels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import _benchmarks_path  # noqa: F401  (benchmarks/ on sys.path)
import numpy as np
from _common import markdown_table, synthetic_pixels
from isal import isal_zlib

COMPRESSORS = {
    "zlib 1": lambda data: zlib.compress(data, 1),
    "ISA-L 1": lambda data: isal_zlib.compress(data, 1),
    "ISA-L 2": lambda data: isal_zlib.compress(data, 2),
    "ISA-L 3": lambda data: isal_zlib.compress(data, 3),
}
THREADS = 4


def speed(arrays: list[np.ndarray], passes: int) -> dict[str, tuple[list[float], float]]:
    """Per compressor: CPU ms per pair of each pass, and compressed / raw bytes."""
    raw = sum(a.nbytes for a in arrays)
    found: dict[str, tuple[list[float], float]] = {name: ([], 0.0) for name in COMPRESSORS}
    for _ in range(passes):
        for name, compress in COMPRESSORS.items():
            started = time.process_time()
            size = sum(len(compress(a)) for a in arrays)
            ms = 1000 * (time.process_time() - started) / (len(arrays) / 2)
            found[name][0].append(ms)
            found[name] = (found[name][0], size / raw)
    return found


def compress_in_threads(arrays: list[np.ndarray], name: str, rounds: int) -> list[str]:
    """Per array: the sorted digests of its streams over ``rounds`` compressions in
    THREADS threads, joined (one digest when every round wrote the same bytes)."""
    compress = COMPRESSORS[name]
    digests: list[set[str]] = [set() for _ in arrays]

    def work(first: int) -> None:
        for _ in range(rounds):
            for index in range(first, len(arrays), THREADS):
                digests[index].add(hashlib.sha256(compress(arrays[index])).hexdigest())

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [",".join(sorted(found)) for found in digests]


def child(job: Path, name: str, rounds: int) -> None:
    arrays = pickle.loads(job.read_bytes())
    print(json.dumps(compress_in_threads(arrays, name, rounds)))


def run_children(job: Path, name: str, processes: int, rounds: int) -> list[list[str]]:
    found: list[list[str]] = []
    for start in range(0, processes, 2):
        command = [sys.executable, __file__, "--child", str(job), name, str(rounds)]
        running = [
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(min(2, processes - start))
        ]
        for process in running:
            out, err = process.communicate()
            if process.returncode != 0:
                raise SystemExit(f"a child compressing with {name} failed:\n{err}")
            found.append(json.loads(out))
    return found


def reproducibility(arrays: list[np.ndarray], processes: int, rounds: int, tmp: Path) -> dict:
    """Per compressor: (processes with any stream other than the majority's, the inputs
    with other bytes summed over processes)."""
    job = tmp / "job.pickle"
    job.write_bytes(pickle.dumps(arrays))
    found = {}
    for name in COMPRESSORS:
        per_process = run_children(job, name, processes, rounds)
        columns = zip(*per_process, strict=True)
        majority = [Counter(column).most_common(1)[0][0] for column in columns]
        other = [sum(a != b for a, b in zip(row, majority, strict=True)) for row in per_process]
        found[name] = (sum(count > 0 for count in other), sum(other))
    return found


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="pairs for speed (default 200)")
    parser.add_argument("--size", type=int, default=256, help="their side (default 256)")
    parser.add_argument("--passes", type=int, default=5, help="speed passes (default 5)")
    parser.add_argument("--processes", type=int, default=150, help="per level (default 150)")
    parser.add_argument("--rounds", type=int, default=30, help="per process (default 30)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfshards-levels-") as tmp:
        timed = speed(synthetic_pixels(args.count, args.size), args.passes)
        small = synthetic_pixels(240, (24, 32))
        repeated = reproducibility(small, args.processes, args.rounds, Path(tmp))
    rows = [
        {
            "compressor": name,
            "cpu_ms_per_pair": round(statistics.median(timed[name][0]), 3),
            "passes": ", ".join(f"{ms:.2f}" for ms in timed[name][0]),
            "bytes_of_raw": round(timed[name][1], 4),
            "processes_with_other_bytes": f"{repeated[name][0]} of {args.processes}",
            "inputs_with_other_bytes": repeated[name][1],
        }
        for name in COMPRESSORS
    ]
    print(
        f"speed: {args.count} pairs {args.size}x{args.size} RGB (image + mask), median of "
        f"{args.passes}; reproducibility: {len(small) // 2} pairs 24x32 in {THREADS} threads "
        f"x {args.rounds} rounds per process"
    )
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
