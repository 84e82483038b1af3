"""Conversion on this machine: the planned shards written by local worker processes.

The runner beside :mod:`tfshards.converters.beam`; both take the same shard plan and
write with the same shard job. Workers are started with ``spawn`` (no fork of a
process that may hold TensorFlow's threads) and run tfshards code only, so they are
started without re-running the caller's script: a script that calls ``convert``
without an ``if __name__ == "__main__":`` guard works (the guard is still good
practice). Workers never see Ctrl-C: the launching process stops them, so an
interrupt shows no traceback from a worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import types
from collections.abc import Iterator
from concurrent.futures import (
    FIRST_COMPLETED,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    as_completed,
    wait,
)
from pathlib import Path

from tfshards.converters.options import ConvertOptions
from tfshards.converters.planning import ShardSpec
from tfshards.converters.progress import ConversionProgress
from tfshards.converters.shard_job import (
    ShardResult,
    init_worker,
    upload_shard,
    write_shard,
    write_shard_in_worker,
)
from tfshards.storage import Location, StorageOptions

UPLOADS = 2  # shards uploaded at once into a bucket, while the workers write the next


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def write_shards(
    specs: list[ShardSpec],
    options: ConvertOptions,
    channels: int,
    out: Location,
    workers: int | None,
    store: StorageOptions,
    progress: ConversionProgress,
) -> Iterator[ShardResult]:
    """Yield ShardResults as shards complete, in-process or in worker processes."""
    workers = min(workers or default_workers(), max(len(specs), 1))
    if workers <= 1:
        for spec in specs:
            yield write_shard(spec, options, channels, out, progress.update, store)
        return
    context = multiprocessing.get_context("spawn")
    updates = context.Queue()
    pool = ProcessPoolExecutor(
        workers, mp_context=context, initializer=init_worker, initargs=(updates,)
    )
    pending: set[Future] = set()
    try:
        with _starting_workers():  # workers are started by the first submits
            pending = {
                pool.submit(write_shard_in_worker, spec, options, channels, out, store)
                for spec in specs
            }
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            progress.drain(updates)
            for future in done:
                yield future.result()
        pool.shutdown(wait=True)  # the workers exit, flushing their last updates
        progress.drain_to_end(updates)
    except BaseException:
        stop_workers(pool)
        raise


def write_and_upload(
    specs: list[ShardSpec],
    options: ConvertOptions,
    channels: int,
    out: str,
    workers: int | None,
    store: StorageOptions,
    progress: ConversionProgress,
) -> Iterator[ShardResult]:
    """Into a bucket: the workers write shards into a local staging folder (``TMPDIR``) and
    this process uploads each one whole while they write the next; a result is yielded
    (and journaled) once its object is up. The staging folder holds the shards written
    and not yet uploaded, usually one or two."""
    with (
        tempfile.TemporaryDirectory(prefix="tfshards-staging-") as staging,
        ThreadPoolExecutor(UPLOADS, thread_name_prefix="tfshards-upload") as uploads,
    ):
        pending: dict[Future, ShardResult] = {}
        local = write_shards(specs, options, channels, Path(staging), workers, store, progress)
        for result in local:
            upload = uploads.submit(
                upload_shard, Path(staging), result.file, out, options.index, store
            )
            pending[upload] = result
            for upload in [f for f in pending if f.done()]:
                upload.result()
                yield pending.pop(upload)
        for upload in as_completed(list(pending)):
            upload.result()
            yield pending.pop(upload)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """End the workers now: queued shards are dropped and running ones killed (their
    temporary files are replaced by the next run)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # gone after shutdown
    for process in processes:
        process.terminate()
    # One call that waits: a first shutdown(wait=False) forgets the pool's manager thread
    # unjoined, and a thread left at exit races CPython's own shutdown of it (a traceback).
    pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _starting_workers():
    """Start workers that do not re-run the caller's script and never get SIGINT.

    ``spawn`` re-imports the parent's ``__main__`` in each worker so that functions
    defined there can be unpickled; tfshards sends none, and re-running a script
    without the main guard would start the conversion again in every worker. A
    stand-in ``__main__`` is shown while they start. SIGINT is blocked meanwhile
    (workers inherit the blocked signal, so a Ctrl-C to the terminal's process group
    reaches only this process) and an interrupt that arrives is raised afterwards.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    deferred: list[int] = []
    previous = None
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: deferred.append(signum))
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main
        if in_main_thread:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            signal.signal(signal.SIGINT, previous)
    if deferred and callable(previous):
        previous(signal.SIGINT, None)
