"""Reading throughput: tfshards.read against the pipelines users write by hand, same data, one run.

    python benchmarks/read_throughput.py --count 2000 --size 256

Rows (pairs/s; batches of 32; float32 images):
  seeds_first_epoch / seeds_disk_cached: two keras.utils.image_dataset_from_directory
      zipped, shuffled, .cache(file), prefetch; first epoch, then an epoch from its cache.
  list_files_map: list_files + parallel map decoding PNG image and mask.
  tfshards_<encoding>_cold: tfshards.read(cache=None), a pass after a warm-up pass.
  tfshards_<encoding>_warm: tfshards.read(cache=dir), an epoch after the cache was built.
  tfshards_raw_cold_uint8: raw, uint8 images (no float conversion), to compare with the
      ceiling, which yields bytes.
  ceiling_tfrecord_raw: bare TFRecordDataset over the raw shards, bytes only, no parsing.
Then peak RSS of tfshards.read at 1x and 4x the data, each in a fresh process.
The OS page cache is warm for every row (files were just written): say so when quoting.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import markdown_table, peak_rss_of

from tfshards.benchmarking.baselines import (
    ceiling_pipeline,
    keras_pipeline,
    list_files_pipeline,
)
from tfshards.benchmarking.measure import timed_pass

BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="pairs (default 2000)")
    parser.add_argument("--size", type=int, default=256, help="image side (default 256)")
    parser.add_argument("--encodings", default="keep,png,jpeg,raw")
    parser.add_argument(
        "--rss-count",
        type=int,
        default=1200,
        help="pairs at 1x for RSS (default 1200: more than the shuffle buffer)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per row")
    args = parser.parse_args()

    import tfshards

    rows: list[dict] = []
    repeats = args.repeats
    with tempfile.TemporaryDirectory(prefix="tfshards-read-bench-") as tmp:
        tmp = Path(tmp)
        tfshards.synth(tmp / "data", count=args.count, size=args.size, seed=0)
        # The Keras pipeline's first epoch needs a fresh pipeline and cache file each time.
        seeds_first, seeds_cached = [], []
        for attempt in range(repeats):
            seeds = keras_pipeline(
                tmp / "data", (args.size, args.size), tmp / f"seeds-cache-{attempt}"
            )
            seeds_first.append(rate(seeds))
            seeds_cached.append(rate(seeds))
        cold, disk_cached = statistics.median(seeds_first), statistics.median(seeds_cached)
        rows += [
            row("seeds_first_epoch", seeds_first, cold),
            row("seeds_disk_cached", seeds_cached, disk_cached),
        ]
        lf = list_files_pipeline(tmp / "data" / "images", tmp / "data" / "masks")
        rows.append(row("list_files_map", passes(lf, repeats), cold))
        ceiling_rate = None
        for encoding in args.encodings.split(","):
            shards = tmp / f"shards-{encoding}"
            tfshards.convert(
                tmp / "data" / "images",
                tmp / "data" / "masks",
                shards,
                encoding=encoding,
                progress=False,
            )
            stream = tfshards.read(shards, batch_size=BATCH, seed=0)
            rows.append(row(f"tfshards_{encoding}_cold", passes(stream, repeats), cold))
            cached = tfshards.read(shards, batch_size=BATCH, seed=0, cache=tmp / "cache")
            rows.append(row(f"tfshards_{encoding}_warm", passes(cached, repeats), disk_cached))
            if encoding == "raw":
                as_bytes = tfshards.read(shards, batch_size=BATCH, seed=0, image_dtype="uint8")
                rows.append(row("tfshards_raw_cold_uint8", passes(as_bytes, repeats), cold))
                ceiling = passes(ceiling_pipeline(shards), repeats)
                ceiling_rate = statistics.median(ceiling)
                rows.append(row("ceiling_tfrecord_raw", ceiling, cold))
        for r in rows:
            r["vs_ceiling"] = round(r["pairs_per_s"] / ceiling_rate, 2) if ceiling_rate else ""
        print(
            f"{args.count} pairs, {args.size}x{args.size} RGB, batch {BATCH}, page cache "
            f"warm; median of {repeats} passes (after one warm-up pass for tfshards rows)"
        )
        print(markdown_table(rows))
        print()
        print(markdown_table(rss_rows(tmp, args)))


def rate(dataset) -> float:
    count, seconds = timed_pass(dataset)
    return count / seconds


def passes(dataset, repeats: int) -> list[float]:
    """One warm-up pass (for a cached pipeline: the pass that builds it), then timed ones."""
    rate(dataset)
    return [rate(dataset) for _ in range(repeats)]


def row(name: str, rates: list[float], baseline: float) -> dict:
    middle = statistics.median(rates)
    return {
        "pipeline": name,
        "pairs_per_s": round(middle),
        "spread": round((max(rates) - min(rates)) / middle, 2),
        "vs_baseline": round(middle / baseline, 2),
    }


def rss_rows(tmp: Path, args: argparse.Namespace) -> list[dict]:
    import tfshards

    rows = []
    for scale in (1, 4):
        data = tmp / f"rss{scale}"
        tfshards.synth(data, count=args.rss_count * scale, size=args.size, seed=scale)
        tfshards.convert(
            data / "images", data / "masks", data / "shards", encoding="raw", progress=False
        )
        result = peak_rss_of(
            "import tfshards\n"
            f"ds = tfshards.read({str(data / 'shards')!r}, batch_size={BATCH}, seed=0)\n"
            "n = sum(int(i.shape[0]) for i, _ in ds)\n"
            "RESULT = {'pairs': n}"
        )
        rows.append(
            {"scale": f"{scale}x", "pairs": result["pairs"], "peak_rss_MiB": result["peak_rss_mib"]}
        )
    return rows


if __name__ == "__main__":
    main()
