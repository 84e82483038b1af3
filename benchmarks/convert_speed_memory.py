"""Conversion CPU per stage against the decode bound, scaling 1 -> 2 workers, and memory.

Compares: each conversion stage's CPU against Pillow's decode of the same files, and
whole conversions on 1 and 2 cores (optionally against another version, and peak RSS at
1x and 4x the data); with --plan instead, listing + pairing time and the plan's bytes
per pair at 100,000 and 1,000,000 pairs, optionally against another version.
Takes: about 10 minutes at --count 600 on 2 cores (the 1 -> 2 worker rows alone took 4
minutes); --memory adds a few more. --plan: a few minutes for --pairs 100000,1000000
listed from memory; --tree first writes two million empty files.

    python benchmarks/convert_speed_memory.py --count 600 --size 256
    python benchmarks/convert_speed_memory.py --before /tmp/old-tfshards   # side by side
    python benchmarks/convert_speed_memory.py --memory    # also peak RSS at 1x and 4x
    python benchmarks/convert_speed_memory.py --plan --pairs 100000,1000000
    python benchmarks/convert_speed_memory.py --plan --pairs 100000 --tree  # empty files in /tmp
    python benchmarks/convert_speed_memory.py --plan --before /tmp/old-tfshards

Prints Markdown tables, on PNG sources and on JPEG photo sources (both synthetic):

1. CPU ms per pair of each stage of the default conversion, timed one stage at a time
   in this process with the functions the converter calls (read bytes, decode, EXIF and
   mode handling, mask checks, record encoding, compression with zlib and with ISA-L,
   sha256, write), and the end-to-end CPU of an in-process conversion (``workers=1``)
   for ``deflate`` and ``keep``. The bound is Pillow's decode of the same files alone.
2. Wall time, pairs/s and CPU ms per pair (all processes) of ``tfshards.convert`` in a
   fresh process pinned to 1 and to 2 cores (``os.sched_setaffinity``) with as many
   workers, for this checkout and, with ``--before``, another version, alternating.

With ``--plan``, only the plan's table (``_plan_memory.py``): listing, pairing, splits
and the key shuffle of --pairs names, each size in a fresh process, listed from memory
or (``--tree``) from a tree of empty files.

Page cache: warm (every source file is read once before timing).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import markdown_table, peak_rss_of
from _plan_memory import plan_rows
from PIL import Image

from tfshards.converters.image_stats import ChannelSums
from tfshards.converters.options import ConvertOptions
from tfshards.converters.pair_table import Pair
from tfshards.converters.synth import synth
from tfshards.converters.validation import _decoded, _image_pixels, _mask_pixels
from tfshards.schemas import deflate
from tfshards.schemas.format import image_encoding
from tfshards.schemas.record import EncodedPair
from tfshards.schemas.record_table import record_row
from tfshards.schemas.tfrecord import frame_record

_REPEATS = 3


def _stage_times(pairs: list[Pair], work: Path) -> dict[str, float]:
    """CPU seconds of each stage over all pairs (one pass)."""
    options = ConvertOptions().resolved(3)
    encoding = image_encoding(options.encoding)
    spent: dict[str, float] = {}

    def timed(stage: str, function, items):
        started = time.process_time()
        out = [function(item) for item in items]
        spent[stage] = time.process_time() - started
        return out

    data = timed("read bytes", lambda p: (p.image.read_bytes(), p.mask.read_bytes()), pairs)

    def decode(item):
        image, mask = (Image.open(io.BytesIO(d)) for d in item)
        image.load(), mask.load()
        return image, mask

    opened = timed("decode (the bound)", decode, data)
    timed(
        "EXIF check", lambda im: (im[0].getexif().get(0x0112), im[1].getexif().get(0x0112)), opened
    )
    pixels = timed(
        "mode to pixels", lambda im: _image_pixels(pairs[0], _decoded(im[0]), 3, "uint8")[0], opened
    )

    def mask_checks(item):
        values = _mask_pixels(pairs[0], _decoded(item[1]), options)[0]
        np.bincount(values.ravel(), minlength=256)
        return values

    masks = timed("mask checks + class counts", mask_checks, opened)
    timed("per-record table row", lambda m: record_row("k", m, None), masks)
    timed("channel statistics", ChannelSums().add, pixels)
    for backend, module in (("zlib", None), ("ISA-L", deflate.isal_zlib)):
        if backend == "ISA-L" and module is None:
            continue
        saved, deflate.isal_zlib = deflate.isal_zlib, module
        try:
            streams = timed(
                f"compress ({backend})",
                lambda i: (encoding.encode(pixels[i], None)[0], encoding.encode(masks[i], None)[0]),
                range(len(pairs)),
            )
        finally:
            deflate.isal_zlib = saved
    records = timed(
        "encode record + frame",
        lambda i: frame_record(
            EncodedPair(
                "k", streams[i][0], "deflate", 256, 256, 3, streams[i][1], "deflate"
            ).to_example()
        ),
        range(len(pairs)),
    )
    digest = hashlib.sha256()
    timed("sha256", digest.update, records)
    with open(work / "stage.tfrecord", "wb") as out:
        timed("write", out.write, records)
        started = time.process_time()
        out.flush(), os.fsync(out.fileno())
        spent["write"] += time.process_time() - started
    return spent


def _in_process_cpu(images: Path, masks: Path, out: Path, encoding: str) -> float:
    import tfshards

    started = time.process_time()
    tfshards.convert(images, masks, out, encoding=encoding, workers=1, progress=False)
    seconds = time.process_time() - started
    shutil.rmtree(out)
    return seconds


def profile(data: Path, work: Path, source: str, count: int) -> list[dict]:
    """Rows: each stage's median CPU ms per pair, then end-to-end and ratios."""
    images, masks = data / "images", data / "masks"
    pairs = [
        Pair(p.stem, p, masks / f"{p.stem}.png") for p in sorted(images.iterdir()) if p.is_file()
    ]
    runs = [_stage_times(pairs, work) for _ in range(_REPEATS)]
    end_to_end = {
        e: [_in_process_cpu(images, masks, work / "out", e) for _ in range(_REPEATS)]
        for e in ("deflate", "keep")
    }
    ms = {stage: 1000 * statistics.median(r[stage] for r in runs) / count for stage in runs[0]}
    bound = ms["decode (the bound)"]
    rows = [
        _row(source, stage, value, [r[stage] for r in runs], count, bound)
        for stage, value in ms.items()
    ]
    for encoding, seconds in end_to_end.items():
        rows.append(
            _row(
                source,
                f"end to end, {encoding}, 1 worker",
                1000 * statistics.median(seconds) / count,
                seconds,
                count,
                bound,
            )
        )
    keep = statistics.median(end_to_end["keep"])
    rows[-2]["note"] = f"{statistics.median(end_to_end['deflate']) / keep:.2f}x keep"
    return rows


