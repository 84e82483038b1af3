"""Uncompressed local copies of gzip/zlib shards, so their records can be read by offset.

A compressed shard has no offsets into its bytes: record ``i`` is known only after
inflating everything before it. The first read of such a shard (or ``prefetch``)
inflates it once, whole, into the user cache folder::

    $XDG_CACHE_HOME/tfshards/inflated/<sha256 of the compressed shard>.tfrecord

The compressed bytes are hashed while they are inflated and compared with the
manifest's sha256, so a copy exists under a shard's name only when it came from
exactly that shard; it is written to a temporary name, flushed to the disk and renamed
into place (a crash never leaves a torn copy under the name), and one process at a time
inflates a shard (an ``flock`` per shard: the others wait and find it done). A copy
damaged later is found by its records' CRCs or offsets, and made again
(``records.py``). Nothing is ever written into the dataset folder.

Cost: one pass of inflation per shard, per machine (about the time of one streamed
epoch through ``tfshards.read`` on that shard), and the disk of the uncompressed
shards, from 1x (PNG, JPEG and deflate records barely compress) to several times
the compressed size (raw records). Copies stay until removed (``rm -r`` the folder).
"""

from __future__ import annotations

import hashlib
import os
import threading
import zlib
from pathlib import Path

from tfshards.schemas import deflate
from tfshards.schemas.format import Compression
from tfshards.schemas.manifest import ShardInfo
from tfshards.schemas.tfrecord import RecordError
from tfshards.sources.folders import held_exclusively, process_alive, user_cache_dir

_CHUNK = 4 * 2**20
_PARTIAL = ".inflating-"
_ISAL_ERROR = (deflate.isal_zlib.error,) if deflate.isal_zlib is not None else ()
_INFLATE_ERRORS = (zlib.error, ValueError, *_ISAL_ERROR)


def default_inflated_folder() -> Path:
    """``$XDG_CACHE_HOME/tfshards/inflated``."""
    return user_cache_dir() / "inflated"


def inflated_copy(source: Path, shard: ShardInfo, kind: Compression, folder: Path) -> Path:
    """The uncompressed copy of ``shard`` (read from ``source``), made unless present."""
    target = folder / f"{shard.sha256}.tfrecord"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(folder)
    with held_exclusively(folder / f".{shard.sha256}.lock"):
        if target.is_file():  # another process inflated it while this one waited
            return target
        partial = folder / f"{_PARTIAL}{os.getpid()}-{threading.get_ident()}-{shard.sha256}"
        try:
            digest = _inflate(source, partial, kind)
            if digest != shard.sha256:
                raise RecordError(
                    f"{source}: its sha256 {digest[:16]}... differs from the manifest's; "
                    "the shard is corrupt or was replaced (run `tfshards verify`)"
                )
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return target


def _inflate(source: Path, out_path: Path, kind: Compression) -> str:
    """Write the inflated content of ``source`` to ``out_path``; the source's sha256."""
    digest = hashlib.sha256()
    inflate = deflate.decompressobj(kind.wbits)
    with open(source, "rb") as stream, open(out_path, "wb") as out:
        try:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
                while chunk:
                    out.write(inflate.decompress(chunk))
                    chunk = b""
                    if inflate.eof and inflate.unused_data:  # a gzip file of several members
                        chunk = inflate.unused_data
                        inflate = deflate.decompressobj(kind.wbits)
            out.write(inflate.flush())
        except _INFLATE_ERRORS as exc:
            raise RecordError(f"{source}: corrupt {kind.name} stream ({exc})") from exc
        if not inflate.eof:
            raise RecordError(f"{source}: truncated {kind.name} stream (it ends mid-stream)")
        out.flush()
        os.fsync(out.fileno())  # on the disk before the rename names it a complete copy
    return digest.hexdigest()


def _remove_abandoned(folder: Path) -> None:
    """Partial copies of processes that no longer run (killed mid-inflation)."""
    for partial in folder.glob(f"{_PARTIAL}*"):
        pid = partial.name[len(_PARTIAL) :].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            partial.unlink(missing_ok=True)
