"""Standard zlib and gzip streams, made by ISA-L where the ``isal`` package is installed.

ISA-L (Intel's storage acceleration library, through ``isal``) writes the same
standard streams as zlib (RFC 1950 zlib, RFC 1952 gzip) several times faster:
on 256x256 RGB pairs here, level 1 took 0.58 ms per pair against zlib's 3.97 ms,
and compressed slightly better (see benchmarks/README.md). Readers need not
know which library wrote a stream: zlib, TensorFlow and ISA-L all read both.

Levels are always given on zlib's scale, 0-9. ISA-L has levels 0-3; tfshards maps

    zlib 0        -> zlib itself (stored blocks: ISA-L has no uncompressed level)
    zlib 1, 2, 3  -> ISA-L 1
    zlib 4, 5, 6  -> ISA-L 2
    zlib 7, 8, 9  -> ISA-L 3

ISA-L's level 0 (a Huffman-only pass, hardly smaller than the input) is not used.
The bytes differ from zlib's at the same level, so the same conversion run with
and without ``isal`` gives shards of other sha256s holding the same records.

ISA-L's bytes are not reproducible either: in test runs here, about one record in
several thousand (always a mask, always the same pixels) was deflated to other bytes
by one worker process, and compressing it again in that process gave the same other
bytes; a fresh process gave the usual ones. The streams differ from the dynamic
Huffman header on. Each of these gave the usual bytes for the inputs concerned
(2026-12-03): replaying a deviating worker's sequence of compressions; random
contents in ISA-L's level buffer, the output buffer, the C stack and every vector
and mask register; every input alignment and neighbouring byte; each CPU pinned;
each of ISA-L's CPU-specific code paths in turn; and valgrind saw no read of
uninitialised memory. zlib's output depends on its input and level alone, so a
conversion that must be byte-for-byte reproducible (the same sha256s from every run
and every worker) chooses it: :func:`library` sets the choice for the calling
thread, and the converter sets it from ``ConvertOptions.deflate_library``.
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
GZIP_WBITS = 16 + zlib.MAX_WBITS
ZLIB_WBITS = zlib.MAX_WBITS


def isal_level(level: int) -> int:
    """ISA-L's level for a zlib level 1-9 (see the module docstring)."""
    return (level + 2) // 3


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
        return isal_zlib.compress(data, isal_level(level))
    return zlib.compress(data, level)


def compressobj(level: int, wbits: int):
    """A streaming compressor (``compress``, ``flush``) writing zlib or gzip by ``wbits``."""
    if _uses_isal(level):
        return isal_zlib.compressobj(isal_level(level), isal_zlib.DEFLATED, wbits)
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
