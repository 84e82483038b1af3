"""Datasets larger than RAM: every reader in a memory-limited cgroup, data 3x the limit.

Compares: each reader against the bare TFRecordDataset read of the same shards (the
disk's pace), each in a cgroup with a memory limit a third of the data.
Takes: 30-60 minutes for both cases (it writes several GiB of shards first); needs root
for the cgroup. With --against, each row twice per round: --pairs 64 --limit-mib 768
(a smoke run, one row, 2 rounds) took 1 minute on 2 cores.

    sudo python benchmarks/larger_than_ram.py --limit-mib 1536 --cases rgb512,gray1024
    sudo python benchmarks/larger_than_ram.py --against 5d9e324 --cases rgb512 \
        --limit-mib 2048 --encodings raw --allocators false --no-hand --long-epochs 0

With ``--against REV[,REV...]`` every reader row runs for this checkout and for the
tfshards of each git revision (extracted with ``git archive``, imported by ``PYTHONPATH``
in the child), each reading shards its own version converted, in --rounds rounds, each
round starting with the next tree; a table of medians and spreads (min-max over rounds)
and of the per-round ratios here / REV follows the per-epoch rows.

Cases: 512x512 RGB pairs (batch 32) and 1024x1024 grayscale tiles (batch 8), generated
with ``tfshards.synth`` (a few distinct pairs, hard-linked under as many keys as make
the raw shards at least --factor times the limit) and converted with ``raw`` and
``deflate`` records. Each reader runs in a fresh child process (a fresh TensorFlow):

  bare       TFRecordDataset over the same shards, bytes only: the disk's pace;
  stream     tfshards.read, uint8 and float32;
  cached     tfshards.read(cache=<fresh folder>): epoch 1 builds the cache, then reads it;
  hand       the hand-written pipeline (two image_dataset_from_directory + zip +
             shuffle(1000) + .cache(file)), RGB only; it may be killed for memory.

Each child runs with TF_CPU_ALLOCATOR_USE_BFC=false and then =true (the same order), in
its own cgroup (v1 or v2, whichever holds the memory controller) limited to --limit-mib
of RSS and page cache together. Without root or a usable cgroup the page cache cannot be
limited: the script says so and evicts the data's pages (posix_fadvise DONTNEED on our
files only) before every epoch instead. The data's pages are evicted before every child.

Per epoch: pairs/s to the last batch, user and system CPU ms per pair (getrusage of the
child), peak RSS of that epoch (VmHWM, reset at the start of each epoch), MiB the child
read from the block device (/proc/self/io), and the rate as a ratio of the bare read of
the same shards with the same allocator.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _trees
from _common import drop_pages, markdown_table

CASES = {  # name: (side, channels, batch)
    "rgb512": (512, 3, 32),
    "gray1024": (1024, 1, 8),
}
DISTINCT = 48  # distinct generated pairs per case; the rest are hard links to them
ENCODINGS = ("raw", "deflate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/tfshards-bench-22"))
    parser.add_argument("--limit-mib", type=int, default=1536, help="memory limit (MiB)")
    parser.add_argument("--factor", type=float, default=3.0, help="raw shards / limit")
    parser.add_argument("--cases", default="rgb512,gray1024")
    parser.add_argument("--allocators", default="false,true", help="TF_CPU_ALLOCATOR_USE_BFC")
    parser.add_argument("--stream-epochs", type=int, default=2)
    parser.add_argument("--cached-epochs", type=int, default=3)
    parser.add_argument("--long-epochs", type=int, default=5, help="RSS-flatness runs")
    parser.add_argument("--no-hand", action="store_true", help="skip the hand-written rows")
    parser.add_argument(
        "--knobs", action="store_true", help="only the reader-knob rows (raw, stream)"
    )
    parser.add_argument("--encodings", default=",".join(ENCODINGS))
    parser.add_argument("--pairs", type=int, help="pairs per case (default: from --factor)")
    parser.add_argument(
        "--against", help="git revisions (comma-separated) whose readers run beside this one"
    )
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3 with --against)")
    parser.add_argument(
        "--rows", help="only these reader rows, e.g. stream:float32,cached:uint8 (bare always)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    run(args)


# ---------------------------------------------------------------- parent: data and jobs


def prepare(root: Path, case: str, args: argparse.Namespace) -> tuple[Path, int]:
    """Generate one case once (kept under root for reruns); return its folder."""
    import tfshards

    side, channels, _ = CASES[case]
    pair_mib = side * side * (channels + 1) / 2**20
    count = args.pairs or int(args.limit_mib * args.factor / pair_mib * 1.02) + 1
    folder = root / f"{case}-{count}"
    distinct = folder / "distinct"
    if not (distinct / "masks").is_dir():
        tfshards.synth(distinct, count=DISTINCT, size=side, channels=channels, seed=0)
    for kind in ("images", "masks"):
        (folder / "data" / kind).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            link = folder / "data" / kind / f"{index:06d}.png"
            if not link.exists():
                os.link(distinct / kind / f"{index % DISTINCT:05d}.png", link)
    return folder, count


def converted(folder: Path, tree: Path, label: str, encoding: str, channels: int) -> Path:
    """The case's shards converted by ``tree``'s own tfshards (in a child process), once."""
    out = folder / label / encoding
    if not (out / "tfshards.json").exists():
        data = folder / "data"
        _trees.run_in(tree, (
            "import tfshards\n"
            f"tfshards.convert({str(data / 'images')!r}, {str(data / 'masks')!r}, "
            f"{str(out)!r}, encoding={encoding!r}, channels={channels}, overwrite=True, "
            "progress=False)\n"
        ))  # fmt: skip
    return out


def evict(folder: Path) -> None:
    """Drop the page cache of every file under folder (ours only; nothing system-wide)."""
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            drop_pages(path)


class MemoryCgroup:
    """A child cgroup of this process's own, limited to limit bytes; v1 or v2."""

    def __init__(self, limit: int) -> None:
        self.limit, self.path, self.version = limit, None, None
        if os.geteuid() != 0:
            return
        for version, mount, ident in (
            (2, Path("/sys/fs/cgroup"), "0::"),
            (1, Path("/sys/fs/cgroup/memory"), "memory"),
        ):
            own = _own_cgroup(ident)
            if own is None:
                continue
            controllers = _read(mount / own.lstrip("/") / "cgroup.subtree_control")
            if version == 2 and "memory" not in controllers:
                continue
            if version == 1 and not (mount / "memory.limit_in_bytes").exists():
                continue
            self.version, self.parent = version, mount / own.lstrip("/")
            return

    @property
    def usable(self) -> bool:
        return self.version is not None

    def create(self, name: str) -> Path:
        path = self.parent / name
        path.mkdir()
        if self.version == 1:
            (path / "memory.limit_in_bytes").write_text(str(self.limit))
            swap = path / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(self.limit))
        else:
            (path / "memory.max").write_text(str(self.limit))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
        self.path = path
        return path

    def oom_kills(self) -> int:
        control = self.path / ("memory.oom_control" if self.version == 1 else "memory.events")
        for line in _read(control).splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def peak_mib(self) -> float | None:
        """The cgroup's peak charge (RSS + page cache charged to it) over the whole child."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        text = _read(self.path / name).strip()
        return int(text) / 2**20 if text.isdigit() else None

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _own_cgroup(ident: str) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if ident == "0::" and line.startswith("0::"):
            return line[3:]
        parts = line.split(":", 2)
        if ident != "0::" and ident in parts[1].split(","):
            return parts[2]
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def jobs(case: str, folder: Path, allocator: str, args: argparse.Namespace) -> list[dict]:
    """The rows of one case: bare, then each reader row (``--rows``) per encoding; shards
    are the ones this checkout ("here") converted; ``with_tree`` swaps in another's."""
    side, channels, batch = CASES[case]
    base = {"case": case, "side": side, "channels": channels, "batch": batch, "bfc": allocator,
            "tree": "here", "tree_path": str(_trees.HERE)}  # fmt: skip
    wanted = args.rows.split(",") if args.rows else None
    out = []
    for encoding in args.encodings.split(","):
        shards = str(converted(folder, _trees.HERE, "here", encoding, channels))
        common = {**base, "encoding": encoding, "shards": shards}
        out.append({**common, "pipeline": "bare", "dtype": "bytes", "epochs": args.stream_epochs})
        for pipeline, epochs in (("stream", args.stream_epochs), ("cached", args.cached_epochs)):
            for dtype in ("uint8", "float32"):
                if wanted is None or f"{pipeline}:{dtype}" in wanted:
                    out.append({**common, "pipeline": pipeline, "dtype": dtype,
                                "epochs": epochs})  # fmt: skip
    return out


