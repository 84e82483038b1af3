"""Datasets in a bucket: converting into it and streaming from it through the local shard
cache, against the same dataset on local disk, in one run.

Compares: reading from and converting into a bucket (moto's S3 server on 127.0.0.1)
against the same dataset on local disk.
Takes: about 10 minutes at --count 2000 --repeats 3 on 2 cores.

    python benchmarks/object_storage.py --count 2000 --size 256

The bucket is moto's S3 server on 127.0.0.1 (started here; it shares this machine's
cores with the reader). Rows, each the median of --repeats passes with the spread
((max - min) / median), pairs/s and process CPU ms per pair:
  local_stream      tfshards.read of the local dataset (float32, batch 32, shuffled)
  bucket_cold       the same from the bucket, each pass with an empty shard cache
  bucket_warm       the same from the bucket, shard cache already filled
  bare_download     every shard fetched with the same client (s3fs get_file), nothing
                    else, converted to pairs/s: the server's pace
  convert_local     tfshards.convert into a local folder (one pass each)
  convert_bucket    tfshards.convert into the bucket (shards built locally, uploaded)
cpu_ms_per_pair counts this process and its children (the shard cache's download
helper included); server_cpu_ms_per_pair is the S3 server's own CPU time in that row
(it runs on the same 2 cores as the reader here; a real object store does not). Then the
targets as ratios.
The page cache is warm for the local rows.

    python benchmarks/object_storage.py --rows convert --before /tmp/tfshards-before

    python benchmarks/object_storage.py --rows read --before /tmp/tfshards-before --repeats 3

``--rows read`` runs only the reads, each round in fresh processes (one per tree:
``--before``, ``--after`` reading a manifest without the shards' CRC-32Cs (downloads
checked by sha256, as a tree before that field must read it), then ``--after``,
alternating, when ``--before`` is given; see ``_bucket_read_passes.py``), and splits
the CPU by process: main (tf.data, decoding), helper (the shard cache's download
process) and the S3 server (not ours: a real object store runs elsewhere). Ours is
main + helper. Ratios (cold/local CPU per pair, cold and warm pairs/s against local)
are taken within each process, then their median and spread.

``--rows convert`` runs only the two convert rows. ``--before DIR`` adds
local_before / local_after: ``tfshards convert`` into a local folder as a fresh
process, from DIR (a tree of tfshards before the storage layer, e.g.
``git archive 3e698b1 tfshards | tar -x -C DIR``) and from ``--after`` (default: this
tree), alternating, with the ratio (local paths must not slow down).
"""

from __future__ import annotations

