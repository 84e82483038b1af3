"""import tfshards caps glibc's malloc arenas at two unless the environment chose a number."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tfshards import malloc_arenas

# Twelve threads allocate at once; glibc's malloc_info lists one <heap> per arena.
COUNT_ARENAS = textwrap.dedent(
    """
    import ctypes, sys, tempfile, threading
    if sys.argv[1] == "import-tfshards":
        import tfshards
    if sys.argv[1] == "cli":
        from tfshards.cli import main
        try:
            main(["verify", "--help"])
        except SystemExit:
            pass
    barrier = threading.Barrier(12)
    def allocate():
        barrier.wait()
        kept = [bytearray(300_000) for _ in range(20)]
        barrier.wait()
    threads = [threading.Thread(target=allocate) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile() as report:
        handle = libc.fopen(report.name.encode(), b"w")
        libc.malloc_info(0, handle)
        libc.fclose(handle)
        print(open(report.name).read().count("<heap nr="))
    """
)

needs_glibc = pytest.mark.skipif(
    malloc_arenas._glibc() is None, reason="the arena cap is glibc's (Linux with glibc only)"
)


def last_word(script: str, mode: str, environ: dict[str, str]) -> str:
    """The last word a script prints, run in a fresh Python with no malloc settings of
    the environment but ``environ``'s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    done = subprocess.run(
        [sys.executable, "-c", script, mode],
        env={**env, **environ},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split()[-1]


def arenas_after_threads(mode: str, **environ: str) -> int:
    return int(last_word(COUNT_ARENAS, mode, environ))


@needs_glibc
def test_importing_tfshards_caps_the_arenas_at_two():
    assert arenas_after_threads("plain") > malloc_arenas.ARENAS, "glibc's default makes more"
    assert arenas_after_threads("import-tfshards") <= malloc_arenas.ARENAS
    assert arenas_after_threads("cli") <= malloc_arenas.ARENAS


@needs_glibc
def test_an_arena_count_set_in_the_environment_is_left_to_glibc():
    assert arenas_after_threads("import-tfshards", MALLOC_ARENA_MAX="5") == 5
    tunables = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}
    assert arenas_after_threads("import-tfshards", **tunables) == 4


def test_the_user_choice_is_read_from_either_variable():
    assert not malloc_arenas.user_chose_arenas({})
    assert malloc_arenas.user_chose_arenas({"MALLOC_ARENA_MAX": "8"})
    assert malloc_arenas.user_chose_arenas({"GLIBC_TUNABLES": "glibc.malloc.arena_max=8"})
    assert not malloc_arenas.user_chose_arenas({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"})


# A block the size of a decoded batch, allocated by the main thread: glibc maps it on its
# own when it is over the mmap threshold, and takes it from the main heap ("[heap]" in
# /proc/self/maps) when not.
OWN_MAPPING = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tfshards
    if sys.argv[1] == "read":
        from tfshards.malloc_arenas import keep_freed_batches
        keep_freed_batches()  # what tfshards.read and tfshards.Pairs call
    size = 20 * 2**20
    block = np.empty(size, np.uint8)
    start = block.ctypes.data
    for line in open("/proc/self/maps"):
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if low <= start < high:
            print("[heap]" not in line)
    """
)


def own_mapping(mode: str, **environ: str) -> bool:
    return last_word(OWN_MAPPING, mode, environ) == "True"


@needs_glibc
def test_reading_keeps_freed_batch_buffers_in_the_heap():
    assert own_mapping("import"), "importing alone leaves glibc's threshold (128 KiB)"
    assert not own_mapping("read")
    assert own_mapping("read", MALLOC_MMAP_THRESHOLD_="131072"), "the user's choice stands"


def test_a_threshold_choice_is_read_from_either_variable():
    assert not malloc_arenas.user_chose_thresholds({})
    assert malloc_arenas.user_chose_thresholds({"MALLOC_TRIM_THRESHOLD_": "0"})
    tunables = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}
    assert malloc_arenas.user_chose_thresholds(tunables)
    assert not malloc_arenas.user_chose_thresholds({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
