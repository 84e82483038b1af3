"""Large images (issue 46, point 3): one large RGB tiled BigTIFF and its mask converted by
tiles, against the same pixels as ordinary 512x512 PNG pairs.

Compares: peak RSS of converting a --size x --size RGB tiled BigTIFF (default 40000: 4.5
GiB decoded) with its mask, with the default settings and ``--tile 512``, in a memory
cgroup, with the 1 GiB target; its seconds per megapixel with converting the same pixels
as 512x512 PNG pairs (target: within 1.5x).
Takes: about a minute at ``--size 8192``; tens of minutes and about 18 GiB of disk in
--root at the default 40000 on 2 cores.

The BigTIFF is written with tifffile in 256x256 deflate tiles, its mask a tiled TIFF of
class indices; the files are the same pixels cut into (size // 512)^2 PNG pairs. Each is
converted in a fresh child process, placed in a cgroup limited to --limit-mib (default
1024) where this runs as root with cgroup v1 or v2, else in none (the row says so). Rows:
seconds, megapixels/s, process CPU ms per megapixel (workers included), the child's peak
RSS (its own and its largest worker's, VmHWM), the cgroup's peak charge (RSS and page
cache), and the ratio of seconds per megapixel (BigTIFF / files).

    python benchmarks/large_images.py --size 8192
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import markdown_table
from PIL import Image

TILE = 512  # the ordinary files' size, and the conversion's tile size
_SEGMENT = 256  # the BigTIFF's own tiles


def pixels(row: int, column: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The image (uint8 RGB) and mask (classes 0..2) of a window of the synthetic slide:
    smooth gradients with noise (compressible as photos are) and blocky classes."""
    rows = np.arange(row, row + height, dtype=np.int64)[:, None]
    columns = np.arange(column, column + width, dtype=np.int64)[None, :]
    noise = np.random.default_rng(row * 1_000_003 + column).integers(0, 24, (height, width, 3))
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = (rows // 7 + noise[..., 0]) % 256
    image[..., 1] = (columns // 5 + noise[..., 1]) % 256
    image[..., 2] = ((rows + columns) // 11 + noise[..., 2]) % 256
    mask = ((rows // 97 + columns // 131) % 3).astype(np.uint8)
    return image, mask


def write_bigtiff(folder: Path, size: int) -> None:
    import tifffile

    for sub in ("images", "masks"):
        (folder / sub).mkdir(parents=True, exist_ok=True)

    def segments(part: int):
        for row in range(0, size, _SEGMENT):
            for column in range(0, size, _SEGMENT):
                height, width = min(_SEGMENT, size - row), min(_SEGMENT, size - column)
                tile = pixels(row, column, height, width)[part]
                padded = np.zeros((_SEGMENT, _SEGMENT, *tile.shape[2:]), np.uint8)
                padded[:height, :width] = tile
                yield padded

    layout = {"tile": (_SEGMENT, _SEGMENT), "compression": "zlib", "bigtiff": True}
    tifffile.imwrite(folder / "images" / "slide.tif", segments(0), shape=(size, size, 3),
                     dtype=np.uint8, photometric="rgb", **layout)  # fmt: skip
    tifffile.imwrite(folder / "masks" / "slide.tif", segments(1), shape=(size, size),
                     dtype=np.uint8, **layout)  # fmt: skip


def write_files(folder: Path, size: int) -> int:
    """The same pixels as 512x512 PNG pairs (the whole ones: size // 512 per side)."""
    for sub in ("images", "masks"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    count = 0
    for row in range(0, size - TILE + 1, TILE):
        for column in range(0, size - TILE + 1, TILE):
            image, mask = pixels(row, column, TILE, TILE)
            name = f"r{row:06d}_c{column:06d}.png"
            Image.fromarray(image).save(folder / "images" / name, compress_level=1)
            Image.fromarray(mask).save(folder / "masks" / name, compress_level=1)
            count += 1
    return count


CHILD = """
import json, resource, sys, time
import tfshards
job = json.loads(sys.argv[1])
start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
manifest = tfshards.convert(job["images"], job["masks"], job["out"], progress=False,
                            num_classes=3, workers=job["workers"], **job["settings"])
seconds = time.perf_counter() - start
own = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print("RESULT " + json.dumps({"seconds": seconds, "records": manifest.total_records,
      "cpu": own.ru_utime + own.ru_stime - cpu.ru_utime - cpu.ru_stime
             + kids.ru_utime + kids.ru_stime,
      "peak_mib": peak / 1024, "worker_peak_mib": kids.ru_maxrss / 1024}))
"""


def convert_in_cgroup(job: dict, limit_mib: int) -> dict:
    """One conversion in a fresh process, in a memory cgroup where one can be made."""
    from larger_than_ram import MemoryCgroup

    cgroup = MemoryCgroup(limit_mib * 2**20)
    group = cgroup.create(f"tfshards-large-{os.getpid()}") if cgroup.usable else None

    def enter() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True,
                          text=True, env=env, preexec_fn=enter, check=False)  # fmt: skip
    result = {"cgroup_peak_mib": "", "oom_kills": ""}
    if group is not None:
        peak = cgroup.peak_mib()
        result = {"cgroup_peak_mib": round(peak) if peak else "", "oom_kills": cgroup.oom_kills()}
        cgroup.remove()
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {**result, "failed": f"exit {done.returncode}: {done.stderr[-600:]}"}
    return {**result, **json.loads(lines[0][len("RESULT ") :])}


def row(name: str, result: dict, megapixels: float, cgroup: str) -> dict:
    if "failed" in result:
        return {"input": name, "megapixels": round(megapixels), "records": result["failed"]}
    return {
        "input": name,
        "megapixels": round(megapixels),
        "records": result["records"],
        "seconds": round(result["seconds"], 1),
        "MP_per_s": round(megapixels / result["seconds"], 2),
        "CPU_ms_per_MP": round(1000 * result["cpu"] / megapixels, 1),
        "peak_RSS_MiB": round(result["peak_mib"]),
        "worker_peak_RSS_MiB": round(result["worker_peak_mib"]),
        "cgroup": cgroup,
        "cgroup_peak_MiB": result["cgroup_peak_mib"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=40000, help="pixels per side (default 40000)")
    parser.add_argument("--limit-mib", type=int, default=1024, help="the cgroup's memory limit")
    parser.add_argument("--workers", type=int, default=None, help="conversion workers (default: "
                        "all cores, as convert's default)")  # fmt: skip
    parser.add_argument("--root", type=Path, default=Path("/tmp/tfshards-large-images"))
    parser.add_argument("--keep", action="store_true", help="keep --root's files afterwards")
    args = parser.parse_args()
    if args.size < TILE:
        parser.error(f"--size must be at least {TILE}")
    shutil.rmtree(args.root, ignore_errors=True)
    started = time.perf_counter()
    write_bigtiff(args.root / "slide", args.size)
    files = write_files(args.root / "files", args.size)
    print(f"inputs written in {time.perf_counter() - started:.0f} s: one {args.size}x{args.size} "
          f"BigTIFF pair; {files} 512x512 PNG pairs", flush=True)  # fmt: skip
    from larger_than_ram import MemoryCgroup

    cgroup = f"{args.limit_mib} MiB" if MemoryCgroup(1).usable else "none (not root or no cgroup)"
    jobs = [
        ("BigTIFF, --tile 512", "slide", {"tile_size": TILE}, args.size**2 / 1e6),
        ("512x512 PNG files", "files", {}, files * TILE * TILE / 1e6),
    ]
    rows = []
    for name, sub, settings, megapixels in jobs:
        job = {"images": str(args.root / sub / "images"), "masks": str(args.root / sub / "masks"),
               "out": str(args.root / f"out-{sub}"), "workers": args.workers,
               "settings": settings}  # fmt: skip
        rows.append(row(name, convert_in_cgroup(job, args.limit_mib), megapixels, cgroup))
        shutil.rmtree(args.root / f"out-{sub}", ignore_errors=True)
    if all("seconds" in r for r in rows):
        per = [r["seconds"] / r["megapixels"] for r in rows]
        rows[0]["s_per_MP_ratio"], rows[1]["s_per_MP_ratio"] = round(per[0] / per[1], 2), 1.0
    print(markdown_table(rows))
    if not args.keep:
        shutil.rmtree(args.root, ignore_errors=True)


if __name__ == "__main__":
    main()
