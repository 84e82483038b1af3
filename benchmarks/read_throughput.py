"""Reading throughput: tfshards.read against the hand-written Keras pipeline and against the
measured bound of each path, same data, one run.

Compares: tfshards.read (streaming per encoding, and cache=True) against the
hand-written Keras pipeline and each path's measured bound, side by side on one dataset.
Takes: about 15-25 minutes at --count 2000 on 2 cores with the 1-core/2-core and RSS
rows (a run with --reuse --no-scaling --no-rss --repeats 3 took about 4 minutes).

    python benchmarks/read_throughput.py --count 2000 --size 256

Every row: median pairs/s of --repeats passes (after a warm-up pass), the spread
((max - min) / median), process CPU ms per pair (steadier than wall time on a shared
machine), the ratio to the hand-written first epoch, and the ratio to the row's bound.

Baselines: the hand-written pipeline (two keras.utils.image_dataset_from_directory
zipped, shuffle(1000), .cache(file), batch 32, float32): its first epoch (a fresh cache
file each pass) and an epoch read from its disk cache.
Bounds (no shuffle, no cache, the least work that yields the same output):
  bare TFRecordDataset over the raw shards (bytes only); raw read+decode[+cast];
  deflate read+inflate[+cast]; the built disk cache read[+cast].
tfshards rows: the README path (default conversion, cache=True, float32): first epoch (a
fresh cache each pass; also deflate uint8 and raw uint8 / float32, the build_* rows,
each against streaming the same read, and bound_cache_write: the same bytes written to
fresh files with plain os.pwrite calls and an fsync, what the kernel's side of a build
costs on this machine: its CPU per pair is the least a build can add to streaming; every
writing pass, the hand-written first epoch's included, starts after an os.sync() and a
pause, see FRESH_PAGES_PAUSE_S) and
warm epochs (uint8 / float32, and float32 through a Keras flip + rotation + zoom chain);
raw and deflate streams (uint8 / float32); keep (PNG here), jpeg and raw+gzip streams
(float32). Then bytes on disk per encoding, the speed-up from 1 core to 2 (child
processes pinned with os.sched_setaffinity before TensorFlow starts), and peak RSS at 1x
and 4x the data. The OS page cache is warm for every row (the files were just written or
read).
After the targets, each build's ratio to its stream if CPU alone limited both (its
stream's CPU per pair against that plus bound_cache_write's) beside the measured one.

With ``--sizing-against REV`` only crops and pads run: records of ten sizes from 300 to
700 px a side (--count synth pairs, default conversion), cropped to 256x256 (also with
crop_scale, and from a memory cache), padded to 704x704, and at native size in batches
of one, each row in a fresh process for this checkout and for the tfshards of git
revision REV, in --repeats rounds alternating which goes first: pairs/s and CPU ms per
pair (process time) of one epoch after a warm-up epoch, medians and min-max spreads,
and the ratios here / REV. --count 200 --repeats 3 took about 8 minutes on 2 cores.

    python benchmarks/read_throughput.py --sizing-against b9613ae --count 200 --reuse /tmp/sz"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import markdown_table, peak_rss_of

BATCH = 32
# (name, encoding, compression) of each conversion measured.
CONVERSIONS = [
    ("deflate", "deflate", "auto"),
    ("keep", "keep", "auto"),
    ("raw", "raw", "none"),
    ("raw_gzip", "raw", "gzip"),
    ("jpeg", "jpeg", "auto"),
]
# (row, conversion, image dtype) of the cache-building first epochs beside the README
# path's (deflate, float32), each compared with streaming the same read without a cache.
BUILD_ROWS = [
    ("build_deflate_uint8", "deflate", "uint8"),
    ("build_raw_uint8", "raw", "uint8"),
    ("build_raw_float32", "raw", "float32"),
]
# Writes that grow the page cache into memory this VM's guest has not used before cost
# about 2.6 s of kernel time per GiB more (its host backs a page on first touch): after
# the hand-written pipeline's three 1.7 GB cache files, a cache build paid 0.6-0.7 ms more
# per pair. So no row keeps what it wrote: each pass's cache files are deleted after it,
# and every pass that writes (the hand-written first epoch's, the builds, their bound)
# starts after an os.sync() (no earlier writer's dirty pages) and this pause, alike.
FRESH_PAGES_PAUSE_S = 3.0
SCALING_ROWS = ("raw_stream_uint8", "deflate_stream_uint8", "warm_uint8", "warm_float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="pairs (default 2000)")
    parser.add_argument("--size", type=int, default=256, help="image side (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per row (default 3)")
    parser.add_argument("--rss-count", type=int, default=1200, help="pairs at 1x for RSS")
    parser.add_argument("--no-scaling", action="store_true", help="skip the 1-vs-2-core runs")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS runs")
    parser.add_argument(
        "--reuse",
        type=Path,
        help="keep the generated data and conversions in this folder and reuse them if "
        "present (for before/after runs of two checkouts over the same data: run this "
        "script with PYTHONPATH pointing at each checkout in turn)",
    )
    parser.add_argument(
        "--json", type=Path, help="also write every row's passes (pairs/s, CPU ms/pair) here"
    )
    parser.add_argument(
        "--sizing-against",
        metavar="REV",
        help="only the crop/pad rows (records of mixed sizes), for this checkout and the "
        "tfshards of git revision REV side by side, in --repeats alternating rounds",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # ROW:ROOT:CORES, for scaling
    parser.add_argument("--sizing-child", help=argparse.SUPPRESS)  # JSON job, see sizing_child
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.sizing_child:
        return sizing_child(json.loads(args.sizing_child))
    if args.sizing_against:
        return sizing_against(args)
    if args.reuse:
        args.reuse.mkdir(parents=True, exist_ok=True)
        return run(args.reuse, args)
    with tempfile.TemporaryDirectory(prefix="tfshards-read-bench-") as tmp:
        run(Path(tmp), args)


def run(tmp: Path, args: argparse.Namespace) -> None:
    import tfshards

    if not (tmp / "data").is_dir():
        tfshards.synth(tmp / "data", count=args.count, size=args.size, seed=0)
    for name, encoding, compression in CONVERSIONS:
        if not (tmp / name / "tfshards.json").is_file():
            tfshards.convert(
                tmp / "data" / "images",
                tmp / "data" / "masks",
                tmp / name,
                encoding=encoding,
                compression=compression,
                progress=False,
            )
    from tfshards.schemas.format import CACHE_DIR_NAME

    for stale in (*tmp.glob("*cache*"), *(tmp / n / CACHE_DIR_NAME for n, _, _ in CONVERSIONS)):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(True)
    rows = with_bare_read_ratio(measure_rows(tmp, args))
    if args.json:
        args.json.write_text(json.dumps({"tfshards": tfshards.__file__, "passes": PASSES}))
    print(
        f"tfshards from {Path(tfshards.__file__).parent.parent}; {args.count} pairs, "
        f"{args.size}x{args.size} RGB + 1-channel masks, batch {BATCH}, page cache warm, "
        f"{os.cpu_count()} cores; median of {args.repeats} passes"
    )
    print(markdown_table(rows))
    print()
    print(markdown_table(target_rows({r["pipeline"]: r for r in rows})))
    print()
    print(markdown_table(build_bound_rows({r["pipeline"]: r for r in rows})))
    print()
    print(markdown_table(disk_rows(tmp, {r["pipeline"]: r for r in rows})))
    if not args.no_scaling:
        print()
        print(markdown_table(scaling_rows(tmp, args)))
    if not args.no_rss:
        print()
        print(markdown_table(rss_rows(tmp, args)))


def datasets(tmp: Path, name: str):
    """The dataset of one named row (shared by the main run and the pinned children)."""
    import tfshards
    from tfshards.benchmarking.baselines import (
        bound_pipeline,
        cache_bound_pipeline,
        ceiling_pipeline,
    )

    cache = tmp / "cache"
    read = {
        "warm_uint8": lambda: tfshards.read(tmp / "deflate", cache=cache, image_dtype="uint8"),
        "warm_float32": lambda: tfshards.read(tmp / "deflate", cache=cache),
        "warm_float32_keras_augment": lambda: tfshards.read(
            tmp / "deflate", cache=cache, augment=augmentation()
        ),
        "bound_cache_uint8": lambda: _cache_bound(cache_bound_pipeline, cache, cast=False),
        "bound_cache_float32": lambda: _cache_bound(cache_bound_pipeline, cache, cast=True),
        "ceiling_tfrecord_raw": lambda: ceiling_pipeline(tmp / "raw"),
        "bound_raw_uint8": lambda: bound_pipeline(tmp / "raw", cast=False),
        "bound_raw_float32": lambda: bound_pipeline(tmp / "raw", cast=True),
        "raw_stream_uint8": lambda: tfshards.read(tmp / "raw", image_dtype="uint8"),
        "raw_stream_float32": lambda: tfshards.read(tmp / "raw"),
        "bound_deflate_uint8": lambda: bound_pipeline(tmp / "deflate", cast=False),
        "bound_deflate_float32": lambda: bound_pipeline(tmp / "deflate", cast=True),
        "deflate_stream_uint8": lambda: tfshards.read(tmp / "deflate", image_dtype="uint8"),
        "deflate_stream_float32": lambda: tfshards.read(tmp / "deflate"),
        "keep_stream_float32": lambda: tfshards.read(tmp / "keep"),
        "jpeg_stream_float32": lambda: tfshards.read(tmp / "jpeg"),
        "raw_gzip_stream_float32": lambda: tfshards.read(tmp / "raw_gzip"),
    }
    return read[name]()


def augmentation():
    """A typical chain: flip + rotation + zoom, Keras 3 layers on image/mask batches."""
    import keras

    return keras.Sequential(
        [
            keras.layers.RandomFlip("horizontal", seed=0),
            keras.layers.RandomRotation(0.1, fill_mode="constant", seed=0),
            keras.layers.RandomZoom(0.2, fill_mode="constant", seed=0),
        ]
    )


def _cache_bound(part_bound, cache: Path, *, cast: bool):
    """The warm-epoch bound of the built cache, whichever format the reader wrote: the
    flat store of the ordered reader (``pairs.image`` / ``pairs.mask``), read in order a
    batch of contiguous rows at a time, or the part files of the reader before it."""
    entry = _entry(cache)
    if (entry / "ready" / "pairs.image").is_file():
        return flat_cache_bound_pipeline(entry, cast=cast)
    return part_bound(entry, cast=cast)


def flat_cache_bound_pipeline(entry: Path, *, cast: bool):
    """Contiguous batches of the flat uint8 store (memory-mapped), one py_function call
    per batch (a copy of two slices), [+ cast]: the least work that yields its batches."""
    import numpy as np
    import tensorflow as tf

    from tfshards.benchmarking.baselines import _to_float
    from tfshards.readers.cache import DiskCache

    info = DiskCache.at(entry).info
    height, width, channels = info.shape
    ready = entry / "ready"
    images = np.memmap(ready / "pairs.image", np.uint8, "r", shape=(info.records, *info.shape))
    masks = np.memmap(ready / "pairs.mask", np.uint8, "r", shape=(info.records, height, width))

    def fetch(batch):
        first = int(batch) * BATCH
        last = min(first + BATCH, info.records)
        return np.array(images[first:last]), np.array(masks[first:last])[..., None]

    def load(batch):
        image, mask = tf.py_function(fetch, [batch], [tf.uint8, tf.uint8])
        image = tf.ensure_shape(image, [None, height, width, channels])
        mask = tf.cast(tf.ensure_shape(mask, [None, height, width, 1]), tf.int32)
        return (_to_float(image), mask) if cast else (image, mask)

    batches = -(-info.records // BATCH)
    return (
        tf.data.Dataset.range(batches)
        .map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def _entry(cache: Path) -> Path:
    from tfshards.readers.cache import list_caches

    (entry,) = [e.path for e in list_caches(cache) if e.state == "ready"]
    return entry


def measure_rows(tmp: Path, args: argparse.Namespace) -> list[dict]:
    from tfshards.benchmarking.baselines import keras_pipeline

    repeats, rows = args.repeats, []
    first, cached = [], []
    for attempt in range(repeats):  # a fresh pipeline and cache file for each first epoch
        cache_file = tmp / f"keras-cache-{attempt}"
        for left in tmp.glob(f"{cache_file.name}.*"):  # an earlier run's (--reuse) is read
            left.unlink()
        seeds = keras_pipeline(tmp / "data", (args.size, args.size), cache_file)
        settle()
        first.append(one_pass(seeds))
        cached.append(one_pass(seeds))
        del seeds
        for written in tmp.glob(f"{cache_file.name}.*"):  # see FRESH_PAGES_PAUSE_S
            written.unlink()
    hand = statistics.median(rate for rate, _ in first)
    rows += [row("hand_first_epoch", first, hand), row("hand_disk_cached", cached, hand)]
    rows.append(row("readme_first_epoch", readme_first_epochs(tmp, repeats), hand))
    for name, source, dtype in BUILD_ROWS:  # the cache-building first epoch of other paths
        rows.append(row(name, first_epochs(tmp, repeats, source, dtype), hand))
    rows.append(row("bound_cache_write", plain_writes(tmp, repeats, args), hand))
    for name in (
        "warm_uint8",
        "bound_cache_uint8",
        "warm_float32",
        "bound_cache_float32",
        "warm_float32_keras_augment",
        "ceiling_tfrecord_raw",
        "bound_raw_uint8",
        "raw_stream_uint8",
        "bound_raw_float32",
        "raw_stream_float32",
        "bound_deflate_uint8",
        "deflate_stream_uint8",
        "bound_deflate_float32",
        "deflate_stream_float32",
        "keep_stream_float32",
        "jpeg_stream_float32",
        "raw_gzip_stream_float32",
    ):
        rows.append(row(name, passes(datasets(tmp, name), repeats), hand))
    return rows


def first_epochs(
    tmp: Path, repeats: int, source: str = "deflate", dtype: str = "float32"
) -> list[tuple[float, float]]:
    """A cache-building first epoch (cache=True at a fresh folder) each pass, from nothing;
    the first pass (TensorFlow's kernels and graph caches) is left out."""
    import tfshards

    results = []
    for attempt in range(repeats + 1):
        cache = tmp / f"first-epoch-cache-{attempt}"
        settle()
        results.append(one_pass(tfshards.read(tmp / source, cache=cache, image_dtype=dtype)))
        shutil.rmtree(cache)
    return results[1:]


def settle() -> None:
    """Before a writing pass: no dirty pages left, and freed memory back with the host."""
    os.sync()
    time.sleep(FRESH_PAGES_PAUSE_S)


def plain_writes(tmp: Path, repeats: int, args: argparse.Namespace) -> list[tuple[float, float]]:
    """The cache write's bound: the flat store's bytes (every pair's image and mask) written
    with one os.pwrite per pair in a shuffled order into fresh files, fsynced, then
    deleted, as the build rows' caches are: the kernel's cost of taking in new pages."""
    import numpy as np

    pair = bytes(args.size * args.size * 3), bytes(args.size * args.size)
    order = np.random.default_rng(0).permutation(args.count)
    results = []
    for attempt in range(repeats + 1):
        folder = tmp / f"plain-write-{attempt}"
        folder.mkdir()
        settle()
        started, cpu = time.perf_counter(), time.process_time()
        for name, data in zip(("pairs.image", "pairs.mask"), pair, strict=True):
            fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, len(data) * args.count)
            for index in order:
                os.pwrite(fd, data, int(index) * len(data))
            os.fsync(fd)
            os.close(fd)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        results.append((args.count / seconds, 1000 * cpu / args.count))
        shutil.rmtree(folder)
    return results[1:]


