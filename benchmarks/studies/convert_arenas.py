"""`tfshards convert` as a fresh process with glibc's malloc arenas against tfshards' cap.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: ``import tfshards`` caps glibc's malloc arenas at two in the converter too
(tfshards/malloc_arenas.py).
Run: 2026-12-04. Recorded result: the capped conversion ran at 0.97x and 1.01x glibc's
pairs/s, within the run-to-run spread.
Raw output: results/allocator_choice.md (last section).

    python benchmarks/studies/convert_arenas.py --count 2000 --size 256 --repeats 4

"glibc" runs with MALLOC_ARENA_MAX=16 (glibc's default on 2 cores, 8 per core); "cap"
leaves it unset, so `import tfshards` caps the arenas at two in the CLI and its workers.
The two alternate, swapping which goes first each repeat. Per pass: pairs/s of the whole
command and CPU ms per pair of it and its workers (getrusage of the children).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _benchmarks_path  # noqa: F401  (benchmarks/ on sys.path)
from _common import markdown_table

CLI = [sys.executable, "-m", "tfshards.cli"]


def one_pass(data: Path, out: Path, count: int, arenas: str | None) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if arenas:
        env["MALLOC_ARENA_MAX"] = arenas
    shutil.rmtree(out, ignore_errors=True)
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([*CLI, "convert", "--images", str(data / "images"), "--masks",
                    str(data / "masks"), "--out", str(out)],
                   check=True, capture_output=True, env=env)  # fmt: skip
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return count / wall, 1000 * cpu / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    settings = {"glibc": "16", "cap": None}
    passes: dict[str, list[tuple[float, float]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory(prefix="tfshards-arenas-") as tmp:
        data = Path(tmp) / "data"
        subprocess.run([*CLI, "synth", str(data), "--count", str(args.count), "--size",
                        str(args.size)], check=True, capture_output=True)  # fmt: skip
        for repeat in range(args.repeats):
            order = list(settings) if repeat % 2 == 0 else list(settings)[::-1]
            for name in order:
                passes[name].append(one_pass(data, Path(tmp) / "out", args.count, settings[name]))
    rows = [{
        "arenas": name,
        "pairs_per_s": round(statistics.median(p[0] for p in got)),
        "passes": ", ".join(f"{p[0]:.0f}" for p in got),
        "cpu_ms_per_pair": round(statistics.median(p[1] for p in got), 3),
        "cpu_passes": ", ".join(f"{p[1]:.2f}" for p in got),
    } for name, got in passes.items()]  # fmt: skip
    print(f"{args.count} pairs {args.size}x{args.size} RGB, default conversion, median of "
          f"{args.repeats} alternating passes")  # fmt: skip
    print(markdown_table(rows))
    print(f"cap / glibc pairs/s: {rows[1]['pairs_per_s'] / rows[0]['pairs_per_s']:.2f}")


if __name__ == "__main__":
    main()