def _row(
    source: str, stage: str, value: float, seconds: list[float], count: int, bound: float
) -> dict:
    spread = [round(1000 * s / count, 2) for s in sorted(seconds)]
    return {
        "source": source,
        "stage": stage,
        "cpu_ms_per_pair": round(value, 3),
        "runs": " ".join(map(str, spread)),
        "vs_bound": round(value / bound, 2),
        "note": "",
    }


_CHILD = r"""
import json, os, resource, sys, time
workers = int(sys.argv[4])
os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:workers]))
import tfshards
def cpu():
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
t, c = time.perf_counter(), cpu()
m = tfshards.convert(sys.argv[1], sys.argv[2], sys.argv[3], encoding=sys.argv[5],
                     workers=workers, progress=False)
print("RESULT " + json.dumps({"seconds": time.perf_counter() - t, "cpu": cpu() - c,
    "pairs": m.total_records}))
"""


def _pinned_convert(src: Path, data: Path, out: Path, workers: int, encoding: str) -> dict:
    args = [str(data / "images"), str(data / "masks"), str(out), str(workers), encoding]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(src)),
        cwd=data,  # not the checkout: -c puts the working folder first on sys.path
        check=False,
    )
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def scaling(sources: dict[str, Path], data: Path, work: Path, source: str, encodings) -> list[dict]:
    """Rows: pairs/s and CPU ms per pair with 1 and 2 pinned cores, versions alternating."""
    got: dict[tuple, list[dict]] = {}
    for _ in range(_REPEATS):
        for encoding in encodings:
            for workers in (1, 2):
                for name, src in sources.items():
                    result = _pinned_convert(src, data, work / "out", workers, encoding)
                    got.setdefault((name, encoding, workers), []).append(result)
    rows = []
    for (name, encoding, workers), results in got.items():
        rates = sorted(r["pairs"] / r["seconds"] for r in results)
        cpu = statistics.median(1000 * r["cpu"] / r["pairs"] for r in results)
        one = statistics.median(r["pairs"] / r["seconds"] for r in got[(name, encoding, 1)])
        rows.append(
            {
                "source": source,
                "version": name,
                "encoding": encoding,
                "cores = workers": workers,
                "pairs_per_s": round(statistics.median(rates)),
                "runs": " ".join(str(round(r)) for r in rates),
                "cpu_ms_per_pair": round(cpu, 2),
                "vs_1_worker": round(statistics.median(rates) / one, 2),
            }
        )
    return rows


