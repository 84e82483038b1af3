"""Exceptions raised by tfshards; each message names the file and the cause."""

from __future__ import annotations


class TfshardsError(Exception):
    """Base class of every error tfshards raises on purpose."""


class OptionsError(TfshardsError, ValueError):
    """An option has a value tfshards cannot use."""


class PairingError(TfshardsError):
    """Images and masks do not pair up (orphans, duplicates, empty input)."""


class PairError(TfshardsError):
    """One image/mask pair cannot be decoded, validated or encoded."""

    def __init__(self, key: str, path: str, field: str, reason: str) -> None:
        self.key = key
        self.path = path
        self.field = field
        self.reason = reason
        super().__init__(f"pair {key!r}: {field} file {path}: {reason}")

    def __reduce__(self):  # keeps the fields when raised in a worker process
        return (PairError, (self.key, self.path, self.field, self.reason))


class OutputError(TfshardsError):
    """The output folder cannot be used as asked (not empty, locked, changed inputs)."""


class ManifestError(TfshardsError):
    """A manifest is missing, foreign, of an unknown version, or disagrees with the shards."""


class StorageError(TfshardsError, OSError):
    """A file or object cannot be read or written (names the location and the cause, never
    the credentials)."""


class DatasetChangedError(TfshardsError):
    """A shard changed on disk while a reader was reading it (e.g. ``convert --overwrite``)."""


class RecordTableError(TfshardsError):
    """A split's per-record table (``<split>.records``) that cannot be read, or that
    disagrees with its manifest or its shards."""


class StitchError(TfshardsError):
    """Tile predictions that cannot be stitched (a window outside the image, a shape or
    class that does not fit, pixels no tile covered)."""
