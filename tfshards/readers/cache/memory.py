"""How a cached epoch reads its parts: all at once from random records while the entry
fits in memory, a few at a time from their first record when it does not.

A fixed-layout part starts each epoch at a random record, which mixes records across
parts beyond the shuffle buffer; TensorFlow reaches that record by reading the bytes
before it (``header_bytes`` is not a seek), so a rotated part reads 1.5x its size on
average. From the page cache that is a copy; from the disk it is real I/O. And 16
parts with an image and a mask file each are 32 read-ahead windows, which a reader
short of memory evicts before using. Measured at 512x512 with a 1.5 GiB limit on a
4.6 GiB entry: 8-14 GiB read per cached epoch and 0.5-0.7x the bare read's pace with
16 rotated parts; the data once and 1.0-1.4x with 4 parts from their first record
(``benchmarks/README.md``, "Larger than RAM"). The price: records mix across epochs
through the part order, the four parts read together and the shuffle buffer only.
"""

from __future__ import annotations

import logging

from tfshards.readers.cache.layouts import CACHE_PARTS
from tfshards.readers.memory_limits import usable_memory

# Parts read at once when the entry is read from the disk: enough to keep it busy,
# few enough that their read-ahead stays in memory.
PARTS_FROM_DISK = 4
log = logging.getLogger(__name__)  # under "tfshards"; `bench` quiets its INFO lines


def larger_than_memory(entry_bytes: int | None, memory: int | None = None) -> bool:
    """True when an entry of ``entry_bytes`` cannot stay in the page cache: more than
    half the memory this process may use (unknown sizes: False)."""
    memory = usable_memory() if memory is None else memory
    return entry_bytes is not None and memory is not None and entry_bytes > memory // 2


def parts_at_once(entry_bytes: int, memory: int | None = None) -> int:
    """CACHE_PARTS (rotated) while ``entry_bytes`` fits in half the memory this process
    may use, else PARTS_FROM_DISK (each from its first record)."""
    if not larger_than_memory(entry_bytes, memory):
        return CACHE_PARTS
    memory = usable_memory() if memory is None else memory
    log.info(
        "the disk cache (%.1f GiB) is larger than half the memory (%.1f GiB): reading "
        "%d parts at a time, each from its first record, so an epoch reads it once",
        entry_bytes / 2**30,
        memory / 2**30,
        PARTS_FROM_DISK,
    )
    return PARTS_FROM_DISK
