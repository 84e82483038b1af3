"""Standard zlib and gzip streams, made by ISA-L where the ``isal`` package is installed.

ISA-L (Intel's storage acceleration library, through ``isal``) writes the same
standard streams as zlib (RFC 1950 zlib, RFC 1952 gzip) several times faster:
on 256x256 RGB pairs here, the level tfshards uses took 0.85 ms per pair against zlib
level 1's 4.0 ms, and compressed slightly better (see benchmarks/README.md). Readers need not
know which library wrote a stream: zlib, TensorFlow and ISA-L all read both.

Levels are always given on zlib's scale, 0-9. ISA-L has levels 0-3; tfshards maps

    zlib 0        -> zlib itself (stored blocks: ISA-L has no uncompressed level)
    zlib 1-9      -> ISA-L 3

because ISA-L's levels 1 and 2 do not always give the same bytes for the same input.
Their output depends on where the caller's ``isal_zstream`` lies in memory (python-isal
keeps it on the C stack of the calling thread). Moving only that structure about in a
zero-filled mapping changed the bytes at about 1% of addresses
(``benchmarks/studies/isal_address_dependence.py``). Compressing small masks in four threads of
fresh processes gave other bytes for some of them in up to 9% of processes at level 1
(0-14 of 150, by the data and the run) and in 1 of 150 at level 2
(``benchmarks/studies/deflate_levels.py``), and in none with address randomisation off. The
streams stay valid and inflate to the same pixels; only the bytes differ, so two
conversions of the same data could disagree on their sha256s. Level 3 showed no such
difference in any run (4,500 addresses, 450 processes), compresses about as well (0.6%
larger than level 1 on 256x256 pairs) and costs 0.85 ms per 256x256 RGB pair against
level 1's 0.62 and zlib's 4.0 ms (figures in benchmarks/README.md).

ISA-L picks each level's code by the CPU's features, and the bytes differ between
them: forcing its AVX2 code in place of AVX-512's gave other level-3 bytes for 373 of
400 inputs, its baseline code for all of them (``benchmarks/studies/isal_cpu_paths.py``). Its
bytes also differ from zlib's at the same level. So the same conversion on another CPU
family, or with and without ``isal``, gives shards of other sha256s holding the same
records. A conversion that must give the same bytes everywhere chooses zlib:
:func:`library` sets the choice for the calling thread, and the converter sets it from
``ConvertOptions.deflate_library``.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import BinaryIO

try:
    from isal import igzip, isal_zlib
except ImportError:  # no wheel for this platform: zlib does everything
    igzip = isal_zlib = None

BACKEND = "isal" if isal_zlib is not None else "zlib"
LIBRARIES = ("auto", "isal", "zlib")  # auto: ISA-L where installed, else zlib
_chosen: ContextVar[str] = ContextVar("tfshards_deflate_library", default="auto")
LEVELS = range(10)  # zlib's scale, for every caller
ISAL_LEVEL = 3  # for every zlib level 1-9: levels 1 and 2 are not reproducible (above)
GZIP_WBITS = 16 + zlib.MAX_WBITS
ZLIB_WBITS = zlib.MAX_WBITS


def check_library(name: str) -> None:
    """ValueError unless ``name`` is one of LIBRARIES and usable here."""
    if name not in LIBRARIES:
        raise ValueError(f"deflate library must be one of {', '.join(LIBRARIES)}, got {name!r}")
    if name == "isal" and isal_zlib is None:
        raise ValueError("deflate library 'isal' is not installed here (pip install isal)")


@contextmanager
def library(name: str) -> Iterator[None]:
    """Compress with ``name`` (one of LIBRARIES) in this thread until the block ends."""
    check_library(name)
    token = _chosen.set(name)
    try:
        yield
    finally:
        _chosen.reset(token)


def _uses_isal(level: int) -> bool:
    return isal_zlib is not None and level > 0 and _chosen.get() != "zlib"


def compress(data, level: int) -> bytes:
    """One zlib stream (RFC 1950) of ``data`` (bytes or a contiguous buffer)."""
    if _uses_isal(level):
        return isal_zlib.compress(data, ISAL_LEVEL)
    return zlib.compress(data, level)


def compressobj(level: int, wbits: int):
    """A streaming compressor (``compress``, ``flush``) writing zlib or gzip by ``wbits``."""
    if _uses_isal(level):
        return isal_zlib.compressobj(ISAL_LEVEL, isal_zlib.DEFLATED, wbits)
    return zlib.compressobj(level, zlib.DEFLATED, wbits)


def decompress(data: bytes) -> bytes:
    """Inflate one zlib stream; ValueError when it is corrupt."""
    try:
        if isal_zlib is not None:
            return isal_zlib.decompress(data)
        return zlib.decompress(data)
    except (zlib.error, getattr(isal_zlib, "error", zlib.error)) as exc:
        raise ValueError(f"deflate stream is corrupt ({exc})") from exc


def decompressobj(wbits: int):
    """A streaming decompressor for zlib or gzip streams (by ``wbits``)."""
    return (isal_zlib or zlib).decompressobj(wbits)


def open_gzip(path) -> BinaryIO:
    """A readable stream of a gzip file's content."""
    return (igzip or gzip).open(path, "rb")