def with_tree(job: dict, folder: Path, tree: Path, label: str) -> dict:
    """The same row read by another tree's reader from shards that tree converted."""
    shards = converted(folder, tree, label, job["encoding"], job["channels"])
    return {**job, "tree": label, "tree_path": str(tree), "shards": str(shards)}


# Reader knobs for large records, one at a time from the defaults (see readers/options.py).
KNOBS = (
    {},
    {"read_buffer_bytes": 256 * 2**10},
    {"read_buffer_bytes": 4 * 2**20},
    {"read_buffer_bytes": 16 * 2**20},
    {"cycle_length": 2},
    {"cycle_length": 4},
    {"parse_batch_size": 16},
    {"shuffle_buffer": 16},
    {"batch": 8},  # not a ReadOptions field: read(batch_size=)
    {"batch": 16},
    {"ram_budget": 512 * 2**20},  # not a ReadOptions field: tf.data's autotune RAM budget
    {"ram_budget": 256 * 2**20},
)


def knob_jobs(bare: dict, allocator: str) -> list[dict]:
    """The bare read, then streaming float32 with each knob changed alone (raw records)."""
    bare = {**bare, "bfc": allocator, "epochs": 1}
    knobs = [{**bare, "pipeline": "stream", "dtype": "float32", "options": k} for k in KNOBS]
    # Five epochs of what fits a small machine: uint8 batches.
    flat = [{**bare, "pipeline": p, "dtype": "uint8", "epochs": 5, "long": True}
            for p in ("stream", "cached")]  # fmt: skip
    return [bare, *knobs, *flat]