def readme_first_epochs(tmp: Path, repeats: int) -> list[tuple[float, float]]:
    """The README path's first epoch: decode and build the cache, from nothing, each pass."""
    import tfshards

    results = first_epochs(tmp, repeats)
    # The main cache for the warm rows, built once.
    for _ in tfshards.read(tmp / "deflate", cache=tmp / "cache"):
        pass
    return results


def one_pass(dataset) -> tuple[float, float]:
    """(pairs/s, CPU ms per pair) of one pass."""
    from tfshards.benchmarking.measure import timed_pass_cpu

    count, seconds, cpu = timed_pass_cpu(dataset)
    return count / seconds, 1000 * cpu / count


def passes(dataset, repeats: int) -> list[tuple[float, float]]:
    one_pass(dataset)  # warm-up
    return [one_pass(dataset) for _ in range(repeats)]


PASSES: dict[str, list[tuple[float, float]]] = {}  # every row's passes, for --json


def row(name: str, results: list[tuple[float, float]], hand: float) -> dict:
    PASSES[name] = results
    rates = [rate for rate, _ in results]
    middle = statistics.median(rates)
    return {
        "pipeline": name,
        "pairs_per_s": round(middle),
        "spread": round((max(rates) - min(rates)) / middle, 2),
        "cpu_ms_per_pair": round(statistics.median(cpu for _, cpu in results), 3),
        "vs_hand_first_epoch": round(middle / hand, 2),
    }


