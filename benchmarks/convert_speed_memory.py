"""Conversion rate against `cp -r` of the same files, and peak RSS at 1x and 4x the data.

    python benchmarks/convert_speed_memory.py --count 500 --size 256

Prints a Markdown table. Peak RSS is measured in a fresh process per run: the
main process and the largest worker. If it does not grow from 1x to 4x, memory
is bounded by shards in flight, not by the dataset.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from _common import markdown_table, peak_rss_of

from tfshards.converters.synth import synth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="pairs at 1x (default 500)")
    parser.add_argument("--size", type=int, default=256, help="image side (default 256)")
    parser.add_argument(
        "--encodings", default="deflate,keep,raw", help="comma list (default deflate,keep,raw)"
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfshards-bench-") as tmp:
        for scale in (1, 4):
            data = Path(tmp) / f"data{scale}"
            synth(data, count=args.count * scale, size=args.size, seed=scale)
            source_bytes = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
            started = time.perf_counter()
            subprocess.run(["cp", "-r", str(data), str(Path(tmp) / f"copy{scale}")], check=True)
            copy_seconds = time.perf_counter() - started
            shutil.rmtree(Path(tmp) / f"copy{scale}")
            for encoding in args.encodings.split(","):
                out = Path(tmp) / f"out{scale}-{encoding}"
                result = peak_rss_of(
                    "import resource, time, tfshards\n"
                    "def cpu():  # this process and its (finished) worker processes\n"
                    "    own, kids = (resource.getrusage(w) for w in "
                    "(resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))\n"
                    "    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime\n"
                    "t, c = time.perf_counter(), cpu()\n"
                    f"m = tfshards.convert({str(data / 'images')!r}, {str(data / 'masks')!r}, "
                    f"{str(out)!r}, encoding={encoding!r}, workers={args.workers}, "
                    "progress=False)\n"
                    "RESULT = {'seconds': time.perf_counter() - t, 'cpu': cpu() - c, "
                    "'shard_bytes': sum(s.bytes for sp in m.splits.values() for s in sp.shards)}"
                )
                rows.append(
                    {
                        "scale": f"{scale}x",
                        "pairs": args.count * scale,
                        "encoding": encoding,
                        "convert_s": round(result["seconds"], 2),
                        "pairs_per_s": round(args.count * scale / result["seconds"]),
                        "cpu_ms_per_pair": round(1000 * result["cpu"] / (args.count * scale), 2),
                        "cp_r_s": round(copy_seconds, 2),
                        "time_vs_cp_r": round(result["seconds"] / copy_seconds, 1),
                        "source_MiB": round(source_bytes / 2**20, 1),
                        "shards_MiB": round(result["shard_bytes"] / 2**20, 1),
                        "peak_rss_main_MiB": result["peak_rss_mib"],
                        "peak_rss_worker_MiB": result["peak_child_rss_mib"],
                    }
                )
                shutil.rmtree(out)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