def run(args: argparse.Namespace) -> None:
    args.root.mkdir(parents=True, exist_ok=True)
    cgroup = MemoryCgroup(args.limit_mib * 2**20)
    print(conditions(args, cgroup), flush=True)
    if args.against:
        return run_against(args, cgroup)
    rows = []
    for case in args.cases.split(","):
        folder, count = prepare(args.root, case, args)
        plan = [j for a in args.allocators.split(",") for j in jobs(case, folder, a, args)]
        print(sizes(case, folder, count, args), flush=True)
        if args.knobs:
            plan = knob_jobs(plan[0], args.allocators.split(",")[-1])
        if not args.no_hand and not args.knobs and CASES[case][1] == 3:
            plan.append({"case": case, "side": CASES[case][0], "channels": 3,
                         "batch": CASES[case][2], "bfc": "false", "encoding": "(PNG files)",
                         "shards": str(folder / "data"), "pipeline": "hand",
                         "dtype": "float32", "epochs": 2, "tree": "here",
                         "tree_path": str(_trees.HERE)})  # fmt: skip
        if args.long_epochs and not args.knobs:
            for pipeline in ("stream", "cached"):
                plan.append({**plan[0], "pipeline": pipeline, "dtype": "float32",
                             "bfc": args.allocators.split(",")[-1],
                             "epochs": args.long_epochs, "long": True})  # fmt: skip
        for job in plan:
            rows += run_child(job, folder, cgroup, args)
            add_ratios(rows)
            print(markdown_table(rows[-job["epochs"] :]) if rows else "", flush=True)
    print()
    print(markdown_table(rows))


