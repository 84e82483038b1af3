"""Resuming mid-epoch: time from the ``tfshards.read()`` call to the first batch, for a
fresh read (start at 0) against ``start=(0, b)`` at 1%, 50% and 99% of the epoch's
batches and ``start=(1, 0)``, each in a fresh process, and whether that first batch is
bit for bit the uninterrupted run's batch at the same position.

Compares: read(start=...) at 1%, 50%, 99% and epoch 1 against a fresh read, local, from
the loopback S3 server (cold and warm shard cache) and gzip shards (cold and warm
inflated copies).
Takes: about 20 minutes at the defaults on 2 busy cores (conversions first, about a
minute each at --count 20000 --size 64).

    python benchmarks/resume_first_batch.py --count 20000 --size 64 --repeats 3

Data: ``tfshards synth`` pairs (RGB images, 3-class masks), converted twice: the
default conversion (deflate records) and ``encoding="raw", compression="gzip"``.
Read with ``tfshards.read(path, batch_size=32, seed=0)`` (float32 images, int32 masks).
Sources, each timed at every position:
  local          the default conversion on local disk (page cache warm: the files were
                 just written or read; the offsets/user cache folder warm too)
  s3_cold        the same dataset uploaded to moto's S3 server on 127.0.0.1, with an
                 empty shard cache (``ReadOptions(shard_cache=...)``) in each process:
                 the first batch includes downloading the shards it needs
  s3_warm        the same with a shard cache that already holds every shard
  gzip_cold      the gzip conversion, local, with an empty user cache
                 ($XDG_CACHE_HOME) in each process: the first batch includes inflating
                 each shard it needs into ``$XDG_CACHE_HOME/tfshards/inflated``
  gzip_warm      the same with a user cache that already holds every inflated shard
Every (source, position) runs in a fresh Python process (TensorFlow imported before the
clock starts, nothing of tfshards warm in the process), --repeats passes, positions
alternating within a pass; reported: median seconds, spread ((max - min) / median),
the process's CPU ms (user + sys, this process and its children) over the same span,
and the ratio to the same source's fresh read. The reference batches come from one
uninterrupted run per source (epoch 0 whole, then the first batch of epoch 1).

Takes about (5 sources x 5 positions x repeats) fresh processes of 5-10 s each on a
2-core machine (about 8 minutes at --repeats 3), plus the synth and conversions on the
first run (a few minutes at 20,000 64x64 pairs; kept with --reuse).
"""

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

