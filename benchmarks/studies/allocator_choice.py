"""An allocator setting, A vs B, on every tfshards path of read_throughput.py and in a

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: tfshards caps glibc's malloc arenas at two, raises glibc's mmap and trim
thresholds (32 and 128 MiB) when reading, and leaves TensorFlow's BFC CPU allocator
(``TF_CPU_ALLOCATOR_USE_BFC``) off.
Run: 2026-12-03 (BFC) and 2026-12-04 (arenas; thresholds). Recorded result: with the arena
cap the read paths ran 1.03-1.64x as fast with a third to a half of the system time and
equal or lower peak RSS, Keras fits within their spread (0.50-1.21x); BFC took 0.92-1.06x
the default's CPU per pair and was killed under a memory limit where the default
finished; the thresholds gave 0.99-1.19x the pairs/s, about half the system time on the
raw paths (0.16-0.17 to 0.08-0.09 ms per pair), 0.98-1.23x less CPU, peak RSS -4% to +2%,
Keras fits 0.81-1.34x at equal CPU (their spread).
Raw output: results/allocator_choice.md.
Keras fit, side by side on the same data. By default TensorFlow's CPU allocator, default
vs BFC (TF_CPU_ALLOCATOR_USE_BFC); any environment variable with --variable/--values:

    python benchmarks/studies/allocator_choice.py --count 1000 --size 256 --fit-sizes 256,512
    python benchmarks/studies/allocator_choice.py --variable MALLOC_ARENA_MAX --values 16,unset

("unset" removes the variable: with MALLOC_ARENA_MAX, tfshards' own cap of two arenas
applies; 16 is glibc's default on 2 cores, 8 per core.) Each row runs in fresh child
processes, one per value (the variables are read when the process starts), A then B in
the same order for every row. Per row: median pairs/s of --repeats passes after a
warm-up pass, user and system CPU ms per pair (getrusage of the child, medians), the
child's peak RSS, and B / A ratios.
Keras fit: a small conv net on tfshards.read(cache=True, image_dtype="uint8"), batch 16,
--fit-count pairs, one warm-up epoch then timed epochs. Page cache warm.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _benchmarks_path  # noqa: F401  (benchmarks/ on sys.path)
from _common import markdown_table
from read_throughput import CONVERSIONS, datasets

PATHS = (
    "readme_first_epoch",
    "warm_uint8",
    "warm_float32",
    "warm_float32_keras_augment",
    "ceiling_tfrecord_raw",
    "raw_stream_uint8",
    "raw_stream_float32",
    "deflate_stream_uint8",
    "deflate_stream_float32",
    "keep_stream_float32",
    "jpeg_stream_float32",
    "raw_gzip_stream_float32",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fit-sizes", default="256,512")
    parser.add_argument("--fit-count", type=int, default=256)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--variable", default="TF_CPU_ALLOCATOR_USE_BFC")
    parser.add_argument("--values", default="false,true", help="A,B ('unset' removes it)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    with tempfile.TemporaryDirectory(prefix="tfshards-allocator-") as tmp:
        run(Path(tmp), args)


def run(tmp: Path, args: argparse.Namespace) -> None:
    import tfshards

    tfshards.synth(tmp / "data", count=args.count, size=args.size, seed=0)
    for name, encoding, compression in CONVERSIONS:
        tfshards.convert(tmp / "data" / "images", tmp / "data" / "masks", tmp / name,
                         encoding=encoding, compression=compression, progress=False)  # fmt: skip
    for _ in tfshards.read(tmp / "deflate", cache=tmp / "cache"):  # the warm rows' cache
        pass
    jobs = [{"kind": "read", "name": n, "root": str(tmp), "repeats": args.repeats}
            for n in args.paths.split(",") if n]  # fmt: skip
    for size in (int(s) for s in args.fit_sizes.split(",") if s):
        data = tmp / f"fit{size}"
        tfshards.synth(data, count=args.fit_count, size=size, seed=1)
        tfshards.convert(data / "images", data / "masks", data / "shards", progress=False)
        jobs.append({"kind": "fit", "name": f"keras_fit_{size}", "root": str(data / "shards"),
                     "size": size, "repeats": args.repeats})  # fmt: skip
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores "
          f"(shared); {args.count} pairs {args.size}x{args.size} RGB for the read paths, "
          f"{args.fit_count} per Keras fit; batch 32 (fit 16); page cache warm; median of "
          f"{args.repeats} passes after a warm-up pass", flush=True)  # fmt: skip
    first, second = args.values.split(",")
    print(f"A: {args.variable}={first}, B: {args.variable}={second}", flush=True)
    rows = []
    for job in jobs:
        seen = [run_child({**job, "variable": args.variable, "value": v}) for v in (first, second)]
        rows.append(compare(job["name"], *seen))
        print(markdown_table(rows[-1:]), flush=True)
    print()
    print(markdown_table(rows))


def run_child(job: dict) -> dict:
    env = {**os.environ, job["variable"]: job["value"], "TF_CPP_MIN_LOG_LEVEL": "3"}
    if job["value"] == "unset":
        del env[job["variable"]]
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{job['name']} ({job['value']}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(name: str, a: dict, b: dict) -> dict:
    return {
        "path": name,
        "pairs/s A / B": f"{a['rate']:.0f} / {b['rate']:.0f}",
        "B speed ratio": round(b["rate"] / a["rate"], 2),
        "user ms/pair A / B": f"{a['user']:.2f} / {b['user']:.2f}",
        "sys ms/pair A / B": f"{a['sys']:.2f} / {b['sys']:.2f}",
        "CPU ratio (A / B)": round((a["user"] + a["sys"]) / (b["user"] + b["sys"]), 2),
        "peak RSS MiB A / B": f"{a['rss']:.0f} / {b['rss']:.0f}",
    }


# ---------------------------------------------------------------- child


def child(job: dict) -> None:
    if job["kind"] == "fit":
        results = fit_passes(job)
    elif job["name"] == "readme_first_epoch":
        results = first_epochs(Path(job["root"]), job["repeats"])
    else:
        ds = datasets(Path(job["root"]), job["name"])
        results = [one_pass(ds) for _ in range(job["repeats"] + 1)][1:]
    status = Path("/proc/self/status").read_text().splitlines()
    rss = next(int(x.split()[1]) for x in status if x.startswith("VmHWM:")) / 1024
    print(json.dumps({
        "rate": statistics.median(r[0] for r in results),
        "user": statistics.median(r[1] for r in results),
        "sys": statistics.median(r[2] for r in results),
        "rss": rss,
    }))  # fmt: skip


def one_pass(ds) -> tuple[float, float, float]:
    """(pairs/s to the last batch, user ms per pair, system ms per pair)."""
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    pairs, last, usage = 0, started, before
    for batch in ds:
        first = batch[0] if isinstance(batch, tuple | list) else batch  # bare: record bytes
        pairs += int(first.shape[0])
        last, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    user = 1000 * (usage.ru_utime - before.ru_utime) / pairs
    return pairs / (last - started), user, 1000 * (usage.ru_stime - before.ru_stime) / pairs


def first_epochs(root: Path, repeats: int) -> list[tuple[float, float, float]]:
    """The README path's first epoch (decode + cache build), a fresh cache each pass."""
    import shutil

    import tfshards

    results = []
    for attempt in range(repeats + 1):
        cache = root / f"allocator-first-{os.getpid()}-{attempt}"
        results.append(one_pass(tfshards.read(root / "deflate", cache=cache)))
        shutil.rmtree(cache)
    return results[1:]


def fit_passes(job: dict) -> list[tuple[float, float, float]]:
    import keras

    import tfshards

    train = tfshards.read(job["root"], batch_size=16, cache=True, image_dtype="uint8", seed=0)
    model = keras.Sequential([
        keras.Input((job["size"], job["size"], 3)),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(3, 1),
    ])  # fmt: skip
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    results = []
    for _ in range(job["repeats"] + 1):
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        model.fit(train, epochs=1, verbose=0)
        seconds, usage = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
        pairs = int(train.cardinality()) * 16
        results.append((pairs / seconds, 1000 * (usage.ru_utime - before.ru_utime) / pairs,
                        1000 * (usage.ru_stime - before.ru_stime) / pairs))  # fmt: skip
    return results[1:]


if __name__ == "__main__":
    main()
