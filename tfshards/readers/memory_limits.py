"""The memory this process may use, and the RAM budget tf.data's autotuning gets from it.

tf.data sizes its autotuned buffers (prefetch, parallel map and batch) within a RAM
budget that defaults to half the machine's free memory. In a container or a memory
cgroup that is the host's memory, not the limit: at 512x512 RGB with float32 batches
of 32 (128 MiB each) and a 1.5 GiB limit, a cached read was killed for memory in
3 runs of 3 with the default, and finished in 4 runs of 4 with a budget of an eighth
to a quarter of the limit (``benchmarks/results/larger_than_ram.md``). Where a cgroup
limits the process below the machine's memory, the reader therefore sets the budget
to a quarter of the limit, leaving the rest to the page cache's read-ahead, the
shuffle buffer and the training step.
"""

from __future__ import annotations

from pathlib import Path

# The share of a cgroup's limit tf.data's autotuned buffers may hold.
AUTOTUNE_SHARE_OF_LIMIT = 0.25


def usable_memory() -> int | None:
    """The smaller of the machine's memory and this process's cgroup limit (v1 or v2)."""
    known = [limit for limit in (machine_memory(), cgroup_memory_limit()) if limit]
    return min(known) if known else None


def outgrows_page_cache(nbytes: int) -> bool:
    """Whether files of ``nbytes`` are larger than half the memory the process may use (or
    that memory is unknown): then each epoch reads them from the disk, not from the page
    cache, and a reader reads them past it (direct_reads.py) or asks for a batch's pieces
    all at once (``POSIX_FADV_WILLNEED``) so the disk serves them as one queue; for files
    that stay cached, asking costs about 2.5 us per piece for nothing."""
    memory = usable_memory()
    return memory is None or nbytes > memory / 2


def autotune_ram_budget() -> int | None:
    """A quarter of the cgroup's limit when one is below the machine's memory, else None
    (tf.data's own default then sees the right memory)."""
    limit, machine = cgroup_memory_limit(), machine_memory()
    if limit is None or (machine is not None and limit >= machine):
        return None
    return int(limit * AUTOTUNE_SHARE_OF_LIMIT)


def machine_memory() -> int | None:
    """MemTotal from /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cgroup_memory_limit() -> int | None:
    """The tightest memory limit of this process's cgroups (v1 or v2), None if unlimited."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = [limit for limit in map(_cgroup_limit, lines) if limit]
    return min(limits) if limits else None


def _cgroup_limit(line: str) -> int | None:
    """The memory limit of one /proc/self/cgroup line's group, if it has one."""
    fields = line.split(":", 2)
    if len(fields) != 3:
        return None
    _, controllers, group = fields
    if controllers == "":
        candidates = [Path("/sys/fs/cgroup") / group.lstrip("/") / "memory.max"]
    elif "memory" in controllers.split(","):
        candidates = [Path("/sys/fs/cgroup/memory") / group.lstrip("/") / "memory.limit_in_bytes"]
    else:
        return None
    for path in candidates:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or a huge number: no limit
            return int(text)
    return None