from _common import markdown_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
BATCH = 32
SEED = 0
SOURCES = ("local", "s3_cold", "s3_warm", "gzip_cold", "gzip_warm")
BUCKET = "tfshards-resume-bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000, help="pairs (default 20000)")
    parser.add_argument("--size", type=int, default=64, help="image side (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="passes per cell (default 3)")
    parser.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset")
    parser.add_argument(
        "--reuse", type=Path, help="keep the generated data and conversions here, reuse them"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # JSON spec of one timed read
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.reuse:
        args.reuse.mkdir(parents=True, exist_ok=True)
        return run(args.reuse, args)
    with tempfile.TemporaryDirectory(prefix="tfshards-resume-bench-") as tmp:
        run(Path(tmp), args)


def run(root: Path, args: argparse.Namespace) -> None:
    import tfshards

    if not (root / "data" / "masks").is_dir():
        tfshards.synth(root / "data", count=args.count, size=args.size, seed=0)
    conversions = {"default": {}, "gzip": {"encoding": "raw", "compression": "gzip"}}
    for name, keywords in conversions.items():
        if not (root / name / "tfshards.json").is_file():
            images, masks = root / "data" / "images", root / "data" / "masks"
            tfshards.convert(images, masks, root / name, progress=False, **keywords)
    sources = args.sources.split(",")
    from s3_server import s3_environment, start_moto, upload_folder

    server = start_moto()
    os.environ.update(s3_environment(server.endpoint))
    try:
        import s3fs

        s3fs.S3FileSystem().mkdir(BUCKET)
        upload_folder(root / "default", f"s3://{BUCKET}/default")
        measure(root, sources, args)
    finally:
        server.stop()


def spec_of(root: Path, source: str, start, work: Path) -> dict:
    """What one child reads, and with which cache folders."""
    location = {
        "local": root / "default",
        "s3_cold": f"s3://{BUCKET}/default",
        "s3_warm": f"s3://{BUCKET}/default",
        "gzip_cold": root / "gzip",
        "gzip_warm": root / "gzip",
    }[source]
    cold = source.endswith("_cold")
    return {
        "location": str(location),
        "start": start,
        "shard_cache": str(work / "shards" if cold else root / "warm-shard-cache"),
        "xdg": str(work / "xdg" if cold else root / f"xdg-{source}"),
        "reference": str(root / f"reference-{source.split('_')[0]}.npz"),
    }


def measure(root: Path, sources: list[str], args: argparse.Namespace) -> None:
    import tfshards

    epochs_batches = None
    for source in sources:  # references (and warm caches) from one uninterrupted run each
        spec = spec_of(root, source, None, root / "unused")
        if epochs_batches is None:
            epochs_batches = _batches_per_epoch(root / "default")
            positions = {
                "fresh (0, 0)": None,
                "1%": (0, epochs_batches // 100),
                "50%": (0, epochs_batches // 2),
                "99%": (0, epochs_batches * 99 // 100),
                "epoch 1, batch 0": (1, 0),
            }
            wanted = [p for p in positions.values() if p is not None] + [(0, 0)]
        if not Path(spec["reference"]).is_file() or not source.endswith("_cold"):
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps({**spec, "reference_of": wanted})],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            print(f"reference/warm-up run of {source}: {time.perf_counter() - started:.1f} s")
    print(
        f"{tfshards.Manifest.load(root / 'default').splits['train'].records} train pairs, "
        f"{epochs_batches} batches of {BATCH} per epoch; positions {positions}"
    )
    results: dict[tuple[str, str], list[dict]] = {}
    for attempt in range(args.repeats):
        for source in sources:
            for label, start in positions.items():
                with tempfile.TemporaryDirectory(prefix="tfshards-resume-child-") as work:
                    spec = spec_of(root, source, start, Path(work))
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", json.dumps(spec)],
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                if done.returncode != 0:
                    raise RuntimeError(f"{source} {label}: {done.stderr[-3000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results.setdefault((source, label), []).append(result)
                print(f"pass {attempt} {source} {label}: {result}", flush=True)
    rows = []
    for source in sources:
        fresh = statistics.median(r["seconds"] for r in results[(source, "fresh (0, 0)")])
        for label in positions:
            runs = results[(source, label)]
            seconds = [r["seconds"] for r in runs]
            middle = statistics.median(seconds)
            rows.append(
                {
                    "source": source,
                    "start": label,
                    "first_batch_s": round(middle, 3),
                    "spread": round((max(seconds) - min(seconds)) / middle, 2),
                    "cpu_ms": round(statistics.median(r["cpu_ms"] for r in runs)),
                    "vs_fresh": round(middle / fresh, 2),
                    "target_<=1.5x": "yes" if middle / fresh <= 1.5 else "no",
                    "equal_to_uninterrupted": all(r["equal"] for r in runs),
                }
            )
    print()
    print(
        f"tfshards from {Path(tfshards.__file__).parent.parent}; {os.cpu_count()} cores; "
        f"median of {args.repeats} fresh processes per cell"
    )
    print(markdown_table(rows))


def _batches_per_epoch(path: Path) -> int:
    import tfshards

    dataset = tfshards.read(path, batch_size=BATCH, seed=SEED)
    return int(dataset.cardinality())


def child(spec: dict) -> None:
    """One fresh process: read() to the first batch (or, with reference_of, the
    uninterrupted run's batches at those positions, saved)."""
    os.makedirs(spec["xdg"], exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = spec["xdg"]
    import resource

    import numpy as np
    import tensorflow as tf  # noqa: F401  (imported before the clock starts)

    import tfshards

    options = tfshards.ReadOptions(shard_cache=spec["shard_cache"])
    location = spec["location"]
    if "reference_of" in spec:
        wanted = {tuple(p) for p in spec["reference_of"]}
        dataset = tfshards.read(location, batch_size=BATCH, seed=SEED, options=options)
        kept = {}
        for epoch in (0, 1):
            for batch, (image, mask) in enumerate(dataset):
                if (epoch, batch) in wanted:
                    kept[f"{epoch}_{batch}_image"] = image.numpy()
                    kept[f"{epoch}_{batch}_mask"] = mask.numpy()
                if epoch == 1:
                    break
        np.savez(spec["reference"], **kept)
        print(json.dumps({"kept": len(kept)}))
        return

    def cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    start = tuple(spec["start"]) if spec["start"] is not None else None
    cpu0, started = cpu(), time.perf_counter()
    dataset = tfshards.read(location, batch_size=BATCH, seed=SEED, options=options, start=start)
    image, mask = next(iter(dataset))
    seconds, cpu_ms = time.perf_counter() - started, 1000 * (cpu() - cpu0)
    epoch, batch = start or (0, 0)
    reference = np.load(spec["reference"])
    equal = bool(
        np.array_equal(image.numpy(), reference[f"{epoch}_{batch}_image"])
        and np.array_equal(mask.numpy(), reference[f"{epoch}_{batch}_mask"])
    )
    print(json.dumps({"seconds": seconds, "cpu_ms": cpu_ms, "equal": equal}))
    shutil.rmtree(spec["xdg"] + "/unused", ignore_errors=True)


if __name__ == "__main__":
    main()