def with_bare_read_ratio(rows: list[dict]) -> list[dict]:
    """Each row's distance to the bare TFRecordDataset read of the raw shards."""
    bare = next(r for r in rows if r["pipeline"] == "ceiling_tfrecord_raw")
    for r in rows:
        r["vs_bare_read"] = round(r["pairs_per_s"] / bare["pairs_per_s"], 2)
        r["cpu_vs_bare_read"] = round(r["cpu_ms_per_pair"] / bare["cpu_ms_per_pair"], 2)
    return rows


def target_rows(by_name: dict[str, dict]) -> list[dict]:
    """The targets of issue 11: the wall-time ratio (the target as stated) and the same
    ratio in CPU time per pair (reference CPU / ours), which noise on a shared machine
    moves far less."""
    checks = [
        ("warm uint8 >= 2x hand-written disk-cached epoch", "warm_uint8", "hand_disk_cached", 2.0),
        ("warm float32 >= 90% of cache read+cast", "warm_float32", "bound_cache_float32", 0.9),
        ("raw stream uint8 >= 80% of bare TFRecordDataset", "raw_stream_uint8",
         "ceiling_tfrecord_raw", 0.8),
        ("raw stream float32 >= 90% of read+cast", "raw_stream_float32", "bound_raw_float32",
         0.9),
        ("deflate stream uint8 >= 1.8x hand-written first epoch", "deflate_stream_uint8",
         "hand_first_epoch", 1.8),
        ("deflate stream float32 >= 90% of inflate+cast", "deflate_stream_float32",
         "bound_deflate_float32", 0.9),
        ("README first epoch >= 1.0x hand-written first epoch", "readme_first_epoch",
         "hand_first_epoch", 1.0),
        ("cache build deflate float32 >= 0.85x its stream", "readme_first_epoch",
         "deflate_stream_float32", 0.85),
        ("cache build deflate uint8 >= 0.85x its stream", "build_deflate_uint8",
         "deflate_stream_uint8", 0.85),
        ("cache build raw uint8 >= 0.85x its stream", "build_raw_uint8", "raw_stream_uint8",
         0.85),
        ("cache build raw float32 >= 0.85x its stream", "build_raw_float32",
         "raw_stream_float32", 0.85),
        ("README first epoch >= 1.3x hand-written first epoch", "readme_first_epoch",
         "hand_first_epoch", 1.3),
        ("warm uint8 >= 0.8x bare TFRecordDataset", "warm_uint8", "ceiling_tfrecord_raw", 0.8),
        ("warm uint8 >= raw stream uint8 (issue 21)", "warm_uint8", "raw_stream_uint8", 1.0),
        ("warm uint8 >= 90% of the cache bound (issue 21)", "warm_uint8", "bound_cache_uint8",
         0.9),
    ]  # fmt: skip
    rows = []
    for text, name, reference, target in checks:
        ours, theirs = by_name[name], by_name[reference]
        wall = ours["pairs_per_s"] / theirs["pairs_per_s"]
        cpu = theirs["cpu_ms_per_pair"] / ours["cpu_ms_per_pair"]
        rows.append(
            {
                "target": text,
                "wall_ratio": round(wall, 2),
                "met_wall": "yes" if wall >= target else "no",
                "cpu_ratio": round(cpu, 2),
                "met_cpu": "yes" if cpu >= target else "no",
                "cpu_ms_diff": round(ours["cpu_ms_per_pair"] - theirs["cpu_ms_per_pair"], 3),
            }
        )
    return rows


