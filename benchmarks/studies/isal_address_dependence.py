"""Whether ISA-L's bytes depend on where its stream state lies in memory, per level.

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: Every deflate level 1-9 is written with ISA-L level 3
(tfshards/schemas/deflate.py): ISA-L's levels 1 and 2 write other bytes for the same
input depending on where the stream state lies in memory.
Run: 2026-12-04. Recorded result: other bytes at 17 and 18 of 1,500 addresses (level 1,
two runs), 18 and 17 (level 2), 0 and 0 (level 3).
Raw output: results/isal_address_dependence.md.

    python benchmarks/studies/isal_address_dependence.py --positions 300 --pairs 240

Calls the ``isal_deflate_init``/``isal_deflate`` that the ``isal`` wheel bundles, through
ctypes, with the same input, level buffer and output buffer every time, and only the
``struct isal_zstream`` moved: to --positions random 64-byte-aligned addresses of one
large zero-filled anonymous mapping (fresh pages, so the contents are zeros every time).
Inputs are the images and masks of --pairs small synthetic pairs (24x32). Each
input's reference stream is the one written at most positions; a position counts when
any input's stream differs from its reference. Each stream is inflated and checked
against its input too.

The structure's leading fields are declared below as ISA-L 2.32 lays them out (the
rest is opaque); the script first checks that its own calls reproduce
``isal_zlib.compress`` at level 3 at most of five addresses, and stops if they do not.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import random
import zlib
from collections import Counter

import _benchmarks_path  # noqa: F401  (benchmarks/ on sys.path)
from _common import synthetic_pixels
from isal import isal_zlib

STATE_BYTES = 1 << 17  # struct isal_zstate is about 82 KB in ISA-L 2.32
LEVEL_BUFFER = 1 << 21  # at least every level's default size
OUT_BYTES = 1 << 16
IGZIP_ZLIB, FULL_FLUSH = 3, 2  # igzip_lib.h


class ZStream(ctypes.Structure):
    _fields_ = [
        ("next_in", ctypes.c_void_p),
        ("avail_in", ctypes.c_uint32),
        ("total_in", ctypes.c_uint32),
        ("next_out", ctypes.c_void_p),
        ("avail_out", ctypes.c_uint32),
        ("total_out", ctypes.c_uint32),
        ("hufftables", ctypes.c_void_p),
        ("level", ctypes.c_uint32),
        ("level_buf_size", ctypes.c_uint32),
        ("level_buf", ctypes.c_void_p),
        ("end_of_stream", ctypes.c_uint16),
        ("flush", ctypes.c_uint16),
        ("gzip_flag", ctypes.c_uint16),
        ("hist_bits", ctypes.c_uint16),
        ("internal_state", ctypes.c_uint8 * STATE_BYTES),
    ]


class Deflater:
    """isal_deflate of one buffer with the stream state at an address of our choosing."""

    def __init__(self) -> None:
        library = ctypes.CDLL(isal_zlib.__file__)  # the wheel links ISA-L in statically
        self.init, self.deflate = library.isal_deflate_init, library.isal_deflate
        self.init.argtypes = self.deflate.argtypes = [ctypes.c_void_p]
        self.level_buf = ctypes.create_string_buffer(LEVEL_BUFFER)
        self.out = ctypes.create_string_buffer(OUT_BYTES)

    def __call__(self, data: bytes, level: int, address: int) -> bytes:
        stream = ZStream.from_address(address)
        self.init(address)
        source = ctypes.create_string_buffer(data, len(data))
        stream.next_in, stream.avail_in = ctypes.addressof(source), len(data)
        stream.next_out, stream.avail_out = ctypes.addressof(self.out), OUT_BYTES
        stream.level, stream.level_buf_size = level, LEVEL_BUFFER
        stream.level_buf = ctypes.addressof(self.level_buf)
        stream.gzip_flag, stream.hist_bits = IGZIP_ZLIB, 0
        stream.flush, stream.end_of_stream = FULL_FLUSH, 1
        if self.deflate(address) != 0:
            raise RuntimeError("isal_deflate failed")
        return self.out.raw[: stream.total_out]


class ZeroedRegion:
    """A large anonymous mapping whose pages read as zeros until written; each use is
    handed back to the kernel afterwards, so the next one starts from zeros again."""

    SIZE = 1 << 32

    def __init__(self, seed: int) -> None:
        self.map = mmap.mmap(-1, self.SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.rng = random.Random(seed)

    def random_address(self) -> int:
        span = ctypes.sizeof(ZStream) + 2 * 4096
        return (
            self.base
            + 4096 * self.rng.randrange((self.SIZE - span) // 4096)
            + 64 * (self.rng.randrange(64))
        )

    def release(self, address: int) -> None:
        start = (address - self.base) // 4096 * 4096
        self.map.madvise(mmap.MADV_DONTNEED, start, ctypes.sizeof(ZStream) + 2 * 4096)


def streams_at(deflater: Deflater, data: list[bytes], level: int, region: ZeroedRegion) -> list:
    address = region.random_address()
    streams = [deflater(d, level, address) for d in data]
    region.release(address)
    assert all(zlib.decompress(s) == d for s, d in zip(streams, data, strict=True))
    return streams


def check_layout(deflater: Deflater, data: list[bytes], region: ZeroedRegion) -> None:
    """Our declaration of isal_zstream matches this ISA-L when our calls write what
    isal_zlib.compress writes, at most of a few addresses (level 3, the stable one)."""
    expected = [isal_zlib.compress(d, 3) for d in data]
    agreeing = sum(streams_at(deflater, data, 3, region) == expected for _ in range(5))
    if agreeing < 3:
        raise SystemExit("this ISA-L lays out isal_zstream otherwise: no result")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=300, help="per level (default 300)")
    parser.add_argument("--pairs", type=int, default=240, help="small pairs (default 240)")
    parser.add_argument("--levels", default="1,2,3", help="ISA-L levels (default 1,2,3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = [a.tobytes() for a in synthetic_pixels(args.pairs, (24, 32))]
    deflater, region = Deflater(), ZeroedRegion(args.seed)
    check_layout(deflater, data, region)
    for level in (int(x) for x in args.levels.split(",")):
        found = [streams_at(deflater, data, level, region) for _ in range(args.positions)]
        columns = zip(*found, strict=True)
        majority = [Counter(column).most_common(1)[0][0] for column in columns]
        deviating = sum(streams != majority for streams in found)
        print(f"ISA-L level {level}: other bytes at {deviating} of {args.positions} positions")


if __name__ == "__main__":
    main()
