"""`tfshards verify`: check every shard against the manifest and every record against the schema.

Each split's per-record table, where the manifest lists one, is checked too: present,
its size and sha256 as listed, its rows as many as the split's records with the
manifest's pixels per class (also with ``quick``); and, where every record is decoded,
each row's key, size, class pixels and cells against the record's mask."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tfshards import storage
from tfshards.checks.shard_io import local_shard, shard_examples
from tfshards.errors import ManifestError, RecordTableError
from tfshards.schemas.format import OWN_NAMES, SHARD_LIKE, index_path
from tfshards.schemas.manifest import Manifest, ShardInfo, SplitInfo
from tfshards.schemas.record import DecodedRecord, decode_record
from tfshards.schemas.record_table import RecordTable, record_row, table_from_bytes
from tfshards.storage import Location, StorageOptions


@dataclass
class ShardCheck:
    split: str
    file: str
    records_expected: int
    records_found: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class VerifyReport:
    path: Location
    quick: bool
    shards: list[ShardCheck]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(shard.ok for shard in self.shards)

    def table(self) -> str:
        lines = [f"{'split':6s} {'shard':36s} {'records':>15s}  status"]
        for shard in self.shards:
            found = "-" if shard.records_found is None else str(shard.records_found)
            status = "ok" if shard.ok else "; ".join(shard.problems)
            lines.append(
                f"{shard.split:6s} {shard.file:36s} "
                f"{found + '/' + str(shard.records_expected):>15s}  {status}"
            )
        lines += [f"problem: {problem}" for problem in self.problems]
        lines.append(
            f"{'OK' if self.ok else 'FAILED'}: {self.path} "
            f"({'sizes and hashes' if self.quick else 'every record'} checked)"
        )
        return "\n".join(lines)


def verify(
    path: str | os.PathLike,
    *,
    quick: bool = False,
    progress: Callable[[int], None] | None = None,
    storage_options: StorageOptions = None,
) -> VerifyReport:
    """Check a converted dataset; the report says what is wrong, shard by shard.

    ``path`` may be a URL (``s3://bucket/shards``): each shard is then downloaded to a
    temporary folder, checked and removed, one at a time.

    >>> report = tfshards.verify("shards/")  # doctest: +SKIP
    >>> report.ok, [s.problems for s in report.shards if not s.ok]  # doctest: +SKIP
    """
    root = path if storage.is_url(path) else Path(path)
    try:
        manifest = Manifest.load(root, storage_options)
    except ManifestError as exc:
        return VerifyReport(root, quick, [], [str(exc)])
    report = VerifyReport(root, quick, [])
    report.problems += _stray_files(root, manifest, storage_options)
    keys: dict[bytes, str] = {}
    for split, info in manifest.splits.items():
        rows = _table_rows(root, info, manifest.mask.ignore_label, storage_options, report)
        first = 0  # the split's index of the shard's first record
        for shard in info.shards:
            check = ShardCheck(split, shard.file, shard.records)
            report.shards.append(check)
            with local_shard(root, shard.file, storage_options) as local:
                if _file_matches(local, shard, check) and not quick:
                    _check_records(local, manifest, check, keys, rows and rows.at(first))
            first += shard.records
            if progress is not None:
                progress(1)
    return report


@dataclass
class TableRows:
    """A split's per-record table, compared row by row with the records' masks."""

    table: RecordTable
    file: str
    ignore_label: int | None
    problems: list[str]
    first: int = 0  # the split's index of the shard being checked
    _reported: int = 0

    def at(self, first: int) -> TableRows:
        self.first = first
        return self

    def check(self, local: int, key: str, mask: np.ndarray) -> None:
        """Whether row ``first + local`` is what the record's mask gives; a difference is
        a problem naming the table file (at most 5 per table)."""
        index = self.first + local
        if index >= len(self.table) or self._reported >= 5:
            return
        found, expected = self.table.row(index), record_row(key, mask, self.ignore_label)
        different = [
            name
            for name in ("key", "height", "width", "ignored_pixels")
            if getattr(found, name) != getattr(expected, name)
        ]
        for name in ("class_ids", "class_counts", "class_cells"):
            if not np.array_equal(getattr(found, name), getattr(expected, name)):
                different.append(name.replace("_", " "))
        if different:
            self._reported += 1
            self.problems.append(
                f"{self.file}: row {index} (key {found.key!r}) disagrees with the record's "
                f"mask (key {key!r}): {', '.join(different)} differ"
            )


def _table_rows(
    root: Location,
    info: SplitInfo,
    ignore_label: int | None,
    storage_options: StorageOptions,
    report: VerifyReport,
) -> TableRows | None:
    """The split's table checked against the manifest (size, sha256, rows, class pixels),
    for the records to be compared with; None (and a problem) where it is not whole."""
    if info.record_table is None:  # converted before tfshards wrote tables
        return None
    location = storage.join(root, info.record_table.file)
    where = storage.display(location)
    try:
        data = storage.read_bytes(location, storage_options)
        table = table_from_bytes(data, info, where)
    except FileNotFoundError:
        report.problems.append(f"{where}: missing, but the manifest lists it")
        return None
    except RecordTableError as exc:
        report.problems.append(str(exc))
        return None
    return TableRows(table, where, ignore_label, report.problems)


def _stray_files(root: Location, manifest: Manifest, storage_options: StorageOptions) -> list[str]:
    listed = {s.file for split in manifest.splits.values() for s in split.shards}
    listed |= {index_path(Path(name)).name for name in listed}
    if storage.is_url(root):
        names = [n for n in storage.walk(root, storage_options) if "/" not in n]
    else:
        names = sorted(os.listdir(root))
    return [
        f"stray file {name!r} looks like a shard but is not in the manifest"
        for name in names
        if name not in listed and name not in OWN_NAMES and SHARD_LIKE.search(name)
    ]


def _file_matches(path: Path | None, shard: ShardInfo, check: ShardCheck) -> bool:
    if path is None or not path.is_file():
        check.problems.append("missing")
        return False
    size = path.stat().st_size
    if size != shard.bytes:
        check.problems.append(f"{size} bytes, manifest says {shard.bytes} (truncated or replaced)")
        return False
    expected = {"sha256": shard.sha256}
    if shard.crc32c is not None:
        expected["crc32c"] = shard.crc32c
    for name, digest in storage.file_digests(path, list(expected)).items():
        if digest != expected[name]:
            check.problems.append(f"{name} differs from the manifest (corrupted or replaced)")
            return False
    return True


def _check_records(
    path: Path,
    manifest: Manifest,
    check: ShardCheck,
    keys: dict[bytes, str],
    rows: TableRows | None,
) -> None:
    compression = manifest.compression.type
    num_classes = manifest.mask.num_classes
    ignore = manifest.mask.ignore_label
    found = 0
    try:
        for found, features in enumerate(shard_examples(path, compression), start=1):
            problem, decoded = _record_problem(features, manifest, num_classes, ignore)
            if decoded is not None and rows is not None:
                rows.check(found - 1, os.fsdecode(features["key"]), decoded.mask)
            key = features.get("key")
            if problem is None and key in keys:
                problem = f"key {key!r} also in {keys[key]}"
            if problem is not None:
                check.problems.append(f"record {found - 1}: {problem}")
                if len(check.problems) >= 5:
                    break
            keys[key] = check.file
    except (ValueError, OSError, EOFError) as exc:  # framing, CRC, decompression
        check.problems.append(f"unreadable after {found} records: {exc}")
    check.records_found = found
    if found != check.records_expected and not check.problems:
        check.problems.append(f"{found} records, manifest says {check.records_expected}")


def _record_problem(
    features: dict, manifest: Manifest, num_classes: int | None, ignore: int | None
) -> tuple[str | None, DecodedRecord | None]:
    """What is wrong with a parsed record (None if nothing), and the record decoded: its
    pixels of the manifest's dtype and channels, its mask values below num_classes."""
    try:
        decoded = decode_record(features, manifest.image.dtype)
    except ValueError as exc:
        return str(exc), None
    channels = decoded.image.shape[2]
    if channels != manifest.image.channels:
        return f"{channels} image channels, manifest says {manifest.image.channels}", decoded
    mask = decoded.mask
    labelled = mask if ignore is None else mask[mask != ignore]
    if num_classes is not None and labelled.size and int(np.max(labelled)) >= num_classes:
        return f"mask value {int(np.max(labelled))} is not below num_classes {num_classes}", decoded
    return None, decoded
