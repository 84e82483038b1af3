"""One process's read passes for ``object_storage.py --rows read``: local stream, cold
bucket, warm bucket, each pass's wall time and CPU split by process and user/system.

    python benchmarks/_bucket_read_passes.py LOCAL_SHARDS URL SCRATCH PASSES

Run with PYTHONPATH set to the tfshards tree to measure (the caller alternates trees).
The S3 server is the caller's: its environment (AWS_ENDPOINT_URL...) is inherited.
Prints one JSON line: {"local": [pass...], "cold": [...], "warm": [...]}, each pass
{"seconds", "main_user", "main_sys", "helper_user", "helper_sys"}; "helper" is the
shard cache's download process (a child of this one). Each kind starts with an untimed
pass (TensorFlow's kernels and graph caches; for cold, the helper's start as well).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

BATCH = 32
TICK = os.sysconf("SC_CLK_TCK")


def children_cpu() -> tuple[float, float]:
    """(user, system) seconds of this process's running children."""
    user = system = 0.0
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            user += int(fields[11]) / TICK
            system += int(fields[12]) / TICK
    return user, system


def timed(job) -> dict[str, float]:
    own, helper = os.times(), children_cpu()
    started = time.perf_counter()
    job()
    seconds = time.perf_counter() - started
    own2, helper2 = os.times(), children_cpu()
    return {
        "seconds": seconds,
        "main_user": own2.user - own.user,
        "main_sys": own2.system - own.system,
        "helper_user": helper2[0] - helper[0],
        "helper_sys": helper2[1] - helper[1],
    }


def read(location, shard_cache: Path):
    import tfshards

    options = tfshards.ReadOptions(shard_cache=shard_cache)
    return tfshards.read(location, batch_size=BATCH, seed=0, options=options)


def drain(dataset) -> int:
    return sum(int(images.shape[0]) for images, _ in dataset)


def main() -> None:
    local, url, scratch, passes = (
        Path(sys.argv[1]),
        sys.argv[2],
        Path(sys.argv[3]),
        int(sys.argv[4]),
    )
    results: dict[str, list[dict[str, float]]] = {"local": [], "cold": [], "warm": []}
    dataset = read(local, scratch / "unused")
    drain(dataset)
    results["local"] = [timed(lambda: drain(dataset)) for _ in range(passes)]
    for attempt in range(passes + 1):
        folder = scratch / f"cold-{attempt}"
        measured = timed(lambda f=folder: drain(read(url, f)))
        shutil.rmtree(folder)
        if attempt:
            results["cold"].append(measured)
    warm = read(url, scratch / "warm")
    drain(warm)
    results["warm"] = [timed(lambda: drain(warm)) for _ in range(passes)]
    shutil.rmtree(scratch / "warm")
    print("PASSES " + json.dumps(results))


if __name__ == "__main__":
    main()
