"""The manifest: ``tfshards.json``, written last, describing a converted dataset.

Layout (JSON object)::

    format            "tfshards"
    schema_version    version of the record schema (see record.py)
    record_schema     [{"name", "type"}] for every record feature
    image             {"encoding", "channels", "height", "width", "dtype"}; height/width
                      are null when records differ in size; dtype "uint16", or
                      absent: uint8 (as before tfshards stored 16-bit images, so
                      older tfshards read 8-bit datasets and refuse 16-bit ones)
    mask              {"encoding", "num_classes" (null when not checked), "mask_map",
                      "ignore_label" (null, or the value that marks pixels to ignore)}
    compression       {"type": "none"|"gzip"|"zlib", "level"}
    seed              the shuffle and split seed
    options           a record of how the data was made: every ConvertOptions field as
                      resolved (for people and --resume); readers use the sections above
    source            {"images", "masks", "image_pattern", "mask_pattern"}
    splits            {name: {"records", "bytes", "class_pixels", "mask_values",
                      "ignored_pixels", "shards": [{"file", "records", "bytes", "sha256",
                      "crc32c"}], "record_table": {"file", "bytes", "sha256"},
                      "image_stats": {"pixels", "mean", "std", "min", "max"}}}
    skipped           [{"key", "file", "reason"}] pairs left out by --on-error skip
    unpaired          {"images", "masks", "duplicate_keys", "ignored_files"} counts

``class_pixels[i]`` counts mask pixels of class i in that split (after any mask
map); ``mask_values`` lists the classes present there. ``record_table`` names the
split's per-record table (``<split>.records``, written before the manifest; its byte
layout is in ``schemas/record_table.py``); a manifest written before tfshards wrote
tables has none, and ``tfshards.records()`` builds it on first use. Shard and table
``file`` names are plain file names inside the dataset folder; anything else is refused.
``image_stats`` holds one value per image channel in each list: the mean, population
standard deviation, minimum and maximum of the split's stored samples, counted exactly
at conversion (``converters/image_stats.py``); absent in a manifest written before.
The manifest holds no timestamps, so the same inputs give the same bytes.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tfshards import storage
from tfshards.errors import ManifestError
from tfshards.schemas.format import (
    COMPRESSIONS,
    DEFAULT_COMPRESSION_LEVEL,
    ENCODINGS,
    IMAGE_DTYPES,
    MANIFEST_NAME,
    MAX_CHANNELS,
    itemsize,
    temporary_path,
)
from tfshards.schemas.record import SCHEMA_VERSION, schema_description
from tfshards.storage import Location, StorageOptions

FORMAT_NAME = "tfshards"
_CRC32C = re.compile(r"[0-9a-f]{8}")


@dataclass(frozen=True)
class ImageInfo:
    """How images are stored; height and width are None when records differ in size."""

    encoding: str
    channels: int
    height: int | None
    width: int | None
    dtype: str = "uint8"  # the samples' type, one of IMAGE_DTYPES

    def __post_init__(self) -> None:
        _check("image.encoding", self.encoding, self.encoding in ENCODINGS, sorted(ENCODINGS))
        _check(
            "image.channels",
            self.channels,
            isinstance(self.channels, int) and 1 <= self.channels <= MAX_CHANNELS,
            f"1..{MAX_CHANNELS}",
        )
        _check("image.dtype", self.dtype, self.dtype in IMAGE_DTYPES, list(IMAGE_DTYPES))
        sized = [v for v in (self.height, self.width) if v is not None]
        _check(
            "image.height/width",
            (self.height, self.width),
            len(sized) in (0, 2) and all(isinstance(v, int) and v > 0 for v in sized),
            "two positive integers, or both null",
        )

    @property
    def itemsize(self) -> int:
        """Bytes per sample: 1 (uint8) or 2 (uint16)."""
        return itemsize(self.dtype)


@dataclass(frozen=True)
class MaskInfo:
    """How masks are stored; num_classes is None when conversion did not check it."""

    encoding: str
    num_classes: int | None = None
    mask_map: list[list[int]] = field(default_factory=list)
    ignore_label: int | None = None  # pixels to leave out of the loss (e.g. 255, VOC-style)

    def __post_init__(self) -> None:
        _check("mask.encoding", self.encoding, self.encoding in ENCODINGS, sorted(ENCODINGS))
        _check(
            "mask.num_classes",
            self.num_classes,
            self.num_classes is None
            or (isinstance(self.num_classes, int) and self.num_classes > 0),
            "a positive integer or null",
        )


@dataclass(frozen=True)
class CompressionInfo:
    """The whole-shard compression and its zlib level."""

    type: str
    level: int = DEFAULT_COMPRESSION_LEVEL

    def __post_init__(self) -> None:
        _check("compression.type", self.type, self.type in COMPRESSIONS, list(COMPRESSIONS))


def _check(name: str, value: Any, ok: bool, expected: Any) -> None:
    if not ok:
        raise ManifestError(f"manifest field {name} is {value!r}; expected {expected}")


@dataclass(frozen=True)
class ShardInfo:
    file: str
    records: int
    bytes: int
    sha256: str
    crc32c: str | None = None  # 8 hex digits; absent in manifests written before it

    def __post_init__(self) -> None:
        _check(
            f"shard {self.file!r} crc32c",
            self.crc32c,
            self.crc32c is None or bool(_CRC32C.fullmatch(str(self.crc32c))),
            "8 lower-case hex digits",
        )

    @property
    def download_digest(self) -> tuple[str, str]:
        """The digest a downloaded copy is checked against, ``(name, hex)``: the CRC-32C
        where the manifest holds one and google-crc32c runs its C code
        (``storage.Crc32cDigest``: a fraction of sha256's CPU), else the sha256.
        ``tfshards verify`` checks both."""
        if self.crc32c is None or not storage.NATIVE_CRC32C:
            return ("sha256", self.sha256)
        return ("crc32c", self.crc32c)


@dataclass(frozen=True)
class TableInfo:
    """A split's per-record table file (``schemas/record_table.py``)."""

    file: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ImageStats:
    """Per-channel statistics of a split's stored image samples (in their own units:
    0..255 or 0..65535), over every pixel: population standard deviation."""

    pixels: int
    mean: list[float]
    std: list[float]
    min: list[int]
    max: list[int]

    def __post_init__(self) -> None:
        lengths = {len(self.mean), len(self.std), len(self.min), len(self.max)}
        _check("image_stats", lengths, len(lengths) == 1, "one value per channel in each list")


@dataclass(frozen=True)
class SplitInfo:
    records: int
    bytes: int
    class_pixels: list[int]
    shards: list[ShardInfo]
    mask_values: list[int] = field(default_factory=list)
    ignored_pixels: int = 0  # pixels at the mask's ignore_label, outside class_pixels
    record_table: TableInfo | None = None  # None: converted before tfshards wrote tables
    image_stats: ImageStats | None = None  # None: converted before tfshards counted them


@dataclass(frozen=True)
class SkippedPair:
    key: str
    file: str
    reason: str


@dataclass(frozen=True)
class Manifest:
    image: ImageInfo
    mask: MaskInfo
    compression: CompressionInfo
    seed: int
    options: dict[str, Any]
    source: dict[str, Any]
    splits: dict[str, SplitInfo]
    skipped: list[SkippedPair] = field(default_factory=list)
    unpaired: dict[str, int] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def total_records(self) -> int:
        return sum(split.records for split in self.splits.values())

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        if self.image.height is None:
            return None
        return (self.image.height, self.image.width, self.image.channels)

    @property
    def byte_shape(self) -> tuple[int, int, int] | None:
        """(H, W, C x itemsize): an image as the reader moves it before finishing, uint8
        bytes (a uint16 sample's two little-endian bytes side by side)."""
        if self.image.height is None:
            return None
        return (self.image.height, self.image.width, self.image.channels * self.image.itemsize)

    def to_json(self) -> str:
        body = {
            "format": FORMAT_NAME,
            "schema_version": self.schema_version,
            "record_schema": schema_description(),
            **{k: v for k, v in asdict(self).items() if k != "schema_version"},
        }
        if body["image"]["dtype"] == "uint8":  # as before uint16: older tfshards read it
            del body["image"]["dtype"]
        for split in body["splits"].values():  # a split without a table, as before tables
            for optional in ("record_table", "image_stats"):
                if split[optional] is None:
                    del split[optional]
        return json.dumps(body, indent=2, sort_keys=False) + "\n"

    def save(self, folder: Location, storage_options: StorageOptions = None) -> Location:
        """Write atomically: a reader sees the old manifest, no manifest, or this one."""
        if storage.is_url(folder):  # one upload: an object appears whole
            path = storage.join(folder, MANIFEST_NAME)
            storage.write_bytes(path, self.to_json().encode("utf-8"), storage_options)
            return path
        path = Path(folder) / MANIFEST_NAME
        tmp = temporary_path(path)
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(self.to_json())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        return path

    @classmethod
    def from_json(cls, text: str, *, where: str) -> Manifest:
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(body, dict) or body.get("format") != FORMAT_NAME:
            raise ManifestError(f'{where}: not a tfshards manifest (no "format": "tfshards")')
        version = body.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ManifestError(
                f"{where}: schema version {version!r} cannot be read by this tfshards, "
                f"which reads version {SCHEMA_VERSION}"
            )
        try:
            splits = {name: _split_from_json(name, raw) for name, raw in body["splits"].items()}
            return cls(
                image=_section(ImageInfo, body, "image"),
                mask=_section(MaskInfo, body, "mask"),
                compression=_section(CompressionInfo, body, "compression"),
                seed=body["seed"],
                options=body["options"],
                source=body["source"],
                splits=splits,
                skipped=[SkippedPair(**item) for item in body.get("skipped", [])],
                unpaired=body.get("unpaired", {}),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({exc!r})") from exc

    @classmethod
    def load(cls, folder: Location, storage_options: StorageOptions = None) -> Manifest:
        """Read ``folder/tfshards.json``; ``folder`` may be a URL (``s3://bucket/prefix``)."""
        if storage.is_url(folder):
            path = storage.join(folder, MANIFEST_NAME)
            try:
                data = storage.read_bytes(path, storage_options)
            except FileNotFoundError:
                raise _no_manifest(folder) from None
            return cls.from_json(data.decode("utf-8"), where=storage.display(path))
        path = Path(folder) / MANIFEST_NAME
        try:  # not is_file() first: `convert --overwrite` may remove it in between
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise _no_manifest(folder) from None
        return cls.from_json(text, where=str(path))


def _no_manifest(folder: Location) -> ManifestError:
    if not storage.is_url(folder):  # a mistyped path is not an unfinished conversion
        local = Path(folder)
        where = folder if local.is_absolute() else f"{folder} ({local.absolute()})"
        if not local.exists():
            return ManifestError(f"{where}: no such folder")
        if not local.is_dir():
            return ManifestError(f"{where}: a file, not a dataset folder")
    return ManifestError(
        f"{storage.display(folder)}: no manifest ({MANIFEST_NAME}): not a finished dataset; "
        "if `tfshards convert` was writing it, rerun the conversion (or add --resume) to "
        "finish it"
    )


def _section(kind: type, body: dict[str, Any], name: str):
    """A typed section; a missing or unknown field is named in the error."""
    raw = body.get(name)
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest field {name} is {raw!r}; expected an object")
    try:
        return kind(**raw)
    except TypeError as exc:
        raise ManifestError(f"manifest section {name}: {exc}") from exc


def _present(class_pixels: list[int]) -> list[int]:
    return [value for value, pixels in enumerate(class_pixels) if pixels]


def _split_from_json(name: str, raw: dict[str, Any]) -> SplitInfo:
    shards = [ShardInfo(**item) for item in raw["shards"]]
    for shard in shards:
        _check_shard_name(shard.file)
    if sum(shard.records for shard in shards) != raw["records"]:
        raise ManifestError(
            f"split {name!r}: records ({raw['records']}) differ from the sum over its shards "
            f"({sum(shard.records for shard in shards)})"
        )
    table = raw.get("record_table")
    if table is not None:
        table = TableInfo(**table)
        _check_shard_name(table.file)
    stats = raw.get("image_stats")
    return SplitInfo(
        image_stats=None if stats is None else ImageStats(**stats),
        records=raw["records"],
        bytes=raw["bytes"],
        class_pixels=list(raw["class_pixels"]),
        mask_values=list(raw.get("mask_values", _present(raw["class_pixels"]))),
        ignored_pixels=raw.get("ignored_pixels", 0),
        shards=shards,
        record_table=table,
    )


def _check_shard_name(name: str) -> None:
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
    ):
        raise ManifestError(
            f"shard path {name!r} is refused: shard files must be plain names inside the "
            "dataset folder"
        )