BUILDS = (
    ("build_deflate_uint8", "deflate_stream_uint8"),
    ("readme_first_epoch", "deflate_stream_float32"),
    ("build_raw_uint8", "raw_stream_uint8"),
    ("build_raw_float32", "raw_stream_float32"),
)


def build_bound_rows(by_name: dict[str, dict]) -> list[dict]:
    """What a cache-building epoch can do against its stream when CPU is what limits it:
    it does the stream's work and hands the kernel the same bytes (bound_cache_write's CPU
    per pair), so on cores the stream already keeps busy its pairs/s is at most stream
    CPU / (stream CPU + write CPU) of the stream's. Issue 29 asks >= 0.85x; where this is
    lower and the stream is CPU-bound, no build code meets it here. A stream that leaves
    a core idle (raw, where it waits on memory) lets a build do better."""
    write = by_name["bound_cache_write"]["cpu_ms_per_pair"]
    rows = []
    for build, stream in BUILDS:
        stream_cpu = by_name[stream]["cpu_ms_per_pair"]
        rows.append(
            {
                "build": build,
                "stream_cpu_ms": stream_cpu,
                "write_cpu_ms": write,
                "if_cpu_bound": round(stream_cpu / (stream_cpu + write), 2),
                "measured": round(
                    by_name[build]["pairs_per_s"] / by_name[stream]["pairs_per_s"], 2
                ),
                "cpu_over_stream_ms": round(by_name[build]["cpu_ms_per_pair"] - stream_cpu, 3),
            }
        )
    return rows