def run_against(args: argparse.Namespace, cgroup: MemoryCgroup) -> None:
    """Each reader row for this checkout and for ``--against``, alternating which goes
    first round by round (the bare read once per round, on this checkout's shards)."""
    others = {label: tree for tree, label in
              (_trees.tree_of(rev, args.root) for rev in args.against.split(","))}  # fmt: skip
    rounds = args.rounds or 3
    print(f"here: {_trees.HERE}; {args.against}: {others}; {rounds} rounds", flush=True)
    rows = []
    for case in args.cases.split(","):
        folder, count = prepare(args.root, case, args)
        plan = [j for a in args.allocators.split(",") for j in jobs(case, folder, a, args)]
        print(sizes(case, folder, count, args, *others), flush=True)
        for number in range(1, rounds + 1):
            for job in plan:
                if job["pipeline"] == "bare":
                    order = [job]
                else:  # each round starts one tree later
                    order = [job, *(with_tree(job, folder, t, k) for k, t in others.items())]
                    turn = (number - 1) % len(order)
                    order = order[turn:] + order[:turn]
                for one in order:
                    new = run_child({**one, "round": number}, folder, cgroup, args)
                    rows += new
                    add_ratios(rows)
                    print(markdown_table(new) if new else "", flush=True)
    print()
    print(markdown_table(rows))
    table = compared(rows, list(others))
    print()
    print(markdown_table(table) if table else "no row finished an epoch")


def conditions(args: argparse.Namespace, cgroup: MemoryCgroup) -> str:
    if cgroup.usable:
        how = (f"each reader in its own cgroup v{cgroup.version} (under {cgroup.parent}), "
               f"limit {args.limit_mib} MiB of RSS + page cache")  # fmt: skip
    else:
        how = ("NO cgroup (not root, or no memory controller): the page cache could not be "
               "limited; the data's pages are evicted before every epoch instead")  # fmt: skip
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"{when}; {os.cpu_count()} cores (shared); {how}; "
            "data's pages evicted before every child (posix_fadvise)")  # fmt: skip


def sizes(case: str, folder: Path, count: int, args: argparse.Namespace, *labels: str) -> str:
    parts = []
    for label in ("here", *labels):
        for encoding in args.encodings.split(","):
            mib = sum(p.stat().st_size for p in (folder / label / encoding).glob("*")) / 2**20
            parts.append(f"{label} {encoding} {mib / 1024:.2f} GiB "
                         f"({mib / args.limit_mib:.1f}x the limit)")  # fmt: skip
    return f"{case}: {count} pairs; shards: " + ", ".join(parts)


