"""Random access by index (tfshards.Pairs) through PyTorch's DataLoader and Grain, against
tfshards.read (uint8) and the `tfrecord` package's loader, same shards, one run.

Compares: tfshards.Pairs under a DataLoader and under Grain against tfshards.read (uint8)
and the `tfrecord` package's DataLoader, raw and deflate records; with --fit, Keras fit
fed by Grain against fed by tfshards.read.
Takes: about 10 minutes at --count 2000 --size 256 --repeats 5 --breakdown --fit on 2
cores (torch, torchdata and grain installed: the test extra).

    python benchmarks/random_access.py --count 2000 --size 256

Rows, for raw and deflate records (uncompressed shards with .idx files), batches of 32,
2 worker processes wherever a loader has workers:
  pairs_dataloader  DataLoader(tfshards.Pairs, shuffle=True, num_workers=2), fork
  pairs_grain       MapDataset.source(Pairs).shuffle().batch(32), mp_prefetch 2 workers
  read_uint8        tfshards.read(image_dtype="uint8") (tf.data, shuffled, its defaults)
  tfrecord_package  the `tfrecord` package: one TFRecordDataset per shard (split between
                    the 2 workers by its index), chained, shuffle queue 256, a transform
                    that inflates and reshapes as its users write it
Each row runs in a spawned process of its own; its loader is made once (workers
persistent, as in training) and a pass reads one epoch's number of batches from it. The
rows take turns pass by pass (a noisy moment hits all of them), after one warm-up pass
each (which includes starting the workers); the page cache is warm. Reported: median
pairs/s, spread ((max - min) / median), CPU ms per pair (the row's process and its worker
processes, steadier than wall time on a shared machine), ratios.

--breakdown: microseconds per pair of each step of one Pairs read, in one process.
--fit: Keras 3 `fit` (TensorFlow backend) on a small model, steps/s, fed by Grain over
Pairs against fed by tfshards.read.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from _common import markdown_table

BATCH = 32
WORKERS = 2
ENCODINGS = ("raw", "deflate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="pairs (default 2000)")
    parser.add_argument("--size", type=int, default=256, help="image side (default 256)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per row")
    parser.add_argument("--breakdown", action="store_true", help="where a read's time goes")
    parser.add_argument("--fit", action="store_true", help="Keras fit: Grain vs read")
    parser.add_argument("--reuse", type=Path, help="keep the data and shards here")
    args = parser.parse_args()
    _absl_flags_parsed()
    if args.reuse:
        args.reuse.mkdir(parents=True, exist_ok=True)
        return run(args.reuse, args)
    with tempfile.TemporaryDirectory(prefix="tfshards-random-access-") as tmp:
        run(Path(tmp), args)


def _absl_flags_parsed() -> None:
    """Grain 0.2.18's workers read an Abseil flag unparsed when JAX is installed
    (google/grain#1355): a script not started by absl.app marks them parsed."""
    from absl import flags

    flags.FLAGS.mark_as_parsed()


def run(tmp: Path, args: argparse.Namespace) -> None:
    import tfshards

    if not (tmp / "data").is_dir():
        tfshards.synth(tmp / "data", count=args.count, size=args.size, seed=0)
    for encoding in ENCODINGS:
        if not (tmp / encoding / "tfshards.json").is_file():
            tfshards.convert(
                tmp / "data" / "images",
                tmp / "data" / "masks",
                tmp / encoding,
                encoding=encoding,
                compression="none",
                index=True,
                progress=False,
            )
    print(
        f"{args.count} pairs of {args.size}x{args.size} RGB + 1-channel masks, batch {BATCH}, "
        f"{WORKERS} workers, page cache warm, {os.cpu_count()} cores (shared); "
        f"median of {args.repeats} passes, spread = (max - min) / median, CPU of the loader's "
        "process and its workers"
    )
    rows = measure(tmp, args.repeats)
    print(markdown_table(rows))
    if args.breakdown:
        print()
        print(markdown_table([breakdown(tmp / e, e) for e in ENCODINGS]))
    if args.fit:
        print()
        print(markdown_table(fit_rows(tmp / "deflate", args.repeats)))


# ---------------------------------------------------------------- the loaders
# Each returns an endless iterator of batches, epoch after epoch, its workers started
# once (persistent), as in training: a pass reads one epoch's number of batches from it.


def pairs_dataloader(path: Path) -> Iterator:
    import torch
    from torch.utils.data import DataLoader

    import tfshards

    loader = DataLoader(
        tfshards.Pairs(path),
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        multiprocessing_context="fork",
        persistent_workers=True,
        generator=torch.Generator().manual_seed(0),
    )
    return itertools.chain.from_iterable(itertools.repeat(loader))


def pairs_grain(path: Path) -> Iterator:
    import grain

    import tfshards

    batches = grain.MapDataset.source(tfshards.Pairs(path)).shuffle(seed=0).repeat().batch(BATCH)
    return iter(batches.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(WORKERS)))