def disk_rows(tmp: Path, by_name: dict[str, dict]) -> list[dict]:
    source = _folder_bytes(tmp / "data")
    warm = by_name["warm_float32"]["pairs_per_s"]
    rows = []
    for name, _, _ in CONVERSIONS:
        size = _folder_bytes(tmp / name)
        cold = by_name.get(f"{name}_stream_float32", {}).get("pairs_per_s", "")
        rows.append(
            {
                "encoding": name,
                "MiB": round(size / 2**20, 1),
                "vs_source": round(size / source, 2),
                "cold_float32_pairs_per_s": cold,
                "warm_float32_pairs_per_s (cache=True)": warm,
            }
        )
    return rows


def _folder_bytes(folder: Path) -> int:
    from tfshards.schemas.format import CACHE_DIR_NAME

    return sum(
        p.stat().st_size for p in folder.rglob("*") if p.is_file() and CACHE_DIR_NAME not in p.parts
    )


def scaling_rows(tmp: Path, args: argparse.Namespace) -> list[dict]:
    """Each row's rate pinned to 1 core and to 2 cores, in fresh processes."""
    rows = []
    for name in SCALING_ROWS:
        rates = {}
        for cores in ("0", "0,1"):
            spec = f"{name}:{tmp}:{cores}:{args.repeats}"
            done = subprocess.run(
                [sys.executable, __file__, "--child", spec],
                capture_output=True,
                text=True,
                check=True,
            )
            rates[cores] = json.loads(done.stdout.strip().splitlines()[-1])
        one, two = rates["0"], rates["0,1"]
        rows.append(
            {
                "pipeline": name,
                "1_core_pairs_per_s": round(one["rate"]),
                "2_cores_pairs_per_s": round(two["rate"]),
                "speedup": round(two["rate"] / one["rate"], 2),
                "cpu_ms_per_pair_1_core": round(one["cpu"], 3),
                "cpu_ms_per_pair_2_cores": round(two["cpu"], 3),
            }
        )
    return rows


