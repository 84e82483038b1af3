"""Whether ISA-L's level 3 writes the same bytes on CPUs of other families (Linux x86-64).

A one-off study, kept for the decision it backs (not a benchmark to rerun):
Decision: Byte identity is promised per CPU family; ``--deflate-library zlib`` is the
choice for identical bytes across families.
Run: 2026-12-04. Recorded result: with level 3, AVX2 code wrote other bytes than this
AVX-512 machine for 373 of 400 inputs, the baseline C code (ARM, older x86) for 400 of
400; the control 0 of 400.
Raw output: results/isal_cpu_paths.md.

    python benchmarks/studies/isal_cpu_paths.py --pairs 100

ISA-L chooses each function's code once, by the CPU's features, and keeps the choice in
a pointer per function (``<name>_dispatched``). This script compresses the same inputs
with ``isal_zlib.compress(data, 3)`` as this CPU chose, then with those pointers set to
the code another CPU family would run: the AVX2 helpers (``_04``) and the baseline C
code. It prints, per choice, how many inputs got other bytes than this CPU's (every
stream is checked to inflate to its input). A control sets this CPU's own AVX-512
helpers (``_06``) explicitly. Symbol addresses come from ``nm`` (binutils); the
pointers are restored at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import zlib

import _benchmarks_path  # noqa: F401  (benchmarks/ on sys.path)
from _common import synthetic_pixels
from isal import isal_zlib

HELPERS = ("gen_icf_map_lh1", "set_long_icf_fg", "encode_deflate_icf")
CHOICES = {
    "AVX-512 helpers (_06), set explicitly: the control": {h: f"{h}_06" for h in HELPERS},
    "AVX2 helpers (_04)": {h: f"{h}_04" for h in HELPERS},
    "baseline C code": {
        "isal_deflate_icf_body_lvl3": "icf_body_hash1_fillgreedy_lazy",
        "isal_deflate_icf_finish_lvl3": "isal_deflate_icf_finish_hash_map_base",
        "encode_deflate_icf": "encode_deflate_icf_base",
        "set_long_icf_fg": "set_long_icf_fg_base",
        "isal_update_histogram": "isal_update_histogram_base",
        "isal_deflate_hash_lvl3": "isal_deflate_hash_base",
        "isal_adler32": "adler32_base",
    },
}


class Dispatch:
    """ISA-L's per-function code pointers in the loaded ``isal_zlib`` module."""

    def __init__(self) -> None:
        listing = subprocess.run(["nm", isal_zlib.__file__], capture_output=True, text=True)
        self.symbols = {
            parts[2]: int(parts[0], 16)
            for parts in (line.split() for line in listing.stdout.splitlines())
            if len(parts) == 3
        }
        library = ctypes.CDLL(isal_zlib.__file__)
        self.base = ctypes.cast(library.isal_deflate, ctypes.c_void_p).value
        self.base -= self.symbols["isal_deflate"]

    def pointer(self, name: str) -> ctypes.c_uint64:
        return ctypes.c_uint64.from_address(self.base + self.symbols[f"{name}_dispatched"])

    def code(self, name: str) -> int:
        return self.base + self.symbols[name]


def streams(data: list[bytes]) -> list[bytes]:
    """Level-3 streams of every input, each checked to inflate to its input."""
    found = [isal_zlib.compress(item, 3) for item in data]
    assert all(zlib.decompress(s) == d for s, d in zip(found, data, strict=True))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100, help="per size (default 100)")
    args = parser.parse_args()
    sizes = ((24, 32), (256, 256))
    data = [a.tobytes() for size in sizes for a in synthetic_pixels(args.pairs, size)]
    dispatch = Dispatch()
    native = streams(data)  # also makes ISA-L resolve its pointers for this CPU
    names = {name for swap in CHOICES.values() for name in swap}
    saved = {name: dispatch.pointer(name).value for name in names}
    print(f"{len(data)} inputs (24x32 and 256x256 pairs), ISA-L level 3")
    try:
        for label, swap in CHOICES.items():
            for name, code in swap.items():
                dispatch.pointer(name).value = dispatch.code(code)
            other = sum(a != b for a, b in zip(streams(data), native, strict=True))
            print(f"{label}: other bytes for {other} of {len(data)} inputs")
            for name, value in saved.items():
                dispatch.pointer(name).value = value
    finally:
        for name, value in saved.items():
            dispatch.pointer(name).value = value
    assert streams(data) == native, "the pointers were not restored"


if __name__ == "__main__":
    main()
