"""``tfshards.records()``: a split's per-record table, loaded and checked, or built once.

A dataset converted by this tfshards lists each split's table in its manifest
(``<split>.records`` beside the shards; the byte layout is in
``schemas/record_table.py``): it is read and checked against the manifest (size,
sha256, record count, each class's pixels). A dataset converted before has none: the
table is built on first use by one pass over the split's masks (pure Python, no
TensorFlow; images are not decoded; a dataset in a bucket is downloaded a shard at a
time) and kept in the user cache folder, never written into the dataset (which may be
read-only or shared), as ``record-tables/<manifest sha256>-<split>.records``: the
table's own sha256 (32 bytes), then the table's bytes. A new conversion has another
manifest, so it never meets an old table. A kept file that is damaged or disagrees
with the manifest is the cache's fault: a warning names it, it is removed and the
table built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

from tqdm import tqdm

from tfshards import storage
from tfshards.arguments import checked_bool, checked_path, checked_str
from tfshards.checks.shard_io import local_shard
from tfshards.errors import ManifestError, RecordTableError
from tfshards.readers.shards import SplitShards
from tfshards.schemas.format import MANIFEST_NAME, RECORDS_SUFFIX
from tfshards.schemas.manifest import Manifest, SplitInfo
from tfshards.schemas.record_table import (
    RecordTable,
    check_against,
    shard_rows,
    table_from_bytes,
)
from tfshards.sources.folders import user_cache_dir
from tfshards.storage import Location, StorageOptions

log = logging.getLogger("tfshards")
_DIGEST_BYTES = 32  # a kept table starts with its sha256
_PROGRESS_DELAY_S = 2.0  # builds shorter than this show no bar


def default_tables_folder() -> Path:
    """Built tables are kept here: ``$XDG_CACHE_HOME/tfshards/record-tables``."""
    return user_cache_dir() / "record-tables"


def records(
    path: str | os.PathLike,
    split: str = "train",
    *,
    storage_options: StorageOptions = None,
    progress: bool = True,
) -> RecordTable:
    """The per-record table of ``split``: one row per record, in the split's manifest order.

    >>> table = tfshards.records("shards", "train")  # doctest: +SKIP
    >>> len(table), table.keys[0], table.class_pixels.shape  # doctest: +SKIP
    (180, 'images/003', (180, 3))
    >>> rare = table.records_with(2)  # indices of the records that hold class 2  # doctest: +SKIP

    ``path`` may be a URL (``s3://bucket/shards``; ``storage_options`` for fsspec). A
    dataset converted before tfshards wrote tables gets its table built on first use
    (one pass over the masks, with a tqdm bar where ``progress`` and the build takes
    more than a few seconds) and kept in the user cache folder. RecordTableError names
    the file when a table is damaged or disagrees with the manifest.
    """
    checked_path("path", path)
    checked_str("split", split)
    checked_bool("progress", progress)
    root = str(path).rstrip("/") if storage.is_url(path) else Path(path)
    text, manifest = _manifest(root, storage_options)
    if split not in manifest.splits:
        raise ManifestError(
            f"{storage.display(root)}: no split {split!r}; this dataset has "
            f"{', '.join(manifest.splits)}"
        )
    info = manifest.splits[split]
    if info.record_table is not None:
        return listed_table(root, info, storage_options)
    digest = hashlib.sha256(text).hexdigest()
    kept = default_tables_folder() / f"{digest}-{split}{RECORDS_SUFFIX}"
    table = _load_kept(kept, info)
    if table is None:
        log.info(
            "%s: split %s has no per-record table (converted before tfshards wrote them); "
            "building it from the masks of its %d records, once (kept in %s)",
            storage.display(root),
            split,
            info.records,
            kept.parent,
        )
        table = build_table(root, manifest, split, storage_options, progress=progress)
        _keep(kept, table.to_bytes())
    return table


def _manifest(root: Location, storage_options: StorageOptions) -> tuple[bytes, Manifest]:
    """The manifest's bytes (the kept table's key) and the manifest they hold."""
    location = storage.join(root, MANIFEST_NAME)
    try:
        text = storage.read_bytes(location, storage_options)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        Manifest.load(root, storage_options)  # raises the error that names the cause
        raise
    where = storage.display(location)
    return text, Manifest.from_json(text.decode("utf-8", "replace"), where=where)


def listed_table(root: Location, info: SplitInfo, storage_options: StorageOptions) -> RecordTable:
    """The table the manifest lists for a split, checked against it."""
    location = storage.join(root, info.record_table.file)
    where = storage.display(location)
    try:
        data = storage.read_bytes(location, storage_options)
    except FileNotFoundError:
        raise RecordTableError(f"{where}: missing, but the manifest lists it") from None
    return table_from_bytes(data, info, where)


def build_table(
    root: Location,
    manifest: Manifest,
    split: str,
    storage_options: StorageOptions = None,
    *,
    progress: bool = False,
) -> RecordTable:
    """The table of ``split`` from its shards' masks: the bytes a conversion writes."""
    info = manifest.splits[split]
    tables = []
    bar = tqdm(
        total=info.records,
        unit="record",
        desc=f"per-record table of {split}",
        disable=not progress,
        delay=_PROGRESS_DELAY_S,
    )
    with bar:
        for shard in info.shards:
            where = storage.display(storage.join(root, shard.file))
            with local_shard(root, shard.file, storage_options) as local:
                if local is None:
                    raise RecordTableError(f"{where}: missing; the table cannot be built")
                rows = []
                ignore = manifest.mask.ignore_label
                for row in shard_rows(local, manifest.compression.type, ignore, where):
                    rows.append(row)
                    bar.update()
            tables.append(RecordTable.from_rows(rows, 256))
    table = RecordTable.concatenated(tables, len(info.class_pixels))
    return check_against(table, info, f"the table built from {storage.display(root)}")


def _load_kept(kept: Path, info: SplitInfo) -> RecordTable | None:
    """The kept table if it is whole and agrees with the split; None where there is none
    (a damaged or disagreeing one is named in a warning and removed)."""
    try:
        data = kept.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        problem = f"unreadable ({exc.strerror or exc})"
    else:
        digest, body = data[:_DIGEST_BYTES], data[_DIGEST_BYTES:]
        try:
            if hashlib.sha256(body).digest() != digest:
                raise RecordTableError("its sha256 differs from the one it was kept with")
            return check_against(RecordTable.from_bytes(body, where=str(kept)), info, str(kept))
        except RecordTableError as exc:
            problem = str(exc).removeprefix(f"{kept}: ")
    log.warning(
        "%s: kept per-record table is damaged (%s); removed, it is built again (the "
        "dataset is not at fault: this file is in the user cache folder)",
        kept,
        problem,
    )
    with contextlib.suppress(OSError):
        kept.unlink(missing_ok=True)
    return None


def _keep(kept: Path, data: bytes) -> None:
    """Write atomically; a cache folder that cannot be written only costs a rebuild."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        tmp.write_bytes(hashlib.sha256(data).digest() + data)
        os.replace(tmp, kept)
    except OSError as exc:
        log.warning("%s: the built table cannot be kept (%s); built again next time", kept, exc)


def split_table(shards: SplitShards, storage_options: StorageOptions = None) -> RecordTable:
    """The table of the split a reader opened (``read(records=, sampling=)``, ``Pairs``)."""
    return records(shards.root, shards.split, storage_options=storage_options)