def child(args: argparse.Namespace) -> None:
    """Pinned before TensorFlow starts, so its thread pools size themselves to the cores."""
    name, root, cores, repeats = args.child.split(":")
    os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    results = passes(datasets(Path(root), name), int(repeats))
    print(
        json.dumps(
            {
                "rate": statistics.median(r for r, _ in results),
                "cpu": statistics.median(c for _, c in results),
            }
        )
    )


def rss_rows(tmp: Path, args: argparse.Namespace) -> list[dict]:
    import tfshards

    rows = []
    for scale in (1, 4):
        data = tmp / f"rss{scale}"
        tfshards.synth(data, count=args.rss_count * scale, size=args.size, seed=scale)
        tfshards.convert(data / "images", data / "masks", data / "shards", progress=False)
        for cache in (None, "True"):
            result = peak_rss_of(
                "import tfshards\n"
                f"ds = tfshards.read({str(data / 'shards')!r}, batch_size={BATCH}, "
                f"cache={cache})\n"
                "for _ in range(2):\n"
                "    n = sum(int(i.shape[0]) for i, _ in ds)\n"
                "RESULT = {'pairs': n}"
            )
            rows.append(
                {
                    "scale": f"{scale}x",
                    "pairs": result["pairs"],
                    "path": "stream, 2 epochs" if cache is None else "cache=True, 2 epochs",
                    "peak_rss_MiB": result["peak_rss_mib"],
                }
            )
        shutil.rmtree(data)
    return rows


