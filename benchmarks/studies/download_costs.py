"""Where a shard download's CPU goes: receiving the body, the check, writing the file.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: Downloads from a bucket are checked by the shard's CRC-32C (the manifest's
``crc32c``), not its sha256, and streamed with botocore's body in 4 MiB reads
(``storage.download_hashed``).
Run: 2026-12-05. Recorded result: client CPU ms per 142 KB pair, medians of 3, user +
system: the download as shipped 0.088 + 0.110; without writing the file 0.065 + 0.027;
without the check 0.067 + 0.095; aiohttp's ``iter_any`` 0.110 + 0.105; 1 MiB reads
0.074 + 0.113; 16 MiB reads 0.086 + 0.105. Hashing 4 MiB: sha256 1.43 GB/s, CRC-32C
21.4 GB/s (an earlier ad-hoc run with two busy loops beside it: 0.51 and 5.7).
Raw output: benchmarks/README.md, "Downloads checked by CRC-32C".

    python benchmarks/studies/download_costs.py [--objects 8] [--repeats 3]

Starts moto's S3 server on 127.0.0.1 (tests/s3_server.py), puts ``--objects`` random
objects of 17.7 MB (a default shard of 2,000 256x256 pairs split 16 ways), then
downloads them with the same calls ``storage.download_hashed`` makes, varied one
thing at a time. CPU is this process's (the client's; the server's is not counted).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

OBJECT_BYTES = 17_700_000
PAIR_BYTES = 142_000  # a default (deflate) 256x256 RGB pair
VARIANTS = {  # name: (read size, or None for aiohttp's iter_any; check; write)
    "as shipped: 4 MiB reads, crc32c, write": (4 << 20, True, True),
    "no write": (4 << 20, True, False),
    "no check": (4 << 20, False, True),
    "aiohttp iter_any": (None, True, True),
    "1 MiB reads": (1 << 20, True, True),
    "16 MiB reads": (16 << 20, True, True),
}


async def download(fs, path: str, local: Path, read_size: int | None, check, write) -> int:
    from tfshards.storage import Crc32cDigest

    bucket, key, _ = fs.split_path(path)
    body = (await fs._call_s3("get_object", Bucket=bucket, Key=key))["Body"]
    digest, size = Crc32cDigest(), 0
    try:
        with open(local, "wb") as target:
            chunks = body.raw_stream.content.iter_any() if read_size is None else None
            while True:
                if chunks is not None:
                    chunk = await anext(chunks, b"")
                else:
                    chunk = await body.read(read_size)
                if not chunk:
                    return size
                if check:
                    digest.update(chunk)
                if write:
                    target.write(chunk)
                size += len(chunk)
    finally:
        body.close()


def cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=8, help="objects (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="passes (default 3)")
    args = parser.parse_args()
    from s3_server import s3_environment, start_moto

    server = start_moto()
    os.environ.update(s3_environment(server.endpoint))
    try:
        measure(args)
    finally:
        server.stop()


def measure(args: argparse.Namespace) -> None:
    import s3fs
    from fsspec.asyn import sync

    from tfshards import storage

    s3fs.S3FileSystem().mkdir("tfshards-study")
    paths = [f"tfshards-study/shard-{i}" for i in range(args.objects)]
    for path in paths:
        s3fs.S3FileSystem().pipe(path, os.urandom(OBJECT_BYTES))
    first = f"s3://{paths[0]}"
    fs, _ = storage._fresh(first, storage._download_options(first, None))
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            for name, (read_size, check, write) in VARIANTS.items():
                user, system = cpu()
                got = 0
                for path in paths:
                    local = Path(folder) / "shard"
                    got += sync(fs.loop, download, fs, path, local, read_size, check, write)
                    local.unlink()
                pairs = got / PAIR_BYTES
                after = cpu()
                results[name].append(
                    (1000 * (after[0] - user) / pairs, 1000 * (after[1] - system) / pairs)
                )
    print("| variant | user ms/pair | system ms/pair |")
    print("|---|---|---|")
    for name, passes in results.items():
        user = statistics.median(p[0] for p in passes)
        system = statistics.median(p[1] for p in passes)
        print(f"| {name} | {user:.3f} | {system:.3f} |")
    print(f"\nhash speeds, GB/s: {hash_speeds()}")


def hash_speeds() -> dict[str, float]:
    from tfshards.storage import DIGESTS

    data = os.urandom(4 << 20)
    speeds = {}
    for name, new in DIGESTS.items():
        started, rounds = time.perf_counter(), 0
        while time.perf_counter() - started < 1.0:
            new().update(data)
            rounds += 1
        speeds[name] = round(rounds * len(data) / (time.perf_counter() - started) / 1e9, 2)
    return speeds


if __name__ == "__main__":
    main()