def memory(work: Path, count: int, size: int, encodings: list[str]) -> list[dict]:
    """Peak RSS of a conversion at 1x and 4x the data (fresh process each)."""
    rows = []
    for scale in (1, 4):
        data = work / f"mem{scale}"
        synth(data, count=count * scale, size=size, seed=scale)
        for encoding in encodings:
            out = work / f"mem-out{scale}-{encoding}"
            result = peak_rss_of(
                "import tfshards\n"
                f"tfshards.convert({str(data / 'images')!r}, {str(data / 'masks')!r}, "
                f"{str(out)!r}, encoding={encoding!r}, workers=2, progress=False)\n"
                "RESULT = {}"
            )
            rows.append(
                {
                    "pairs": count * scale,
                    "encoding": encoding,
                    "peak_rss_main_MiB": result["peak_rss_mib"],
                    "peak_rss_worker_MiB": result["peak_child_rss_mib"],
                }
            )
            shutil.rmtree(out)
        shutil.rmtree(data)
    return rows


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=600, help="pairs per source (default 600)")
    parser.add_argument("--size", type=int, default=256, help="image side (default 256)")
    parser.add_argument("--before", type=Path, help="another tfshards checkout to compare")
    parser.add_argument("--encodings", default="deflate,keep", help="for the scaling table")
    parser.add_argument(
        "--scaling-count",
        type=int,
        help="pairs per source for the 1 -> 2 workers table (default: --count); the "
        "workers' start-up weighs less on more pairs",
    )
    parser.add_argument("--memory", action="store_true", help="also peak RSS at 1x and 4x")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="instead of the conversion tables: the plan's listing + pairing time and bytes "
        "per pair at --pairs (with --before: side by side)",
    )
    parser.add_argument(
        "--pairs", default="100000,1000000", help="--plan: comma list of pair counts"
    )
    parser.add_argument("--tree", action="store_true", help="--plan: list real empty files in /tmp")
    args = parser.parse_args()
    if args.tree and not args.plan:
        parser.error("--tree goes with --plan")
    return args


def main() -> None:
    args = _arguments()
    sources = {"this": Path(__file__).resolve().parents[1]}
    if args.before:
        sources = {"before": args.before.resolve(), **sources}
    if args.plan:
        counts = [int(c) for c in args.pairs.split(",")]
        print(markdown_table(plan_rows(sources, counts, args.tree)))
        return
    print(f"deflate backend: {deflate.BACKEND}; {os.cpu_count()} cores; warm page cache\n")
    stages, scaled = [], []
    with tempfile.TemporaryDirectory(prefix="tfshards-bench-") as tmp:
        work = Path(tmp)
        for source, image_format in (("PNG", "png"), ("JPEG photo", "jpeg")):
            data = work / image_format
            synth(data, count=args.count, size=args.size, seed=7, image_format=image_format)
            stages += profile(data, work, source, args.count)
            if args.scaling_count and args.scaling_count != args.count:
                data = work / f"{image_format}-{args.scaling_count}"
                synth(data, count=args.scaling_count, size=args.size, seed=7,
                      image_format=image_format)  # fmt: skip
            scaled += scaling(sources, data, work, source, args.encodings.split(","))
        print(markdown_table(stages) + "\n\n" + markdown_table(scaled))
        if args.memory:
            print("\n" + markdown_table(memory(work, args.count, args.size, ["deflate", "keep"])))


if __name__ == "__main__":
    main()