def read_uint8(path: Path) -> Iterator:
    import tfshards

    return iter(tfshards.read(path, batch_size=BATCH, image_dtype="uint8", seed=0, repeat=True))


def tfrecord_package(path: Path) -> Iterator:
    from tfrecord.torch.dataset import TFRecordDataset
    from torch.utils.data import ChainDataset, DataLoader

    from tfshards.schemas import Manifest

    shards = Manifest.load(path).splits["train"].shards
    description = {
        "image/encoded": "byte",
        "mask/encoded": "byte",
        "image/height": "int",
        "image/width": "int",
        "image/channels": "int",
    }
    readers = [
        TFRecordDataset(
            str(path / s.file),
            str(path / f"{s.file}.idx"),
            description,
            shuffle_queue_size=256,
            transform=_tfrecord_transform,
        )
        for s in shards
    ]
    loader = DataLoader(
        ChainDataset(readers), batch_size=BATCH, num_workers=WORKERS, persistent_workers=True
    )
    return itertools.chain.from_iterable(itertools.repeat(loader))


def _tfrecord_transform(features: dict) -> tuple[np.ndarray, np.ndarray]:
    """What a user of the tfrecord package writes: inflate (deflate records), reshape."""
    import zlib

    height, width = int(features["image/height"][0]), int(features["image/width"][0])
    channels = int(features["image/channels"][0])
    image, mask = bytes(features["image/encoded"]), bytes(features["mask/encoded"])
    if len(image) != height * width * channels:
        image, mask = zlib.decompress(image), zlib.decompress(mask)
    image = np.frombuffer(image, np.uint8).reshape(height, width, channels)
    return image, np.frombuffer(mask, np.uint8).reshape(height, width, 1)


LOADERS: dict[str, Callable[[Path], Iterator]] = {
    "pairs_dataloader": pairs_dataloader,
    "pairs_grain": pairs_grain,
    "read_uint8": read_uint8,
    "tfrecord_package": tfrecord_package,
}


# ---------------------------------------------------------------- timing


def one_pass(batches: Iterator, count: int) -> int:
    """Pairs in the next ``count`` batches."""
    return sum(len(batch[0]) for batch in itertools.islice(batches, count))


