"""glibc's malloc set for a reader's batches, when the user set nothing: two arenas, and
freed batch buffers kept for the next batch.

Arenas: capped at two, as ``MALLOC_ARENA_MAX=2`` would.

Why: glibc gives each thread that allocates its own arena, up to 8 per core. tf.data's
many threads each keep freed batch buffers in their own arena, so a reader's resident
memory creeps up epoch after epoch, and fresh pages cost system time. With two arenas
the 512x512 larger-than-RAM readers' peak RSS rose 0.8-2.6% over five epochs (up to 10%
with glibc's default), with about half the system time per pair (benchmarks/README.md,
"Larger than RAM").

``mallopt(M_ARENA_MAX)`` applies to arenas created after the call, so it is made at
``import tfshards``, normally before TensorFlow starts its thread pools. Opt out by
setting ``MALLOC_ARENA_MAX`` yourself (glibc's default is 8 per core), or
``glibc.malloc.arena_max`` in ``GLIBC_TUNABLES``: either is left to glibc. Nothing
happens on a C library other than glibc.

Freed batch buffers (set by ``tfshards.read`` and ``tfshards.Pairs``, not at import: the
converter's memory is left as it was): every batch allocates and frees the same few
large buffers (the records read, the decoded batch, TensorFlow's tensors: megabytes
each). glibc hands blocks over its mmap threshold back to the kernel when freed, and
trims the free tops of its heaps, so each batch's pages were faulted in and zeroed
again: 0.08-0.09 ms of system time per 256x256 pair on the raw read paths. With the mmap
threshold at glibc's largest (32 MiB) and the trim threshold at 128 MiB, freed buffers
stay in the heap for the next batch: the read paths ran 0.99-1.19x as fast, the raw ones
with half the system time, at a peak RSS within -4% and +2%
(``benchmarks/studies/allocator_choice.py``, results in
``benchmarks/studies/results/allocator_choice.md``). Opt out by setting either threshold
yourself (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or ``mmap_threshold``
/ ``trim_threshold`` in ``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

ARENAS = 2
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on 64-bit (half its heap size)
TRIM_THRESHOLD = 128 * 2**20
_M_ARENA_MAX = -8  # glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_THRESHOLD_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def user_chose_arenas(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the environment already tells glibc how many arenas to make."""
    return "MALLOC_ARENA_MAX" in environ or "arena_max" in environ.get("GLIBC_TUNABLES", "")


def user_chose_thresholds(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the environment already sets glibc's mmap or trim threshold."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in environ for name in _THRESHOLD_VARIABLES) or any(
        name in tunables for name in ("mmap_threshold", "trim_threshold")
    )


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - absent outside glibc (musl)
        return libc
    except (OSError, AttributeError):
        return None


def cap_malloc_arenas() -> bool:
    """Cap the arenas at ``ARENAS`` unless the user chose; True when the cap was set."""
    if user_chose_arenas():
        log.debug("malloc arenas left as set in the environment")
        return False
    libc = _glibc()
    if libc is None or libc.mallopt(_M_ARENA_MAX, ARENAS) != 1:
        return False
    log.debug("malloc arenas capped at %d (set MALLOC_ARENA_MAX to choose)", ARENAS)
    return True


def keep_freed_batches() -> bool:
    """Raise the mmap and trim thresholds unless the user chose; True when they were set."""
    if user_chose_thresholds():
        log.debug("malloc thresholds left as set in the environment")
        return False
    libc = _glibc()
    if libc is None:
        return False
    done = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
