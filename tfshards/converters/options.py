"""Conversion options: one frozen dataclass that checks itself on creation."""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from tfshards.arguments import checked_bool, checked_int, checked_size, is_int
from tfshards.errors import OptionsError
from tfshards.schemas import deflate
from tfshards.schemas.format import (
    AUTO,
    COMPRESSION_LEVELS,
    COMPRESSIONS,
    DEFAULT_COMPRESSION_LEVEL,
    DEFAULT_ENCODING,
    IMAGE_DTYPES,
    MAX_CHANNELS,
    compression,
    image_encoding,
    mask_encoding,
    resolved_compression,
    resolved_mask_encoding,
)
from tfshards.schemas.tiles import check_tiling

DEFAULT_SHARD_SIZE = 128 * 2**20
# Pixels of one image and its mask decoded whole (PNG, JPEG, untiled TIFF) when tiling.
DEFAULT_DECODE_LIMIT = 2**30
COMPRESSION_CHOICES = (AUTO, *COMPRESSIONS)
# --binary-masks: black/white masks as classes 0 and 1 (0/1 masks pass unchanged).
BINARY_MASK_MAP = ((0, 0), (1, 1), (255, 1))
ON_ERROR = ("fail", "skip")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
}


@dataclass(frozen=True)
class ConvertOptions:
    """Everything that decides the bytes of the output.

    >>> ConvertOptions(encoding="raw", val_fraction=0.1, num_classes=2)  # doctest: +ELLIPSIS
    ConvertOptions(encoding='raw', ...)
    """

    encoding: str = DEFAULT_ENCODING
    mask_encoding: str = AUTO
    compression: str = AUTO
    compression_level: int = DEFAULT_COMPRESSION_LEVEL
    deflate_library: str = "auto"
    num_shards: int | None = None
    shard_size: int = DEFAULT_SHARD_SIZE
    val_fraction: float = 0.0
    test_fraction: float = 0.0
    seed: int = 0
    channels: int | None = None
    image_dtype: str | None = None  # "uint8" or "uint16"; None: the first image's
    num_classes: int | None = None
    mask_map: tuple[tuple[int, int], ...] | None = None
    binary_masks: bool = False
    ignore_label: int | None = None
    resize: tuple[int, int] | None = None
    on_error: str = "fail"
    index: bool = False
    tfds_metadata: bool = False
    # Tiles (docs/large-images.md): None keeps one record per pair, except images over
    # Pillow's pixel limit, tiled by AUTO_TILE; decode_limit bounds an image decoded whole.
    tile_size: int | None = None
    tile_overlap: int = 0
    tile_smaller: str = "keep"
    decode_limit: int = DEFAULT_DECODE_LIMIT

    def __post_init__(self) -> None:
        self._check_types()
        image_encoding(self.encoding)
        if self.mask_encoding != AUTO:
            mask_encoding(self.mask_encoding)
        _one_of("compression", self.compression, COMPRESSION_CHOICES)
        _one_of("on_error", self.on_error, ON_ERROR)
        if self.compression_level not in COMPRESSION_LEVELS:
            raise OptionsError(
                f"compression_level must be {COMPRESSION_LEVELS.start}.."
                f"{COMPRESSION_LEVELS.stop - 1} (zlib levels), got {self.compression_level}"
            )
        try:
            deflate.check_library(self.deflate_library)
        except ValueError as exc:
            raise OptionsError(str(exc)) from None
        if self.num_shards is not None and self.num_shards < 1:
            raise OptionsError(f"num_shards must be at least 1, got {self.num_shards}")
        if self.shard_size < 1:
            raise OptionsError(f"shard_size must be positive, got {self.shard_size}")
        for name in ("val_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise OptionsError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise OptionsError(
                "val_fraction + test_fraction must leave some pairs for training, got "
                f"{self.val_fraction} + {self.test_fraction}"
            )
        self._check_layout()
        self._check_masks()
        check_tiling(self.tile_size, self.tile_overlap, self.tile_smaller)
        checked_int("decode_limit", self.decode_limit, low=1)
        if self.tile_size is not None and self.resize is not None:
            raise OptionsError("tile_size and resize exclude each other: tiles keep source pixels")
        shards = compression(resolved_compression(self.compression))
        if self.tfds_metadata and not shards.tfds_readable:
            raise OptionsError(
                f"TFDS metadata needs uncompressed shards: TFDS reads no {self.compression} "
                "TFRecords; use compression none"
            )
        if self.index and not shards.index_seekable:
            raise OptionsError(
                f"index files need uncompressed shards (got compression {self.compression!r}): "
                "DALI and the tfrecord package seek to byte offsets in the file"
            )

    def _check_layout(self) -> None:
        """channels and image_dtype are ones tfshards stores, in this encoding."""
        if self.channels is not None and not 1 <= self.channels <= MAX_CHANNELS:
            raise OptionsError(
                f"channels must be 1..{MAX_CHANNELS} (or None: auto), got {self.channels}"
            )
        if self.image_dtype not in (None, *IMAGE_DTYPES):
            raise OptionsError(
                f"image_dtype must be {' or '.join(IMAGE_DTYPES)} (or None: the first "
                f"image's), got {self.image_dtype!r}"
            )
        if self.channels is not None:
            reason = image_encoding(self.encoding).refuses(
                self.channels, self.image_dtype or "uint8"
            )
            if reason is not None:
                raise OptionsError(reason)

    def _check_types(self) -> None:
        """Integers are integers and flags bools: ``num_shards=2.5`` or ``seed="x"`` would
        otherwise be taken, or fail inside a worker in Python's words."""
        for name in _COUNTS:
            checked_int(name, getattr(self, name), none=name in _OPTIONAL)
        for name in ("binary_masks", "index", "tfds_metadata"):
            checked_bool(name, getattr(self, name))
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise OptionsError(f"{name} must be a number in [0, 1); got {value!r}")
        if self.resize is not None:
            object.__setattr__(self, "resize", checked_size("resize", self.resize))
        if self.mask_map is not None:
            object.__setattr__(self, "mask_map", _checked_mask_map(self.mask_map))

    def _check_masks(self) -> None:
        if self.num_classes is not None and not 1 <= self.num_classes <= 256:
            raise OptionsError(
                f"num_classes must be 1..256 (masks are stored as uint8), got {self.num_classes}"
            )
        other_map = self.mask_map not in (None, BINARY_MASK_MAP)
        if self.binary_masks and (other_map or self.num_classes not in (None, 2)):
            raise OptionsError(
                "binary_masks maps 0 -> 0 and 1 or 255 -> 1 with 2 classes; it cannot be "
                "combined with mask_map or another num_classes"
            )
        if self.ignore_label is not None and not 0 <= self.ignore_label <= 255:
            raise OptionsError(f"ignore_label must be 0..255, got {self.ignore_label}")
        if self.mask_map is not None:
            for source, target in self.mask_map:
                if not 0 <= source < 2**16 or not 0 <= target < 256:
                    raise OptionsError(
                        f"mask_map entry {source}:{target}: sources must be 0..65535 and "
                        "targets 0..255"
                    )

    def resolved(self, channels: int, image_dtype: str = "uint8") -> ConvertOptions:
        """Concrete values for 'auto' settings.

        mask_encoding 'auto' follows images encoded raw or deflate (so the reader decodes
        whole batches), else keep. compression 'auto' is none: deflate and PNG/JPEG bytes
        are compressed already (gzip does not shrink them: 39.8 MiB of PNGs stay 39.8 MiB
        at twice the time), and a gzip stream over raw pixels reads at about half the speed
        of deflate records, which are inflated in parallel (benchmarks/README.md).
        """
        binary = {"mask_map": BINARY_MASK_MAP, "num_classes": 2} if self.binary_masks else {}
        return replace(
            self,
            **binary,
            channels=channels,
            image_dtype=image_dtype,
            mask_encoding=resolved_mask_encoding(self.mask_encoding, self.encoding),
            compression=resolved_compression(self.compression),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ConvertOptions fields that are integers; those in _OPTIONAL may be None (auto).
_COUNTS = (
    "compression_level",
    "num_shards",
    "shard_size",
    "seed",
    "channels",
    "num_classes",
    "ignore_label",
)
_OPTIONAL = ("num_shards", "channels", "num_classes", "ignore_label")


def _one_of(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise OptionsError(f"{name} must be one of {', '.join(valid)}; got {value!r}")


def parse_size(text: str) -> int:
    """'128MiB' -> 134217728; plain numbers are bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise OptionsError(f"size {text!r} not understood; use e.g. 128MiB, 500MB, 1GiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _checked_mask_map(value: Any) -> tuple[tuple[int, int], ...]:
    """``mask_map`` as (source, target) pairs: a mapping ``{255: 1}`` is taken as its
    items (it iterated as its keys, failing in Python's words)."""
    entries = list(value.items()) if isinstance(value, Mapping) else value
    if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
        raise OptionsError(f"mask_map must be (source, target) pairs or a mapping; got {value!r}")
    pairs = []
    for entry in entries:
        if not isinstance(entry, Sequence) or len(entry) != 2 or not all(map(is_int, entry)):
            raise OptionsError(f"mask_map entries must be (source, target) integers; got {entry!r}")
        pairs.append((entry[0], entry[1]))
    return tuple(pairs)


def parse_mask_map(text: str) -> tuple[tuple[int, int], ...]:
    """'0:0,255:1' -> ((0, 0), (255, 1))."""
    entries = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise OptionsError(f"mask map entry {item!r} not understood; use e.g. 0:0,255:1")
        entries.append((int(parts[0]), int(parts[1])))
    sources = [s for s, _ in entries]
    if len(set(sources)) != len(sources):
        raise OptionsError(f"mask map {text!r} maps a value twice")
    return tuple(sorted(entries))


def parse_hw(text: str) -> tuple[int, int]:
    """'256x320' -> (256, 320), height first."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match:
        raise OptionsError(f"size {text!r} not understood; use HEIGHTxWIDTH, e.g. 256x256")
    return int(match.group(1)), int(match.group(2))
