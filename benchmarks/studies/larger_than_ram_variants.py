"""One change at a time under larger_than_ram.py's memory limit: environment variants.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: Under a memory cgroup ``read()`` gives tf.data a RAM budget of a quarter of
the limit (tfshards/readers/memory_limits.py); the malloc-arena cap; a cache larger than
half the usable memory is read 4 parts at a time.
Run: 2026-12-03 and 2026-12-04. Recorded result: 512x512 RGB float32 streaming under 1.5
GiB went from 0.58-0.73x the bare read (glibc's arenas) to 0.79-0.83x (the cap), and
cached float32, killed before the RAM budget, finished; tables in benchmarks/README.md,
"Larger than RAM".
Raw output: benchmarks/results/larger_than_ram.md.

    python benchmarks/studies/larger_than_ram_variants.py \
        --variants "arena2=MALLOC_ARENA_MAX:2,default=" \
        --pipelines bare,stream-float32 --epochs 3

Each variant is ``name=VAR:VALUE;VAR2:VALUE2`` (empty: the environment as it is). For
each, the variables are set in this process, whose children inherit them, and the
named pipelines (``bare``, ``stream-uint8``, ``stream-float32``, ``cached-uint8``,
``cached-float32``) run as in ``larger_than_ram.py``: a fresh child each, in its own
memory cgroup, on the 512x512 RGB raw shards that script prepares (run it once
first). The "encoding" column carries the variant's name; vs_bare compares with that
variant's own bare rows where it has them. Code changes were compared the same way,
through temporary switches read from an environment variable.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import _benchmarks_path  # noqa: F401  (benchmarks/ on sys.path)
import larger_than_ram as bench
from _common import markdown_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/tfshards-bench-22"))
    parser.add_argument("--variants", default="default=", help="name=VAR:VALUE;...,...")
    parser.add_argument("--pipelines", default="bare,stream-uint8,stream-float32")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--limit-mib", type=int, default=1536)
    args = parser.parse_args()
    folder = args.root / "rgb512"
    if not (folder / "raw" / "tfshards.json").exists():
        raise SystemExit(f"{folder / 'raw'}: no shards; run larger_than_ram.py first")
    cgroup = bench.MemoryCgroup(args.limit_mib * 2**20)
    side, channels, batch = bench.CASES["rgb512"]
    base = {"case": "rgb512", "side": side, "channels": channels, "batch": batch,
            "bfc": "false", "encoding": "raw", "shards": str(folder / "raw"),
            "epochs": args.epochs}  # fmt: skip
    rows: list[dict] = []
    for variant in args.variants.split(","):
        name, _, settings = variant.partition("=")
        saved = dict(os.environ)
        for setting in filter(None, settings.split(";")):
            key, _, value = setting.partition(":")
            os.environ[key] = value
        for pipeline in args.pipelines.split(","):
            kind, _, dtype = pipeline.partition("-")
            job = {**base, "pipeline": kind, "dtype": dtype or "bytes",
                   "bfc": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "false")}  # fmt: skip
            got = bench.run_child(job, folder, cgroup, args)
            for row in got:
                row["encoding"] = name or "default"
            rows += got
            bench.add_ratios(rows)
            print(markdown_table(got), flush=True)
        os.environ.clear()
        os.environ.update(saved)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
