"""Write one shard file crash-safely: a temporary name, renamed only when complete."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import TracebackType

from tfshards.schemas.format import NO_COMPRESSION, index_path, temporary_path
from tfshards.schemas.format import compression as compression_named
from tfshards.schemas.tfrecord import frame_record
from tfshards.storage import Crc32cDigest

_BUFFER_BYTES = 4 * 2**20


class ShardWriter:
    """A context manager that writes TFRecords to ``path`` and publishes it on success.

    The file is built as ``.<name>.tmp``, fsynced, then renamed; on an
    exception the temporary file is removed, so a shard name on disk always
    means a complete shard. The size, sha256 and CRC-32C of the final bytes
    are computed while writing.

    >>> with ShardWriter(Path("train-00000-of-00001.tfrecord.gz"), compression="gzip") as w:
    ...     w.write(example_bytes)  # doctest: +SKIP
    """

    def __init__(
        self,
        path: Path,
        *,
        compression: str = NO_COMPRESSION,
        level: int | None = None,
        index: bool = False,
    ) -> None:
        self.path = Path(path)
        self.tmp_path = temporary_path(self.path)
        self.records = 0
        self.bytes = 0
        self._sha256 = hashlib.sha256()
        self._crc32c = Crc32cDigest()
        self._compressor = compression_named(compression).compressor(level)
        # "<offset> <length>" per record, for DALI and the tfrecord package (uncompressed only).
        self.index_path = index_path(self.path) if index else None
        self._index_lines: list[str] = []
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._file = None

    def __enter__(self) -> ShardWriter:
        self._file = open(self.tmp_path, "wb")  # noqa: SIM115 - closed in __exit__
        return self

    def write(self, record: bytes) -> None:
        framed = frame_record(record)
        self.records += 1
        if self.index_path is not None:
            offset = self.bytes + self._pending_bytes
            self._index_lines.append(f"{offset} {len(framed)}\n")
        if self._compressor is not None:
            framed = self._compressor.compress(framed)
        self._emit(framed)

    def _emit(self, data: bytes, *, flush: bool = False) -> None:
        if data:
            self._pending.append(data)
            self._pending_bytes += len(data)
        if self._pending_bytes >= _BUFFER_BYTES or (flush and self._pending):
            chunk = b"".join(self._pending)
            self._sha256.update(chunk)
            self._crc32c.update(chunk)
            self._file.write(chunk)
            self.bytes += len(chunk)
            self._pending, self._pending_bytes = [], 0

    @property
    def sha256(self) -> str:
        return self._sha256.hexdigest()

    @property
    def crc32c(self) -> str:
        return self._crc32c.hexdigest()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        published = False
        try:
            if exc_type is None:
                self._finish()
                published = True
        finally:
            self._file.close()
            if published:
                self._publish_index()
                os.replace(self.tmp_path, self.path)
            else:
                self.tmp_path.unlink(missing_ok=True)

    def _publish_index(self) -> None:
        """The index goes first: a complete shard never lacks the index asked for."""
        if self.index_path is None:
            return
        tmp = temporary_path(self.index_path)
        tmp.write_text("".join(self._index_lines))
        os.replace(tmp, self.index_path)

    def _finish(self) -> None:
        if self._compressor is not None:
            self._emit(self._compressor.flush())
        self._emit(b"", flush=True)
        self._file.flush()
        os.fsync(self._file.fileno())
