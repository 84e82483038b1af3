"""``convert_speed_memory.py --plan``: memory and time of the conversion plan (listing,
pairing, splits, shuffle) for many pairs, each size in a fresh process.

Pairing only needs names, so by default the two folders are listed from memory (the
listing function yields synthetic names, as a storage layer would); ``--tree`` writes a
real tree of empty files (two files per pair) and lists it from disk. A Markdown row per
size and version: seconds to list and pair, to plan, and bytes per pair: the peak RSS
growth of the process (listing included), what it holds after planning, and the plan's
arrays.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import gc, json, os, sys, time
from pathlib import Path
images, masks, count, tree = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
import numpy as np
from tfshards.converters import pairing, planning

def rss(field):
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) * 1024 for l in status if l.startswith(field))

def synthetic(root, storage_options=None):
    return (f"{i // 1000:04d}/{i:08d}.png" for i in range(count))

compact = hasattr(pairing, "list_names")
if not tree:
    if compact:
        pairing.list_names = synthetic
    else:  # the version before the compact plan listed with _walk_files, sorted
        pairing._walk_files = lambda root: sorted(synthetic(root))
gc.collect()
base = rss("VmRSS:")
started = time.perf_counter()
report = pairing.pair_files(images, masks)
paired = time.perf_counter()
pairs = report.pairs
sizes = np.full(len(pairs), 1000) if compact else {p.key: 1000 for p in pairs}
specs = planning.plan_shards(pairs, seed=0, val_fraction=0.1, test_fraction=0.1,
    compression="none", num_shards=None, shard_size=128 * 2**20, pair_bytes=sizes)
planned = time.perf_counter()
del sizes
gc.collect()
if compact:
    from tfshards.converters.pair_table import release_freed_memory
    release_freed_memory()  # as convert() does after planning
held = rss("VmRSS:") - base
peak = rss("VmHWM:") - base
arrays = pairs.nbytes + sum(s.pairs.rows.nbytes for s in specs) if compact else None
print("RESULT " + json.dumps({"pairs": len(pairs), "pair_s": paired - started,
    "plan_s": planned - paired, "peak": peak, "held": held, "arrays": arrays,
    "shards": len(specs)}))
"""


def _tree(root: Path, count: int) -> tuple[Path, Path]:
    for side in ("images", "masks"):
        for i in range(count):
            folder = root / side / f"{i // 1000:04d}"
            if i % 1000 == 0:
                folder.mkdir(parents=True)
            os.close(os.open(folder / f"{i:08d}.png", os.O_CREAT | os.O_WRONLY, 0o644))
    return root / "images", root / "masks"


def _run(src: Path, images: Path, masks: Path, count: int, tree: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(images), str(masks), str(count), str(int(tree))],
        capture_output=True,
        text=True,
        env=env,
        cwd=images.parent,  # not the checkout: -c puts the working folder first on sys.path
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    import json

    return json.loads(line[len("RESULT ") :])


def plan_rows(sources: dict[str, Path], counts: list[int], tree: bool) -> list[dict]:
    """One row per pair count and tfshards version (``sources``: name -> checkout)."""
    rows = []
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="tfshards-plan-") as tmp:
            if tree:
                images, masks = _tree(Path(tmp), count)
            else:
                images, masks = Path(tmp, "images"), Path(tmp, "masks")
                images.mkdir(), masks.mkdir()
            for name, src in sources.items():
                rows.append(_row(name, count, tree, _run(src, images, masks, count, tree)))
            shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _row(version: str, count: int, tree: bool, got: dict) -> dict:
    return {
        "version": version,
        "pairs": count,
        "listing": "files in /tmp" if tree else "in memory",
        "list_and_pair_s": round(got["pair_s"], 1),
        "plan_s": round(got["plan_s"], 1),
        "peak_rss_B_per_pair": round(got["peak"] / count),
        "held_rss_B_per_pair": round(got["held"] / count),
        "plan_arrays_B_per_pair": round(got["arrays"] / count) if got["arrays"] else "-",
        "shards": got["shards"],
    }