def measure(tmp: Path, repeats: int) -> list[dict]:
    """Each row in a spawned process of its own (only its framework imported: the
    tfrecord package's protos clash with TensorFlow's in one process), the rows taking
    turns pass by pass."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    servers = {}
    for encoding in ENCODINGS:
        for name in LOADERS:
            mine, theirs = context.Pipe()
            process = context.Process(target=_row_server, args=(theirs, name, str(tmp / encoding)))
            process.start()
            servers[(encoding, name)] = (mine, process)
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in servers}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in servers}
    try:
        for epoch in range(repeats + 1):  # pass 0 warms up every row
            for key, (connection, _) in servers.items():
                connection.send(epoch)
                pairs, seconds, cpu_seconds = connection.recv()
                if epoch:
                    rates[key].append(pairs / seconds)
                    cpu[key].append(cpu_seconds / pairs * 1e3)
    finally:
        for connection, process in servers.values():
            with contextlib.suppress(OSError):
                connection.send(None)
            process.join(30)
            if process.exitcode is None:
                process.kill()
    return [_rate_row(key, rates, cpu) for key in rates]


def _row_server(connection, name: str, path: str) -> None:
    _absl_flags_parsed()
    from tfshards.schemas import Manifest

    batches = LOADERS[name](Path(path))
    per_epoch = -(-Manifest.load(path).splits["train"].records // BATCH)
    while connection.recv() is not None:
        start, cpu = time.perf_counter(), _cpu_seconds()
        pairs = one_pass(batches, per_epoch)
        connection.send((pairs, time.perf_counter() - start, _cpu_seconds() - cpu))


def _cpu_seconds() -> float:
    """User + system CPU of this process and of its child processes (the loaders'
    workers live across passes, so RUSAGE_CHILDREN, which counts the exited, misses
    them): /proc/<pid>/stat fields utime, stime, cutime, cstime."""
    own = os.times()
    total = own.user + own.system
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == os.getpid():  # fields[1]: the parent's pid
            total += sum(int(v) for v in fields[11:15]) / tick
    return total


def _rate_row(key: tuple[str, str], rates: dict, cpu: dict) -> dict:
    encoding, name = key
    values = rates[key]
    median = statistics.median(values)
    row = {"encoding": encoding, "loader": name, "pairs/s": round(median)}
    row["spread"] = f"{(max(values) - min(values)) / median:.0%}"
    row["CPU ms/pair"] = f"{statistics.median(cpu[key]):.3f}"
    for other in ("read_uint8", "tfrecord_package"):
        base = statistics.median(rates[(encoding, other)])
        row[f"x {other}"] = f"{median / base:.2f}"
    return row


def breakdown(path: Path, encoding: str, count: int = 1000) -> dict:
    """Microseconds per pair of each step of a Pairs read, one process, random order."""
    import tfshards
    from tfshards.schemas.record import decode_record
    from tfshards.sources.pairs import _parsed  # Pairs' own parsing step

    pairs = tfshards.Pairs(path)
    order = np.random.default_rng(0).permutation(len(pairs))[:count]
    pairs.records.read(order)  # open the shards, load the offsets
    steps = {"read+CRC": 0.0, "parse": 0.0, "decode+copy": 0.0, "collate (np.stack)": 0.0}
    for start in range(0, len(order), BATCH):
        batch = order[start : start + BATCH]
        t0 = time.perf_counter()
        data = pairs.records.read(batch)
        t1 = time.perf_counter()
        parsed = [_parsed(d) for d in data]
        t2 = time.perf_counter()
        decoded = [decode_record(p) for p in parsed]
        images = [d.image if d.image.flags.writeable else d.image.copy() for d in decoded]
        masks = [d.mask if d.mask.flags.writeable else d.mask.copy() for d in decoded]
        t3 = time.perf_counter()
        np.stack(images), np.stack(masks)
        t4 = time.perf_counter()
        for step, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            steps[step] += seconds
    row = {"encoding": encoding}
    row.update({f"{k} us": round(v / len(order) * 1e6, 1) for k, v in steps.items()})
    row["total us"] = round(sum(steps.values()) / len(order) * 1e6, 1)
    return row


def fit_rows(path: Path, repeats: int) -> list[dict]:
    """Keras fit steps/s: the same small model fed by Grain over Pairs and by read()."""
    import grain
    import keras

    import tfshards

    pairs = tfshards.Pairs(path)
    steps = len(pairs) // BATCH
    feeds = {
        "grain_pairs": lambda: (
            grain.MapDataset.source(pairs)
            .shuffle(seed=0)
            .repeat()
            .batch(BATCH, drop_remainder=True)
            .to_iter_dataset()
            .mp_prefetch(grain.MultiprocessingOptions(WORKERS))
        ),
        "read_uint8": lambda: tfshards.read(
            path, batch_size=BATCH, image_dtype="uint8", drop_remainder=True, repeat=True
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in feeds}
    for name, feed in feeds.items():
        model = _small_model(keras, pairs[0][0].shape)
        callback = _EpochTimes(keras)
        model.fit(
            feed(), epochs=repeats + 1, steps_per_epoch=steps, verbose=0, callbacks=[callback]
        )
        times[name] = [steps / s for s in callback.seconds[1:]]
    base = statistics.median(times["read_uint8"])
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        spread = f"{(max(values) - min(values)) / median:.0%}"
        rows.append(
            {"fit fed by": name, "steps/s": f"{median:.2f}", "spread": spread,
             "x read_uint8": f"{median / base:.2f}"}
        )  # fmt: skip
    return rows


def _small_model(keras, shape: tuple[int, ...]):
    model = keras.Sequential(
        [
            keras.Input(shape),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(3, 1, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _EpochTimes(keras):  # noqa: N802 - a class made once Keras is imported
    class EpochTimes(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch, logs=None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None) -> None:
            self.seconds.append(time.perf_counter() - self.start)

    return EpochTimes()


if __name__ == "__main__":
    main()