def run_child(job: dict, folder: Path, cgroup: MemoryCgroup, args: argparse.Namespace) -> list:
    cache = args.root / "caches" / f"{job['case']}-{job['pipeline']}-{os.getpid()}"
    shutil.rmtree(cache, ignore_errors=True)
    evict(folder)
    job = {**job, "cache": str(cache), "evict_each_epoch": not cgroup.usable}
    env = _trees.env_of(Path(job["tree_path"]), TF_CPU_ALLOCATOR_USE_BFC=job["bfc"],
                        TF_CPP_MIN_LOG_LEVEL="3")  # fmt: skip
    group = cgroup.create(f"tfshards-bench-{os.getpid()}") if cgroup.usable else None
    procs = None if group is None else group / "cgroup.procs"

    def enter() -> None:
        if procs is not None:
            procs.write_text(str(os.getpid()))

    child_proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(job)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=enter,
    )  # fmt: skip
    out, err = child_proc.communicate()
    results = [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
    imported = [x[5:] for x in out.splitlines() if x.startswith("TREE ")]
    if imported and not imported[0].startswith(job["tree_path"]):
        raise SystemExit(f"the {job['tree']} row imported tfshards from {imported[0]}")
    killed = child_proc.returncode != 0
    oom = cgroup.oom_kills() if group is not None else 0
    peak = cgroup.peak_mib() if group is not None else None
    if group is not None:
        cgroup.remove()
    shutil.rmtree(cache, ignore_errors=True)
    rows = [{**row(job, r), "cgroup_peak_MiB": round(peak) if peak else ""} for r in results]
    if killed:
        why = f"killed by the OOM killer ({oom})" if oom else f"exit {child_proc.returncode}"
        if not oom:
            print(err[-2000:], file=sys.stderr)
        failed = row(job, {"epoch": len(results) + 1})
        rows.append({**failed, "pairs_per_s": why, "cgroup_peak_MiB": round(peak) if peak else ""})
    return rows


def row(job: dict, r: dict) -> dict:
    pairs = r.get("pairs", 0)
    per = (lambda ms: round(ms / pairs, 2)) if pairs else (lambda ms: "")
    return {
        "case": job["case"],
        "tree": job["tree"],
        "round": job.get("round", 1),
        "encoding": job["encoding"],
        "pipeline": job["pipeline"] + (" (long)" if job.get("long") else "") + _knobs(job),
        "dtype": job["dtype"],
        "BFC": job["bfc"],
        "epoch": r["epoch"],
        "pairs_per_s": round(pairs / r["seconds"]) if pairs else "",
        "vs_bare": "",
        "user_ms_per_pair": per(r.get("user_ms", 0)),
        "sys_ms_per_pair": per(r.get("sys_ms", 0)),
        "peak_rss_MiB": round(r["peak_rss_mib"]) if "peak_rss_mib" in r else "",
        "disk_read_MiB": round(r["read_mib"]) if "read_mib" in r else "",
    }


def _knobs(job: dict) -> str:
    options = job.get("options") or {}
    return "".join(f" {k}={v}" for k, v in options.items())


def add_ratios(rows: list[dict]) -> None:
    bare = {}
    for r in rows:  # the bare read of this checkout's shards
        if r["pipeline"] == "bare" and isinstance(r["pairs_per_s"], int) and r["tree"] == "here":
            bare.setdefault((r["case"], r["encoding"], r["BFC"]), []).append(r["pairs_per_s"])
    for r in rows:
        rates = bare.get((r["case"], r["encoding"], r["BFC"]))
        if rates and isinstance(r["pairs_per_s"], int):
            r["vs_bare"] = round(r["pairs_per_s"] / (sum(rates) / len(rates)), 2)


def compared(rows: list[dict], labels: list[str]) -> list[dict]:
    """Per row and phase (streamed epochs; a cache's build, then its reads): each tree's
    median pairs/s over rounds (min-max), the median of the per-round ratios here / other,
    each tree's median against the bare read, and each tree's largest peak RSS."""
    groups: dict[tuple, dict[str, dict[int, list]]] = {}
    for r in rows:
        if not isinstance(r["pairs_per_s"], int):
            continue
        phase = "build" if r["pipeline"] == "cached" and r["epoch"] == 1 else "read"
        key = (r["case"], r["encoding"], r["pipeline"], r["dtype"], r["BFC"], phase)
        rounds = groups.setdefault(key, {}).setdefault(r["tree"], {})
        rounds.setdefault(r["round"], []).append((r["pairs_per_s"], r["peak_rss_MiB"]))
    bare = {k[:2] + k[4:5]: v for k, v in groups.items() if k[2] == "bare"}
    out = []
    for key, trees in groups.items():
        case, encoding, pipeline, dtype, bfc, phase = key
        per_round = {t: {n: statistics.mean(p for p, _ in v) for n, v in rs.items()}
                     for t, rs in trees.items()}  # fmt: skip
        bare_rate = _median((bare.get((case, encoding, bfc)) or {}).get("here", {}), 0)
        name = f"{pipeline} {dtype}" + (f" ({phase})" if pipeline == "cached" else "")
        line = {"case": case, "encoding": encoding, "BFC": bfc, "row": name}
        for tree in ("here", *labels):
            rates = per_round.get(tree, {})
            line[f"{tree} pairs/s"] = _spread(list(rates.values()))
            line[f"{tree} vs bare"] = (
                round(statistics.median(rates.values()) / bare_rate, 2)
                if rates and bare_rate
                else ""
            )
            peaks = [p for v in trees.get(tree, {}).values() for _, p in v if p != ""]
            line[f"{tree} peak RSS MiB"] = max(peaks) if peaks else ""
        here = per_round.get("here", {})
        for label in labels:
            other = per_round.get(label, {})
            ratios = [here[n] / other[n] for n in here if n in other and other[n]]
            line[f"here / {label}"] = _spread(ratios, digits=2)
        out.append(line)
    return out


def _median(by_round: dict, default: float) -> float:
    rates = [statistics.mean(p for p, _ in v) for v in by_round.values()]
    return statistics.median(rates) if rates else default


def _spread(values: list[float], digits: int = 0) -> str:
    """median (min-max), or "" for none."""
    if not values:
        return ""
    fmt = (lambda v: f"{v:.{digits}f}") if digits else (lambda v: f"{round(v)}")
    low, mid, high = min(values), statistics.median(values), max(values)
    return fmt(mid) + (f" ({fmt(low)}-{fmt(high)})" if len(values) > 1 else "")


# ---------------------------------------------------------------- child: one reader


def dataset(job: dict):
    import tfshards
    from tfshards.benchmarking.baselines import ceiling_pipeline, keras_pipeline

    batch = job["batch"]
    if job["pipeline"] == "bare":
        return ceiling_pipeline(Path(job["shards"]), batch_size=batch)
    if job["pipeline"] == "hand":
        Path(job["cache"]).mkdir(parents=True, exist_ok=True)
        side = job["side"]
        return keras_pipeline(Path(job["shards"]), (side, side), Path(job["cache"]) / "hand",
                              channels=job["channels"], batch_size=batch)  # fmt: skip
    cache = job["cache"] if job["pipeline"] == "cached" else None
    knobs = dict(job.get("options") or {})
    batch, ram_budget = knobs.pop("batch", batch), knobs.pop("ram_budget", None)
    options = tfshards.ReadOptions(**knobs) if knobs else None
    ds = tfshards.read(
        job["shards"],
        batch_size=batch,
        image_dtype=job["dtype"],
        cache=cache,
        options=options,
        seed=0,
    )
    if ram_budget:  # what a user can set on the dataset read() returns
        import tensorflow as tf

        budget = tf.data.Options()
        budget.autotune.ram_budget = ram_budget
        ds = ds.with_options(budget)
    return ds


def child(job: dict) -> None:
    import tfshards

    print("TREE " + tfshards.__file__, flush=True)  # the parent checks which tree ran
    ds = dataset(job)
    for epoch in range(1, job["epochs"] + 1):
        if job["evict_each_epoch"]:
            evict(Path(job["shards"]))
            if Path(job["cache"]).exists():
                evict(Path(job["cache"]))
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        print("RESULT " + json.dumps({"epoch": epoch, **one_epoch(ds)}), flush=True)


def one_epoch(ds) -> dict:
    read0, before = _read_bytes(), resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    pairs, last, usage = 0, started, before
    for batch in ds:
        pairs += int(batch[0].shape[0] if isinstance(batch, tuple | list) else batch.shape[0])
        last, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    status = Path("/proc/self/status").read_text().splitlines()
    hwm = next(int(x.split()[1]) for x in status if x.startswith("VmHWM:"))
    return {
        "pairs": pairs,
        "seconds": last - started,
        "user_ms": 1000 * (usage.ru_utime - before.ru_utime),
        "sys_ms": 1000 * (usage.ru_stime - before.ru_stime),
        "peak_rss_mib": hwm / 1024,
        "read_mib": (_read_bytes() - read0) / 2**20,
    }


def _read_bytes() -> int:
    for line in _read(Path("/proc/self/io")).splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


if __name__ == "__main__":
    main()
