"""The serial share of a read: the part of its CPU time spent in Python (one thread at a time).

Decision: the measure behind docs/larger-than-ram.md's "On a machine with many cores"
(issue 44 point 4): how far a read can grow with cores when only one thread at a time
runs Python.
Run: 2026-12-07. Recorded result: the default read (deflate, float32, streamed) 0.15 at
256x256 and 0.07 at 512x512; raw and cached reads 0.14-0.40 (the most at 256x256 raw).
Raw output: results/serial_share.md here; table in benchmarks/README.md, "Serial share
of a read".

    python benchmarks/studies/serial_share.py [--pairs-256 1500] [--pairs-512 400]

Method. Work that holds the GIL runs one thread at a time however many cores there are;
everything else a read does (TensorFlow's ops, file reads, NumPy copies, zlib) can run
beside it. By Amdahl's law a read whose GIL-holding time is a share ``s`` of its CPU
time grows at most ``1 / s`` times with cores, so ``s = GIL-held seconds / process CPU
seconds`` over timed epochs, in a fresh process per row. GIL-held seconds: a sampler
thread written in C (compiled here with gcc against CPython 3.11's internal headers)
reads CPython's own "GIL taken" flag (``_PyRuntime.ceval.gil.locked``) every 20-100 us,
at random intervals, at real-time priority (``SCHED_FIFO``, so it samples evenly in
time on a busy machine; needs root), and the share of samples that found it taken,
times the wall time, is the GIL-held time of every thread: the reader's py_function
bodies, TensorFlow's calls into Python, and the consumer's loop
(``for image, mask in dataset``, which Keras ``fit`` replaces in training). Checked
against threads that hold the GIL a known share of the time (``--check``): 0.505 read
0.511, 0.182 read 0.184, 0.053 read 0.055 (holds of 2, 0.2 and 0.1 ms).
Run it on a quiet machine: the share is of wall time, and a thread that the kernel
preempts while it holds the GIL keeps it through its wait for a core. Inflating one
512x512 record (ISA-L, into a buffer of the right size) held the GIL 0.3-0.7% of the
time with the machine quiet and 19-20% with 6 runnable threads on its 2 cores.
``taskset`` runs over 1 and 2 cores mislead on this VM for reads that move memory
(issue 44); this needs neither. Tried first and dropped: gilknocker's contention
metric (0.008 for a thread holding the GIL 19% of the time in 0.2 ms holds), py-spy's
``--gil`` sampling (about half the true share), the same sampler without real-time
priority (0.14 for 0.19: it was scheduled less while the GIL holder ran), and the
wall time of py_function calls (it counts their GIL-free parts; shares above 1).

Rows: 256x256 and 512x512 RGB synth pairs, raw and deflate records, uint8 and float32
images, batch 32, read from shards in the page cache ("warm") and from a built disk
cache (``cache=True``, epochs after the one that builds it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _benchmarks_path  # noqa: F401  (benchmarks/ on sys.path)
from _common import markdown_table

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
BATCH = 32
CONSUMERS = ("graph", "python")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs-256", type=int, default=1500, help="256x256 pairs (1500)")
    parser.add_argument("--pairs-512", type=int, default=400, help="512x512 pairs (400)")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per row (3)")
    parser.add_argument("--root", type=Path, help="keep the datasets here (default: a tmp dir)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # JSON job of one row
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(json.loads(args.child))))
        return
    with tempfile.TemporaryDirectory(prefix="tfshards-serial-") as tmp:
        root = args.root or Path(tmp)
        rows = []
        for side, pairs in ((256, args.pairs_256), (512, args.pairs_512)):
            for encoding in ("raw", "deflate"):
                path = dataset(root, side, pairs, encoding)
                for source in ("warm", "cache"):
                    for dtype in ("uint8", "float32"):
                        job = dict(path=str(path), dtype=dtype, source=source)
                        job.update(epochs=args.epochs, cache=str(root / "caches"))
                        results = {c: run_child({**job, "consumer": c}) for c in CONSUMERS}
                        rows.append(row(side, encoding, source, dtype, results))
                        print(markdown_table(rows[-1:]), flush=True)
        print(markdown_table(rows))


def dataset(root: Path, side: int, pairs: int, encoding: str) -> Path:
    """A converted synth dataset (made once per root)."""
    import tfshards
    from tfshards.converters.synth import synth

    out = root / f"{side}-{encoding}"
    if (out / "tfshards.json").exists():
        return out
    images, masks = synth(root / f"folders-{side}", count=pairs, size=side)
    tfshards.convert(images, masks, out, encoding=encoding, val_fraction=0.0)
    return out


def run_child(job: dict) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(job)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def row(side: int, encoding: str, source: str, dtype: str, results: dict) -> dict:
    """One table row: the rate, CPU and GIL time of the graph consumer, and the serial
    share with each consumer (median and min-max over the epochs)."""
    graph = results["graph"]
    cells = {
        "pairs": f"{side}x{side} {encoding}",
        "read": f"{source} {dtype}",
        "pairs/s": round(statistics.median(graph["rates"])),
        "CPU ms/pair": round(statistics.median(graph["cpu_ms"]), 3),
        "GIL ms/pair": round(statistics.median(graph["gil_ms"]), 3),
    }
    for consumer, result in results.items():
        shares = result["serial_shares"]
        cells[f"serial share, {consumer} consumer"] = (
            f"{statistics.median(shares):.3f} ({min(shares):.3f}-{max(shares):.3f})"
        )
    return cells


def measure(job: dict) -> dict:
    """One row, in this (fresh) process: a warm-up epoch, then timed epochs."""
    import tfshards

    sampler = GilSampler(Path(job["cache"]).parent)
    cache = Path(job["cache"]) if job["source"] == "cache" else None
    dataset = tfshards.read(
        job["path"], batch_size=BATCH, image_dtype=job["dtype"], cache=cache, seed=0
    )
    epoch(dataset, "python")  # page cache warm; builds the disk cache when there is one
    result = dict(rates=[], cpu_ms=[], gil_ms=[], serial_shares=[])
    for _ in range(job["epochs"]):
        with sampler:
            wall, cpu, pairs = epoch(dataset, job["consumer"])
        held = sampler.share * wall
        result["rates"].append(pairs / wall)
        result["cpu_ms"].append(cpu / pairs * 1000)
        result["gil_ms"].append(held / pairs * 1000)
        result["serial_shares"].append(held / cpu)
    return result


SAMPLER_C = r"""
#define Py_BUILD_CORE 1
#include <Python.h>
#include "internal/pycore_runtime.h"
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
static volatile int running = 0;
static pthread_t sampler;
static volatile long long samples = 0, held = 0;
static void *sample(void *unused) {
    unsigned int seed = 12345;
    prctl(PR_SET_TIMERSLACK, 1UL);
    while (running) {
        struct timespec pause = {0, 20000 + rand_r(&seed) % 80000};
        samples++;
        if (_Py_atomic_load_relaxed(&_PyRuntime.ceval.gil.locked) == 1) held++;
        nanosleep(&pause, NULL);
    }
    return NULL;
}
int gil_start(void) {
    samples = held = 0;
    running = 1;
    int failed = pthread_create(&sampler, NULL, sample, NULL);
    if (failed) return failed;
    struct sched_param realtime = {1};
    return pthread_setschedparam(sampler, SCHED_FIFO, &realtime);
}
void gil_stop(void) { running = 0; pthread_join(sampler, NULL); }
long long gil_samples(void) { return samples; }
long long gil_held(void) { return held; }
"""


class GilSampler:
    """``with sampler:`` samples whether any thread holds the GIL; ``.share`` after."""

    def __init__(self, folder: Path) -> None:
        import ctypes
        import sysconfig

        if sys.version_info[:2] != (3, 11):
            raise SystemExit("serial_share.py reads CPython 3.11's GIL state; run it on 3.11")
        include = sysconfig.get_paths()["include"]
        source, library = folder / "gil_sampler.c", folder / f"gil_sampler-{os.getpid()}.so"
        source.write_text(SAMPLER_C)
        command = ["gcc", "-O2", "-shared", "-fPIC", f"-I{include}", f"-I{include}/internal"]
        subprocess.run([*command, "-o", str(library), str(source), "-lpthread"], check=True)
        self._lib = ctypes.CDLL(str(library))
        self._lib.gil_samples.restype = self._lib.gil_held.restype = ctypes.c_longlong
        self.share = 0.0

    def __enter__(self) -> GilSampler:
        if self._lib.gil_start() != 0:
            raise SystemExit("the sampler needs real-time priority (SCHED_FIFO): run as root")
        return self

    def __exit__(self, *exc) -> None:
        self._lib.gil_stop()
        self.share = self._lib.gil_held() / max(self._lib.gil_samples(), 1)


def epoch(dataset, consumer: str) -> tuple[float, float, int]:
    """Wall seconds, process CPU seconds and pairs of one pass over ``dataset``: in a
    Python loop, or inside TensorFlow (``reduce``: no Python per batch, as in Keras
    ``fit``, whose step function pulls the next batch inside its graph)."""
    import tensorflow as tf

    wall, cpu, pairs = time.perf_counter(), time.process_time(), 0
    if consumer == "graph":
        pairs = int(dataset.reduce(tf.constant(0), lambda n, batch: n + tf.shape(batch[0])[0]))
    else:
        for image, _ in dataset:
            pairs += int(image.shape[0])
    return time.perf_counter() - wall, time.process_time() - cpu, pairs


if __name__ == "__main__":
    main()
