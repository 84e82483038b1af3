"""The record schema: the one description of what a shard's tf.train.Example holds.

Every record has these features (one value each):

==================  =======  ==================================================
name                type     meaning
==================  =======  ==================================================
key                 bytes    the pair's key (UTF-8; the relative path without
                             extension, or the ``{key}`` of a name pattern)
image/encoded       bytes    image pixels (uint8, or uint16: the manifest's
                             ``image.dtype``) in ``image/format``
image/format        bytes    ``png``, ``jpeg``, ``raw`` or ``deflate`` (see format.py)
image/height        int64    height in pixels
image/width         int64    width in pixels
image/channels      int64    1 to 64 (1 grayscale, 3 RGB, 4 RGBA, or any bands)
mask/encoded        bytes    class indices (uint8) in ``mask/format``
mask/format         bytes    ``png``, ``raw`` or ``deflate``
mask/channels       int64    always 1; mask height and width equal the image's
source/key          bytes    a tile's source: the key of the image it was cut from
                             (``schemas/tiles.py``)
source/row          int64    the tile's top row in that image
source/column       int64    its left column; its window is (row, column,
                             image/height, image/width)
==================  =======  ==================================================

The three ``source/`` features are written for tiles only: a record without them is a
whole image (its window is the image), byte for byte as before tiles existed.

The writer builds records with :meth:`EncodedPair.to_example`; the TF reader
parses them with :func:`tf_feature_spec`; the checks (verify, inspect) decode a
parsed record in pure Python with :func:`decode_record`; the TFDS metadata is
derived from :data:`FIELDS` (``pixels`` marks the two pixel fields).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tfshards.schemas.format import decode_pixels
from tfshards.schemas.tfrecord import serialize_example

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Field:
    """One feature. ``pixels``: "image" or "mask" for the encoded pixel bytes, else None.
    ``required``: False for features that older records lack."""

    name: str
    kind: Literal["bytes", "int64"]
    pixels: Literal["image", "mask"] | None = None
    required: bool = True


FIELDS: tuple[Field, ...] = (
    Field("key", "bytes"),
    Field("image/encoded", "bytes", pixels="image"),
    Field("image/format", "bytes"),
    Field("image/height", "int64"),
    Field("image/width", "int64"),
    Field("image/channels", "int64"),
    Field("mask/encoded", "bytes", pixels="mask"),
    Field("mask/format", "bytes"),
    Field("mask/channels", "int64"),
    Field("source/key", "bytes", required=False),
    Field("source/row", "int64", required=False),
    Field("source/column", "int64", required=False),
)


@dataclass(frozen=True)
class EncodedPair:
    """One pair, encoded and ready to be written as a record."""

    key: str
    image: bytes
    image_format: str
    height: int
    width: int
    channels: int
    mask: bytes
    mask_format: str
    source: str | None = None  # a tile's source key (None: the record is a whole image)
    row: int = 0  # the tile's window in its source
    column: int = 0

    def to_example(self) -> bytes:
        values: dict[str, bytes | int] = {
            "key": os.fsencode(self.key),
            "image/encoded": self.image,
            "image/format": self.image_format.encode(),
            "image/height": self.height,
            "image/width": self.width,
            "image/channels": self.channels,
            "mask/encoded": self.mask,
            "mask/format": self.mask_format.encode(),
            "mask/channels": 1,
        }
        if self.source is not None:  # a tile; a whole image's record is as it always was
            values.update(
                {"source/key": os.fsencode(self.source), "source/row": self.row,
                 "source/column": self.column}
            )  # fmt: skip
        return serialize_example({f.name: values[f.name] for f in FIELDS if f.name in values})


def schema_description() -> list[dict[str, str]]:
    """The schema as stored in the manifest."""
    return [{"name": field.name, "type": field.kind} for field in FIELDS]


def tf_feature_spec() -> dict:
    """The feature spec for ``tf.io.parse_example`` / ``parse_single_example``."""
    import tensorflow as tf

    dtypes = {"bytes": tf.string, "int64": tf.int64}
    absent = {"bytes": b"", "int64": 0}  # an optional feature a record lacks (not a tile)
    return {
        field.name: tf.io.FixedLenFeature(
            [], dtypes[field.kind], None if field.required else absent[field.kind]
        )
        for field in FIELDS
    }


@dataclass(frozen=True)
class DecodedRecord:
    """One record decoded in pure Python: image uint8 or uint16 [H, W, C], mask uint8
    [H, W]."""

    key: str
    image: np.ndarray
    mask: np.ndarray


def decode_record(
    features: Mapping[str, bytes | int | None], image_dtype: str = "uint8"
) -> DecodedRecord:
    """Decode a parsed record (``tfrecord.parse_example``) by its own formats, its image
    samples of ``image_dtype`` (the manifest's ``image.dtype``).

    Raises ValueError saying which feature is missing or which pixels do not decode.
    """
    _check_features(features)
    key = features["key"].decode("utf-8", "replace")
    image = _plane(features, "image", image_dtype)
    return DecodedRecord(key, image, _plane(features, "mask")[:, :, 0])


def decode_mask(features: Mapping[str, bytes | int | None]) -> tuple[str, np.ndarray]:
    """The key (as the converter had it: ``os.fsdecode``, the inverse of the writer's
    ``os.fsencode``) and the mask uint8 [H, W] of a parsed record, the image left
    undecoded (the per-record table's pass over a dataset); ValueError as
    :func:`decode_record`."""
    _check_features(features)
    return os.fsdecode(features["key"]), _plane(features, "mask")[:, :, 0]


def _check_features(features: Mapping[str, bytes | int | None]) -> None:
    missing = [f.name for f in FIELDS if f.required and features.get(f.name) is None]
    if missing:
        raise ValueError(f"missing features {missing}")


def _plane(
    features: Mapping[str, bytes | int | None], part: str, dtype: str = "uint8"
) -> np.ndarray:
    """The decoded pixels [H, W, C] of ``part`` ("image" or "mask")."""
    height, width = int(features["image/height"]), int(features["image/width"])
    try:
        return decode_pixels(
            features[f"{part}/encoded"],
            features[f"{part}/format"].decode(errors="replace"),
            height,
            width,
            int(features[f"{part}/channels"]),
            dtype,
        )
    except (ValueError, OSError, KeyError) as exc:
        raise ValueError(f"{part} does not decode: {exc}") from exc
