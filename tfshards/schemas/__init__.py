"""The record schema, the on-disk format and the manifest shared by writer and reader."""

from tfshards.schemas.format import COMPRESSIONS, ENCODINGS, MANIFEST_NAME, MASK_ENCODINGS
from tfshards.schemas.manifest import Manifest, ShardInfo, SkippedPair, SplitInfo
from tfshards.schemas.record import FIELDS, SCHEMA_VERSION, EncodedPair

__all__ = [
    "COMPRESSIONS",
    "ENCODINGS",
    "FIELDS",
    "MANIFEST_NAME",
    "MASK_ENCODINGS",
    "SCHEMA_VERSION",
    "EncodedPair",
    "Manifest",
    "ShardInfo",
    "SkippedPair",
    "SplitInfo",
]
