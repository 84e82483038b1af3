"""Cap glibc's malloc arenas at two, as ``MALLOC_ARENA_MAX=2`` would, when the user set nothing.

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
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h


def user_chose_arenas(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the environment already tells glibc how many arenas to make."""
    return "MALLOC_ARENA_MAX" in environ or "arena_max" in environ.get("GLIBC_TUNABLES", "")


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