# Crops and pads of records of mixed sizes (issue 45, point 6): this checkout against an
# older tree, in child processes (a fresh TensorFlow each), rounds alternating which
# tree goes first. A row: one warm-up epoch, then one timed epoch.
SIZING_ROWS = {  # name: read() keywords
    "crop256": dict(batch_size=16, crop_size=(256, 256)),
    "crop256_scaled": dict(batch_size=16, crop_size=(256, 256), crop_scale=(0.5, 1.5)),
    "crop256_memory": dict(batch_size=16, crop_size=(256, 256), cache="memory"),
    "pad704": dict(batch_size=8, pad_to=(704, 704), shuffle=False),
    "native_b1": dict(batch_size=1, shuffle=False),
}
SIZES = [(300 + 44 * k, 700 - 40 * k) for k in range(10)]  # 300-700 px a side, 10 sizes


def sizing_data(root: Path, count: int) -> Path:
    """``count`` synth pairs (RGB, 3 classes) of ten sizes from 300 to 700 px a side,
    converted with the default options; reused when present."""
    import tfshards

    out = root / "mixed"
    if (out / "tfshards.json").is_file():
        return out
    data = root / "mixed-data"
    for kind in ("images", "masks"):
        (data / kind).mkdir(parents=True, exist_ok=True)
    for k, size in enumerate(SIZES):
        part = root / f"mixed-{k}"
        images, masks = tfshards.synth(part, count=max(1, count // len(SIZES)), size=size, seed=k)
        for folder, kind in ((images, "images"), (masks, "masks")):
            for file in sorted(folder.iterdir()):
                file.rename(data / kind / f"{k}-{file.name}")
    tfshards.convert(data / "images", data / "masks", out, progress=False)
    return out


def sizing_against(args: argparse.Namespace) -> None:
    import _trees

    root = args.reuse or Path(tempfile.mkdtemp(prefix="tfshards-sizing-bench-"))
    shards = sizing_data(root, args.count)
    other, commit = _trees.tree_of(args.sizing_against, root)
    trees = [("here", _trees.HERE), (commit, other)]
    results: dict = {}
    for round_index in range(args.repeats):
        order = trees if round_index % 2 == 0 else trees[::-1]
        for name in SIZING_ROWS:
            for label, tree in order:
                job = json.dumps({"shards": str(shards), "row": name})
                done = subprocess.run(
                    [sys.executable, __file__, "--sizing-child", job],
                    capture_output=True, text=True, env=_trees.env_of(tree), check=False,
                )  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"{label} {name}: {done.stderr[-2000:]}")
                line = done.stdout.strip().splitlines()[-1]
                results.setdefault((name, label), []).append(json.loads(line))
    print(
        f"{args.count} pairs, RGB, 10 sizes 300-700 px a side, default conversion; "
        f"{os.cpu_count()} cores; {args.repeats} alternating rounds; here vs {commit}"
    )
    print(markdown_table(sizing_table(results, commit)))


def sizing_table(results: dict, commit: str) -> list[dict]:
    """Per row: each tree's median pairs/s and CPU ms per pair (min-max spread), and the
    ratios here / before of the medians."""
    rows = []
    for name in SIZING_ROWS:
        here, before = results[(name, "here")], results[(name, commit)]
        rate = [statistics.median(r["pairs_s"] for r in runs) for runs in (here, before)]
        cpu = [statistics.median(r["cpu_ms"] for r in runs) for runs in (here, before)]
        rows.append({
            "row": name,
            "pairs/s here": f"{rate[0]:.1f} ({_spread(here, 'pairs_s')})",
            f"pairs/s {commit}": f"{rate[1]:.1f} ({_spread(before, 'pairs_s')})",
            "speed ratio": f"{rate[0] / rate[1]:.2f}",
            "CPU ms/pair here": f"{cpu[0]:.1f} ({_spread(here, 'cpu_ms')})",
            f"CPU ms/pair {commit}": f"{cpu[1]:.1f} ({_spread(before, 'cpu_ms')})",
            "CPU ratio": f"{cpu[0] / cpu[1]:.2f}",
        })  # fmt: skip
    return rows


def _spread(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs]
    return f"{min(values):.1f}-{max(values):.1f}"


def sizing_child(job: dict) -> None:
    """One row in this process: a warm-up epoch, then a timed one; prints its JSON."""
    import tfshards

    keywords = dict(SIZING_ROWS[job["row"]])
    scale = keywords.pop("crop_scale", None)
    options = tfshards.ReadOptions(crop_scale=scale) if scale else None
    ds = tfshards.read(job["shards"], seed=0, image_dtype="uint8", options=options, **keywords)
    for _ in ds:  # warm-up: graphs traced, the memory cache built, pages read
        pass
    batches = int(ds.cardinality())
    wall, cpu, pairs = time.perf_counter(), time.process_time(), 0
    for count, (images, _) in enumerate(ds, 1):
        pairs += int(images.shape[0])
        if count == batches:  # timed to the last batch (see "How passes are timed")
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            break
    print(json.dumps({"pairs_s": pairs / wall, "cpu_ms": 1000 * cpu / pairs}))


if __name__ == "__main__":
    main()
