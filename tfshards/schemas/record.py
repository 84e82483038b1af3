"""The record schema: the one description of what a shard's tf.train.Example holds.

Every record has these features (one value each):

==================  =======  ==================================================
name                type     meaning
==================  =======  ==================================================
key                 bytes    the pair's key (UTF-8; the relative path without
                             extension, or the ``{key}`` of a name pattern)
image/encoded       bytes    image pixels in ``image/format``
image/format        bytes    ``png``, ``jpeg``, ``raw`` or ``deflate`` (see format.py)
image/height        int64    height in pixels
image/width         int64    width in pixels
image/channels      int64    1 (grayscale), 3 (RGB) or 4 (RGBA)
mask/encoded        bytes    class indices (uint8) in ``mask/format``
mask/format         bytes    ``png``, ``raw`` or ``deflate``
mask/channels       int64    always 1; mask height and width equal the image's
==================  =======  ==================================================

The writer builds records with :func:`encode_record`; the reader parses them
with :func:`tf_feature_spec`; ``format.py`` decodes the pixels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from tfshards.schemas.tfrecord import serialize_example

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Field:
    name: str
    kind: Literal["bytes", "int64"]


FIELDS: tuple[Field, ...] = (
    Field("key", "bytes"),
    Field("image/encoded", "bytes"),
    Field("image/format", "bytes"),
    Field("image/height", "int64"),
    Field("image/width", "int64"),
    Field("image/channels", "int64"),
    Field("mask/encoded", "bytes"),
    Field("mask/format", "bytes"),
    Field("mask/channels", "int64"),
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
        return serialize_example({field.name: values[field.name] for field in FIELDS})


def schema_description() -> list[dict[str, str]]:
    """The schema as stored in the manifest."""
    return [{"name": field.name, "type": field.kind} for field in FIELDS]


def tf_feature_spec() -> dict:
    """The feature spec for ``tf.io.parse_example`` / ``parse_single_example``."""
    import tensorflow as tf

    dtypes = {"bytes": tf.string, "int64": tf.int64}
    return {field.name: tf.io.FixedLenFeature([], dtypes[field.kind]) for field in FIELDS}
