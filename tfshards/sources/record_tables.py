"""A split's per-record table for the reader (placeholder until conversion writes it)."""

from __future__ import annotations

from tfshards.schemas.record_table import RecordTable, record_row
from tfshards.storage import StorageOptions


def split_table(shards, storage_options: StorageOptions = None) -> RecordTable:
    from tfshards.sources.pairs import Pairs

    pairs = Pairs(shards.root, shards.split, with_keys=True)
    ignore = shards.manifest.mask.ignore_label
    rows = [record_row(key, mask, ignore) for _, mask, key in (pairs[i] for i in range(len(pairs)))]
    classes = shards.manifest.mask.num_classes or 1 + max(
        (int(r.class_ids.max()) for r in rows if r.class_ids.size), default=0
    )
    return RecordTable.from_rows(rows, classes)
