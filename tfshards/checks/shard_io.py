"""Open a shard for reading in pure Python: decompression, records."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tfshards import storage
from tfshards.schemas.format import COMPRESSIONS
from tfshards.schemas.tfrecord import iter_records, parse_example
from tfshards.storage import Location, StorageOptions


def open_records(path: Path, compression: str):
    """A binary stream of the shard's uncompressed TFRecord bytes."""
    return COMPRESSIONS[compression].open(path)


def shard_examples(path: Path, compression: str) -> Iterator[dict[str, bytes | int]]:
    """Every record of a shard as a feature dict; raises on corrupt framing or data."""
    with open_records(path, compression) as stream:
        for data in iter_records(stream):
            yield parse_example(data)


@contextlib.contextmanager
def local_shard(
    root: Location, file: str, storage_options: StorageOptions = None
) -> Iterator[Path | None]:
    """The shard ``root/file`` as a local path (None when it is missing): itself in a local
    folder; from a bucket, downloaded whole into a temporary folder removed afterwards."""
    if not storage.is_url(root):
        path = Path(root) / file
        yield path if path.is_file() else None
        return
    with tempfile.TemporaryDirectory(prefix="tfshards-check-") as tmp:
        local = Path(tmp) / file
        try:
            storage.get(storage.join(root, file), local, storage_options)
        except FileNotFoundError:
            yield None
            return
        yield local
