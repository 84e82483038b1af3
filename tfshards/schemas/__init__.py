"""The record schema, pixel encodings and manifest shared by writer and reader."""

from tfshards.schemas.encodings import IMAGE_ENCODINGS, MASK_ENCODINGS
from tfshards.schemas.manifest import MANIFEST_NAME, Manifest, ShardInfo, SkippedPair, SplitInfo
from tfshards.schemas.record import FIELDS, SCHEMA_VERSION, EncodedPair

__all__ = [
    "FIELDS",
    "IMAGE_ENCODINGS",
    "MANIFEST_NAME",
    "MASK_ENCODINGS",
    "SCHEMA_VERSION",
    "EncodedPair",
    "Manifest",
    "ShardInfo",
    "SkippedPair",
    "SplitInfo",
]