import argparse
import contextlib
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
SERVER_PID = 0  # the S3 server's process, whose CPU time each row reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="pairs (default 2000)")
    parser.add_argument("--size", type=int, default=256, help="image side (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="passes per row (default 3)")
    parser.add_argument("--rows", choices=("all", "convert", "read"), default="all")
    parser.add_argument(
        "--data", type=Path, help="an existing images/ + masks/ folder (default: synthesize)"
    )
    parser.add_argument("--before", type=Path, help="a tfshards tree to time local convert against")
    parser.add_argument(
        "--after", type=Path, help="the tree timed against --before (default: here)"
    )
    args = parser.parse_args()
    from s3_server import s3_environment, start_moto

    server = start_moto()
    os.environ.update(s3_environment(server.endpoint))
    global SERVER_PID
    SERVER_PID = server.process.pid
    try:
        with tempfile.TemporaryDirectory(prefix="tfshards-bucket-bench-") as tmp:
            run(Path(tmp), args)
    finally:
        server.stop()


def run(tmp: Path, args: argparse.Namespace) -> None:
    import s3fs

    import tfshards

    s3fs.S3FileSystem().mkdir("tfshards-bench")
    url = "s3://tfshards-bench/shards"
    data = args.data or tmp / "data"
    if args.data is None:
        tfshards.synth(data, count=args.count, size=args.size, seed=0)
    images, masks = data / "images", data / "masks"
    if args.rows == "read":
        read_rows(images, masks, tmp, url, args)
        return
    rows = convert_rows(images, masks, tmp / "shards", url, args.repeats)
    if args.before is not None:
        after = args.after or Path(__file__).resolve().parents[1]
        rows += local_before_after(images, masks, tmp, (args.before, after), args.repeats)
    header = (
        f"{args.count} pairs, {args.size}x{args.size} RGB, default conversion (deflate, all "
        f"{os.cpu_count()} cores); moto S3 server on 127.0.0.1 sharing the cores; median of "
        f"{args.repeats} passes, alternating"
    )
    if args.rows == "convert":
        print(header)
        print(markdown_table(rows))
        print()
        print(markdown_table(targets({r["row"]: r for r in rows})))
        return
    train = tfshards.Manifest.load(tmp / "shards").splits["train"].records
    rows.append(row("local_stream", _passes(lambda: _read(tmp / "shards", tmp / "x"), args), train))
    cold = []
    for attempt in range(args.repeats + 1):
        folder = tmp / f"cold-{attempt}"
        cold.append(_timed(lambda f=folder: _drain(_read(url, f))))
        shutil.rmtree(folder)
    rows.append(row("bucket_cold", cold[1:], train))
    warm_folder = tmp / "warm"
    _drain(_read(url, warm_folder))
    rows.append(row("bucket_warm", _passes(lambda: _read(url, warm_folder), args), train))
    rows.append(row("bare_download", _bare_downloads(url, tmp, args.repeats), train))
    by = {r["row"]: r for r in rows}
    print(
        f"{args.count} pairs ({train} in train), {args.size}x{args.size} RGB, default conversion "
        f"(deflate), batch {BATCH}, float32; moto S3 server on 127.0.0.1 sharing the "
        f"{os.cpu_count()} cores; median of {args.repeats} passes"
    )
    print(markdown_table(rows))
    print()
    print(markdown_table(targets(by)))


def read_rows(images: Path, masks: Path, tmp: Path, url: str, args: argparse.Namespace) -> None:
    """Local stream, cold and warm bucket reads from each tree, in fresh processes,
    alternating trees; rows with CPU split by process, then per-process ratios."""
    import tfshards

    tfshards.convert(images, masks, tmp / "shards", progress=False)
    tfshards.convert(images, masks, url, progress=False, overwrite=True)
    train = tfshards.Manifest.load(tmp / "shards").splits["train"].records
    here = Path(__file__).resolve().parents[1]
    after = args.after or here
    trees = {"": (here, tmp / "shards", url)}
    if args.before:  # a tree from before the manifest's crc32c reads a copy without it,
        # and so does "after, sha256": the same tree checking downloads by sha256
        sha256_only = _without_crc32c(tmp / "shards", tmp / "shards-sha256", f"{url}-sha256")
        trees = {
            "before": (args.before, *sha256_only),
            "after, sha256 manifest": (after, *sha256_only),
            "after": (after, tmp / "shards", url),
        }
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, (tree, local, remote) in trees.items():
            runs[name].append(_read_process(tree, local, remote, tmp))
    print(
        f"{args.count} pairs ({train} in train), {args.size}x{args.size} RGB, deflate, batch "
        f"{BATCH}, float32; moto S3 server on 127.0.0.1 sharing the {os.cpu_count()} cores; "
        f"{args.repeats} processes per tree, alternating, each 3 timed passes "
        "per kind; medians over all passes, spread = (max - min) / median"
    )
    rows, ratios = [], []
    for name, processes in runs.items():
        for kind in ("local", "cold", "warm"):
            passes = [p for process in processes for p in process[kind]]
            rows.append(_split_row(f"{name} {kind}".strip(), passes, train))
        ratios += _ratio_rows(name, processes, train)
    print(markdown_table(rows))
    print()
    print(markdown_table(ratios))


def _without_crc32c(local: Path, copy: Path, url: str) -> tuple[Path, str]:
    """The dataset again, locally and at ``url``, its manifest without the shards'
    ``crc32c`` (as written before tfshards recorded it)."""
    from tfshards import storage

    body = json.loads((local / "tfshards.json").read_text())
    for split in body["splits"].values():
        for shard in split["shards"]:
            shard.pop("crc32c", None)
    copy.mkdir()
    for shard in local.iterdir():
        if shard.name != "tfshards.json":
            os.link(shard, copy / shard.name)
    (copy / "tfshards.json").write_text(json.dumps(body, indent=2))
    for shard in sorted(copy.iterdir()):
        storage.write_bytes(f"{url}/{shard.name}", shard.read_bytes())
    return copy, url


def _read_process(tree: Path, local: Path, url: str, tmp: Path) -> dict:
    """One fresh process's passes (``_bucket_read_passes.py``) from ``tree``; the server's
    CPU over the process is added to its cold passes (local passes make no requests)."""
    scratch = tmp / "scratch"
    scratch.mkdir(exist_ok=True)
    script = Path(__file__).resolve().parent / "_bucket_read_passes.py"
    command = [sys.executable, str(script), str(local), url, str(scratch), "3"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    server = _server_cpu()
    done = subprocess.run(  # cwd: an older helper runs `python -m` and imports from there
        command, env=env, cwd=tree, check=True, stdout=subprocess.PIPE, text=True
    )
    server = _server_cpu() - server
    line = next(x for x in done.stdout.splitlines() if x.startswith("PASSES "))
    passes = json.loads(line[len("PASSES ") :])
    for measured in passes["cold"]:
        measured["server"] = server / (len(passes["cold"]) + 1)  # + the untimed cold pass
    shutil.rmtree(scratch, ignore_errors=True)
    return passes


def _cpu_ms(measured: dict, pairs: int, *keys: str) -> float:
    return 1000 * sum(measured.get(k, 0.0) for k in keys) / pairs


def _split_row(name: str, passes: list[dict], pairs: int) -> dict:
    rates = [pairs / p["seconds"] for p in passes]
    middle = statistics.median(rates)

    def ms(*keys: str) -> float:
        return round(statistics.median(_cpu_ms(p, pairs, *keys) for p in passes), 3)

    ours = [_cpu_ms(p, pairs, "main_user", "main_sys", "helper_user", "helper_sys") for p in passes]
    return {
        "row": name,
        "pairs_per_s": round(middle),
        "spread": round((max(rates) - min(rates)) / middle, 2),
        "ours_cpu_ms": round(statistics.median(ours), 3),
        "ours_spread": round((max(ours) - min(ours)) / statistics.median(ours), 2),
        "main_user": ms("main_user"),
        "main_sys": ms("main_sys"),
        "helper_user": ms("helper_user"),
        "helper_sys": ms("helper_sys"),
        "server_cpu_ms": ms("server"),
    }


def _ratio_rows(name: str, processes: list[dict], pairs: int) -> list[dict]:
    """Per process: cold/local CPU per pair (ours), cold and warm pairs/s over local."""
    ours = ("main_user", "main_sys", "helper_user", "helper_sys")

    def median(kind: str, value) -> float:
        return statistics.median(value(p) for p in kind)

    found: dict[str, list[float]] = {
        "cold/local cpu": [],
        "cold/local pairs/s": [],
        "warm/local pairs/s": [],
    }
    for process in processes:
        local_cpu = median(process["local"], lambda p: _cpu_ms(p, pairs, *ours))
        local_rate = median(process["local"], lambda p: pairs / p["seconds"])
        found["cold/local cpu"].append(
            median(process["cold"], lambda p: _cpu_ms(p, pairs, *ours)) / local_cpu
        )
        found["cold/local pairs/s"].append(
            median(process["cold"], lambda p: pairs / p["seconds"]) / local_rate
        )
        found["warm/local pairs/s"].append(
            median(process["warm"], lambda p: pairs / p["seconds"]) / local_rate
        )
    goals = {
        "cold/local cpu": ("<=", 1.15),
        "cold/local pairs/s": (">=", 0.8),
        "warm/local pairs/s": (">=", 0.95),
    }
    rows = []
    for ratio, values in found.items():
        middle = statistics.median(values)
        sign, goal = goals[ratio]
        met = middle <= goal if sign == "<=" else middle >= goal
        rows.append(
            {
                "tree": name or "this",
                "ratio": ratio,
                "median": round(middle, 2),
                "min": round(min(values), 2),
                "max": round(max(values), 2),
                "target": f"{sign} {goal}",
                "met": "yes" if met else "no",
            }
        )
    return rows


def convert_rows(images: Path, masks: Path, local_out: Path, url: str, repeats: int) -> list[dict]:
    """convert_local and convert_bucket: the same conversion into a folder and into the
    bucket, alternating so that drift hits both alike; each pass starts from nothing."""
    import tfshards

    local, bucket = [], []
    for _ in range(repeats):
        shutil.rmtree(local_out, ignore_errors=True)
        local.append(_timed(lambda: tfshards.convert(images, masks, local_out, progress=False)))
        bucket.append(
            _timed(lambda: tfshards.convert(images, masks, url, progress=False, overwrite=True))
        )
    pairs = sum(1 for _ in images.iterdir())
    return [row("convert_local", local, pairs), row("convert_bucket", bucket, pairs)]


def local_before_after(
    images: Path, masks: Path, tmp: Path, trees: tuple[Path, Path], repeats: int
) -> list[dict]:
    """`tfshards convert` into a local folder from two trees (before, after), each a fresh
    process, alternating."""
    results: dict[str, list[tuple[float, float, float]]] = {"local_before": [], "local_after": []}
    for _ in range(repeats):
        for name, tree in zip(results, trees, strict=True):
            out = tmp / f"{name}-out"
            shutil.rmtree(out, ignore_errors=True)
            command = [sys.executable, "-m", "tfshards.cli", "-q", "convert"]
            command += ["--images", str(images), "--masks", str(masks), "--out", str(out)]
            env = {**os.environ, "PYTHONPATH": str(tree)}
            results[name].append(
                _timed(
                    lambda c=command, e=env: subprocess.run(
                        c, env=e, check=True, stdout=subprocess.DEVNULL
                    )
                )
            )
    pairs = sum(1 for _ in images.iterdir())
    return [row(name, runs, pairs) for name, runs in results.items()]


def _read(location, shard_cache: Path):
    import tfshards

    options = tfshards.ReadOptions(shard_cache=shard_cache)
    return tfshards.read(location, batch_size=BATCH, seed=0, options=options)


def _drain(dataset) -> int:
    return sum(int(images.shape[0]) for images, _ in dataset)


def _timed(job) -> tuple[float, float, float]:
    """(seconds, CPU seconds of this process and its finished children, of the server)."""
    cpu, server = _cpu(), _server_cpu()
    started = time.perf_counter()
    job()
    return time.perf_counter() - started, _cpu() - cpu, _server_cpu() - server


def _server_cpu() -> float:
    fields = Path(f"/proc/{SERVER_PID}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _cpu() -> float:
    """This process, its finished children, and its running ones (the shard cache's
    download helper runs as long as its reader)."""
    import resource

    own = time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + children.ru_utime + children.ru_stime + _running_children_cpu()


def _running_children_cpu() -> float:
    total = 0.0
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            if int(pid) == SERVER_PID:  # reported in its own column
                continue
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _passes(make, args) -> list[tuple[float, float, float]]:
    dataset = make()
    _drain(dataset)  # warm-up: TensorFlow's kernels and graph caches
    return [_timed(lambda: _drain(dataset)) for _ in range(args.repeats)]


def _bare_downloads(url: str, tmp: Path, repeats: int) -> list[tuple[float, float, float]]:
    import s3fs

    fs = s3fs.S3FileSystem()
    names = [n for n in fs.find(url.removeprefix("s3://")) if "/train-" in n]
    results = []
    for attempt in range(repeats):
        target = tmp / f"bare-{attempt}"
        target.mkdir()
        results.append(
            _timed(lambda t=target: [fs.get_file(n, str(t / n.rsplit("/", 1)[1])) for n in names])
        )
        shutil.rmtree(target)
    return results


def row(name: str, results: list[tuple[float, float, float]], pairs: int) -> dict:
    rates = [pairs / seconds for seconds, _, _ in results]
    middle = statistics.median(rates)
    return {
        "row": name,
        "pairs_per_s": round(middle),
        "spread": round((max(rates) - min(rates)) / middle, 2),
        "cpu_ms_per_pair": round(statistics.median(1000 * c / pairs for _, c, _ in results), 3),
        "server_cpu_ms_per_pair": round(
            statistics.median(1000 * s / pairs for _, _, s in results), 3
        ),
    }


def targets(by: dict[str, dict]) -> list[dict]:
    """The issue's targets as ratios, for the rows this run measured."""
    rate = {name: r["pairs_per_s"] for name, r in by.items()}
    checks = []
    if "local_stream" in rate:
        local, bare = rate["local_stream"], rate["bare_download"]
        checks += [
            ("bucket warm >= 0.95x local stream", rate["bucket_warm"], local, 0.95),
            (
                "bucket cold >= 0.8x min(local stream, bare download)",
                rate["bucket_cold"],
                min(local, bare),
                0.8,
            ),
        ]
    checks.append(
        (
            "convert into bucket >= 0.8x convert to local disk",
            rate["convert_bucket"],
            rate["convert_local"],
            0.8,
        )
    )
    if "local_before" in rate:
        checks.append(
            (
                "local convert after >= 0.97x before (no slowdown)",
                rate["local_after"],
                rate["local_before"],
                0.97,
            )
        )
    return [
        {
            "target": text,
            "ratio": round(ours / ref, 2),
            "met": "yes" if ours / ref >= goal else "no",
        }
        for text, ours, ref, goal in checks
    ]


if __name__ == "__main__":
    main()
