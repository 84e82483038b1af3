"""Reads that bypass the page cache (``O_DIRECT``), for files too large to stay in it.

A split (or a disk cache) larger than half the memory a reader may use is read from the disk
every epoch, each record once, so the page cache holds nothing a later read wants: it
only costs. Each 4 KiB page is allocated, charged to the memory cgroup, copied out,
then reclaimed. Reading 6,000 raw 512x512 records (6 GiB) under a 2 GiB limit in an
epoch's order cost 0.42 ms of CPU per record through the page cache (0.40 of it system
time), and 0.14 ms read direct (0.08 of it the copy out of the aligned buffer):
``benchmarks/studies/direct_reads.py``. The whole reader: benchmarks/README.md, "Reads
past the page cache".

``O_DIRECT`` wants offsets, lengths and memory aligned to the device's logical block;
``ALIGNMENT`` (4 KiB) covers 512-byte and 4 KiB blocks. A span anywhere in a file is
read as the aligned span around it into a page-aligned buffer kept by each thread, and
its bytes are taken from there (:func:`read_span`); a destination that is already
aligned is read into directly (:func:`read_into`).

Where ``O_DIRECT`` is missing (macOS, Windows) or refused (when the file is opened, as
tmpfs did before Linux 6.6, or at the first read, as some FUSE file systems do), reads
go through the page cache as before: :func:`open_unbuffered` returns None, and a
descriptor whose direct read fails with ``EINVAL`` is switched back to buffered reads.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import itertools
import logging
import mmap
import os
import queue
import threading
from collections.abc import Callable, Sequence

import numpy as np

log = logging.getLogger(__name__)

ALIGNMENT = 4096
# A thread keeps its aligned buffer up to this size; a longer span gets a buffer of its own.
KEPT_BUFFER_BYTES = 16 * 2**20
# The smallest pieces (records, cached pairs) worth reading direct, on average: a piece
# is read as whole aligned blocks, up to 2 x ALIGNMENT more than it holds, and small
# records read through the page cache share the blocks and read-ahead of their neighbours.
MIN_DIRECT_PIECE_BYTES = 64 * ALIGNMENT
# Reads in flight per batch: a direct read waits for the disk with nothing queued behind
# it, and this VM's disk served shuffled 1 MiB reads at 0.34x its in-order pace with one
# in flight, 0.94x with four (benchmarks/studies/hardware_bounds.py).
READS_IN_FLIGHT = 4
_DIRECT = getattr(os, "O_DIRECT", 0)
_buffers = threading.local()
_in_pool = threading.local()  # marks the pool's own threads


def in_flight(read: Callable[[object], None], pieces: Sequence) -> None:
    """``read(piece)`` for every piece, several at once: this thread and up to
    READS_IN_FLIGHT - 1 workers of a shared pool take the pieces from one queue (their
    reads and copies let go of the GIL). This thread reads until the queue is empty, so
    callers at once (tf.data's parallel fetch calls) never wait idle behind each other's
    pieces, and a call from a pool thread reads all its pieces itself. Returns when every
    piece is read; the first piece's error (in order) is then raised. A KeyboardInterrupt
    (or another non-Exception) leaves the pieces not yet taken unread and is raised first.

    No lock is held while anything is allocated: an allocation may run a garbage
    collection, which may free a tf.data iterator whose destructor waits for its calls in
    flight, and a call that waited for that lock would never come back (a hang seen with
    ``concurrent.futures``, whose ``submit`` allocates under two locks). So the queue is a
    deque (atomic ``popleft``), pieces are counted by ``itertools.count`` and the caller
    waits on a bare lock, released by whoever finishes the last piece."""
    if not len(pieces):
        return
    untaken = collections.deque(enumerate(pieces))
    errors: dict[int, BaseException] = {}
    finished = itertools.count(1)
    stopped: list[bool] = []  # not empty once a piece was interrupted
    all_read = threading.Lock()
    all_read.acquire()

    def take_pieces() -> None:
        while True:
            try:
                number, piece = untaken.popleft()
            except IndexError:
                return
            try:
                if not stopped:
                    read(piece)
            except BaseException as error:  # raised by the caller once every piece is done
                errors[number] = error
                if not isinstance(error, Exception):  # Ctrl-C, an exit: read no more
                    stopped.append(True)
            finally:
                if next(finished) == len(pieces):
                    all_read.release()

    if not getattr(_in_pool, "marked", False):
        for _ in range(min(len(pieces), READS_IN_FLIGHT) - 1):
            _pool.submit(take_pieces)  # a helper that starts late finds nothing left
    try:
        take_pieces()
        all_read.acquire()
    except BaseException:  # Ctrl-C outside a read, or while the workers read: they stop
        stopped.append(True)
        raise
    if errors:  # an interruption first, else the first piece's error
        raise min(errors.items(), key=lambda item: (isinstance(item[1], Exception), item[0]))[1]


class _ReadPool:
    """Daemon threads that run the calls put in one queue, started at the first call.

    Not ``concurrent.futures.ThreadPoolExecutor``: its ``submit`` allocates while it holds
    two locks (see :func:`in_flight`), one of them taken at every ``os.fork`` too, and its
    threads are joined at exit. Here a ``SimpleQueue`` (C code, no lock held across Python
    code) carries the calls, and an exit never waits for a worker."""

    def __init__(self, workers: int) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._any_started = False  # only ever set: a popped name may yet go back
        self._unstarted = [f"tfshards-read-{n}" for n in range(workers)]

    def submit(self, call: Callable[[], None]) -> None:
        """Queue ``call`` for a worker; dropped while none could be started, as a queued
        call would keep its batch's arrays until one starts, if ever (its caller reads
        every piece itself meanwhile)."""
        while self._unstarted:
            try:
                name = self._unstarted.pop()  # atomic: each worker is started once
            except IndexError:
                break
            try:
                threading.Thread(target=self._work, name=name, daemon=True).start()
            except RuntimeError:  # no thread to be had (a limit, the interpreter exiting)
                self._unstarted.append(name)  # tried again at the next call
                break
            self._any_started = True
        if self._any_started:
            self._calls.put(call)

    def _work(self) -> None:
        _in_pool.marked = True
        while True:
            call = self._calls.get()
            try:
                call()
            except Exception:  # in_flight's calls catch their own; keep the worker alive
                log.exception("a read in flight failed outside its piece")
            # Not kept while waiting for the next: it holds its batch's arrays and reader.
            del call


def _pool_size() -> int:
    """READS_IN_FLIGHT - 1 workers for every two cores this process may run on (two
    fetch calls at once on this project's 2-core VM)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
    return (READS_IN_FLIGHT - 1) * max(1, cores // 2)


_pool = _ReadPool(_pool_size())


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads do not exist here."""
    global _pool
    _pool = _ReadPool(_pool_size())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def reads_direct(chosen: bool | None, outgrows: bool, total_bytes: int, pieces: int) -> bool:
    """Whether files of ``total_bytes`` in ``pieces`` read one by one are read direct: as
    ``chosen`` (``ReadOptions.direct_reads``), or when None, when they outgrow the page
    cache (``outgrows``) and their pieces are large enough for whole blocks to cost little."""
    if not _DIRECT or chosen is False:
        return False
    if chosen:
        return True
    return outgrows and pieces > 0 and total_bytes / pieces >= MIN_DIRECT_PIECE_BYTES


def open_unbuffered(path: str | os.PathLike) -> int | None:
    """``path`` opened for reading with ``O_DIRECT``; None where that is not possible, for
    the caller to open it as usual. Other errors (a missing file) are raised."""
    if not _DIRECT:
        return None
    try:
        return os.open(path, os.O_RDONLY | _DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise


def unbuffered(fd: int) -> bool:
    """Whether reads of ``fd`` bypass the page cache."""
    return bool(_DIRECT) and bool(fcntl.fcntl(fd, fcntl.F_GETFL) & _DIRECT)


def read_span(fd: int, start: int, length: int) -> memoryview:
    """Bytes ``[start, start + length)`` of ``fd``'s file (fewer where it ends), for any
    descriptor. Of an unbuffered one they lie in this thread's buffer: valid until its
    next read."""
    if not unbuffered(fd):
        return memoryview(os.pread(fd, length, start))
    first = start - start % ALIGNMENT
    stop = -(-(start + length) // ALIGNMENT) * ALIGNMENT
    buffer = _buffer(stop - first)
    got = _read_aligned(fd, buffer, first)
    end = min(first + got, start + length)
    return buffer[start - first : max(start, end) - first]


def read_into(fd: int, out: np.ndarray, offset: int) -> int:
    """Bytes of ``fd``'s file from ``offset`` into ``out`` (C-contiguous), as many as it
    holds or the file has; how many were read."""
    view = memoryview(out).cast("B")
    if not unbuffered(fd):  # asked once: a system call (0.3 us here)
        return _read_fully(fd, view, offset)
    aligned = offset % ALIGNMENT == 0 and len(view) % ALIGNMENT == 0
    if aligned and out.ctypes.data % ALIGNMENT == 0:
        return _read_aligned(fd, view, offset)
    span = read_span(fd, offset, len(view))
    flat = out.reshape(-1).view(np.uint8)
    flat[: len(span)] = np.frombuffer(span, np.uint8)  # NumPy's copy lets go of the GIL
    return len(span)


def _read_aligned(fd: int, view: memoryview, offset: int) -> int:
    """An aligned read of an unbuffered ``fd``; buffered again if the file system refuses."""
    try:
        return _read_fully(fd, view, offset, direct=True)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    log.debug("direct reads refused on descriptor %d: reading it through the page cache", fd)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_DIRECT)
    return _read_fully(fd, view, offset)


def _read_fully(fd: int, view: memoryview, offset: int, *, direct: bool = False) -> int:
    """Read until ``view`` is full or the file ends; how many bytes. A direct read that
    ends off a block boundary has met the file's end (and cannot go on from there)."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        done += got
        if got == 0 or (direct and got % ALIGNMENT):
            break
    return done


def _buffer(size: int) -> memoryview:
    """A page-aligned buffer of at least ``size`` bytes: this thread's, or a new one."""
    if size > KEPT_BUFFER_BYTES:
        return _mapped(size)[:size]
    kept = getattr(_buffers, "memory", None)
    if kept is None or len(kept) < size:
        kept = _buffers.memory = _mapped(max(size, 2 * 2**20))
    return kept[:size]


def _mapped(size: int) -> memoryview:
    """Page-aligned memory, private: a forked child (a DataLoader worker) that inherits a
    thread's kept buffer copies it on write (a shared one let its reads overwrite the
    bytes its parent was copying out)."""
    return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
