"""The serialized records of one split by global index, without TensorFlow.

Global index ``i`` is the ``i``-th record of the split in the manifest's order (shard by
shard). A read looks up each record's offset (``schemas/offsets.py``), reads it with
``os.pread`` and checks both CRCs. File descriptors belong to the process that opened
them: a forked or unpickled copy opens its own, so nothing is shared across a fork.

Each shard's identity (device, inode, size, modification time) is taken when the
split is opened; a descriptor opened later on a file with another identity means the
dataset was replaced under the reader (``convert --overwrite``), and the read stops
with :class:`DatasetChangedError` instead of mixing two datasets.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tfshards.errors import DatasetChangedError, OptionsError
from tfshards.readers.shards import SplitShards
from tfshards.schemas.format import compression
from tfshards.schemas.offsets import RecordOffsets, read_record, shard_offsets

OPEN_FILES = 64  # descriptors kept open per process, least recently used closed first
Identity = tuple[int, int, int, int]


def default_offsets_folder() -> Path:
    """Scanned offsets are kept here: ``$XDG_CACHE_HOME/tfshards/offsets``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "tfshards" / "offsets"


class SplitRecords:
    """``len()`` records of one split; ``read(indices)`` returns their data in that order."""

    def __init__(self, shards: SplitShards, *, offsets_folder: Path | None = None) -> None:
        if shards.remote or compression(shards.manifest.compression.type).compressed:
            raise OptionsError(
                f"{shards.root}: reading by index needs local, uncompressed shards "
                "(convert with --compression none)"
            )
        self.shards = shards
        self.offsets_folder = offsets_folder or default_offsets_folder()
        counts = [shard.records for shard in shards.shards]
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.identities = [_identity(os.stat(path)) for path in shards.paths]
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._files: OrderedDict[int, int] = OrderedDict()  # shard number -> descriptor
        self._offsets: dict[int, RecordOffsets] = {}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_pid", "_lock", "_files", "_offsets"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def __len__(self) -> int:
        return int(self.first[-1])

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, record within the shard) of each global index."""
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"record index out of range for {len(self)} records")
        shard = np.searchsorted(self.first, indices, side="right") - 1
        return shard, indices - self.first[shard]

    def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The data of the records at ``indices``, in that order, CRCs checked."""
        shard_numbers, locals_ = self.locate(np.asarray(indices, np.int64))
        out: list[bytes] = [b""] * len(shard_numbers)
        # Shard by shard, in offset order: sequential reads where the order allows.
        order = np.lexsort((locals_, shard_numbers))
        for position in order:
            number, local = int(shard_numbers[position]), int(locals_[position])
            fd, offsets = self._open(number)
            where = f"{self.shards.paths[number]}: record {local}"
            out[position] = read_record(fd, offsets.starts[local], offsets.lengths[local], where)
        return out

    def _open(self, number: int) -> tuple[int, RecordOffsets]:
        with self._lock:
            if self._pid != os.getpid():  # a forked copy: the parent's descriptors are not ours
                self._reset_locked()
            fd = self._files.get(number)
            if fd is None:
                fd = self._open_checked(number)
            self._files.move_to_end(number)
            if number not in self._offsets:
                shard = self.shards.shards[number]
                path = Path(self.shards.paths[number])
                self._offsets[number] = shard_offsets(
                    path, shard.sha256, shard.bytes, self.offsets_folder
                )
            return fd, self._offsets[number]

    def _reset_locked(self) -> None:
        self._pid = os.getpid()
        self._files = OrderedDict()

    def _open_checked(self, number: int) -> int:
        path = self.shards.paths[number]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise _changed(path, "it is gone") from None
        if _identity(os.fstat(fd)) != self.identities[number]:
            os.close(fd)
            raise _changed(path, "another file now has its name")
        self._files[number] = fd
        while len(self._files) > OPEN_FILES:
            os.close(self._files.popitem(last=False)[1])
        return fd

    def check_unchanged(self) -> None:
        """Raise DatasetChangedError if any shard file is not the one opened at the start."""
        for path, identity in zip(self.shards.paths, self.identities, strict=True):
            try:
                now = _identity(os.stat(path))
            except FileNotFoundError:
                raise _changed(path, "it is gone") from None
            if now != identity:
                raise _changed(path, "another file now has its name")

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                for fd in self._files.values():
                    os.close(fd)
            self._files = OrderedDict()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown
            self.close()


def _identity(stat: os.stat_result) -> Identity:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _changed(path: str, how: str) -> DatasetChangedError:
    return DatasetChangedError(
        f"{path}: the dataset was replaced while it was being read ({how}; e.g. by "
        "`tfshards convert --overwrite`); no pairs of the new version were mixed in: "
        "start the read again"
    )
