"""The shards a reader may open: listed by the manifest, never by a glob."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tfshards import storage
from tfshards.errors import ManifestError
from tfshards.schemas.format import COMPRESSIONS
from tfshards.schemas.manifest import Manifest, ShardInfo


@dataclass(frozen=True)
class SplitShards:
    """The files of one split (already cut for this input pipeline) and their records."""

    manifest: Manifest
    split: str
    paths: tuple[str, ...]
    shards: tuple[ShardInfo, ...]
    root: Path | str  # the dataset folder, or its URL

    @property
    def remote(self) -> bool:
        """The shards are at a URL: read through the local shard cache."""
        return isinstance(self.root, str)

    @property
    def records(self) -> int:
        return sum(shard.records for shard in self.shards)

    @property
    def compression_type(self) -> str:
        return COMPRESSIONS[self.manifest.compression.type].tf_name


def label_problem(manifest: Manifest) -> str | None:
    """Why the masks would hand a loss labels outside 0..K-1; None when they would not."""
    values = sorted({v for split in manifest.splits.values() for v in split.mask_values})
    declared = manifest.mask.num_classes
    if declared is not None and values and values[-1] >= declared:
        return (
            f"the manifest declares {declared} classes but the masks hold the value "
            f"{values[-1]}; the manifest was edited or damaged: convert again"
        )
    if declared is None and 255 in values and set(values) <= {0, 255}:
        return (
            "the masks hold the values 0 and 255 (binary masks saved as black and white), "
            "which a loss would read as class 255; convert again with --binary-masks "
            "(0 -> class 0, 255 -> class 1)"
        )
    return None


def split_shards(
    root: str | os.PathLike,
    split: str,
    *,
    pipeline: tuple[int, int] = (0, 1),
    manifest: Manifest | None = None,
    storage_options: storage.StorageOptions = None,
) -> SplitShards:
    """Shards of ``split`` for input pipeline ``(index, count)``, with sizes checked.

    Local sizes are compared with the manifest at open (cheap); hashes are checked
    by ``tfshards verify``. Remote shards are checked (size and CRC-32C or sha256) as they are
    downloaded into the shard cache.
    """
    root = str(root).rstrip("/") if storage.is_url(root) else Path(root).resolve()
    manifest = manifest or Manifest.load(root, storage_options)
    if split not in manifest.splits:
        raise ManifestError(
            f"{root}: no split {split!r}; this dataset has {', '.join(manifest.splits)} "
            "(convert with --val-fraction or --test-fraction to make val or test splits)"
        )
    problem = label_problem(manifest)
    if problem:
        raise ManifestError(f"{root}: {problem}")
    shards = manifest.splits[split].shards
    index, count = pipeline
    if len(shards) < count:
        raise ManifestError(
            f"split {split!r} has {len(shards)} shards, fewer than the {count} input pipelines "
            "reading it; convert with --num-shards of at least the number of pipelines"
        )
    mine = tuple(shards[index::count])
    if isinstance(root, str):
        paths = [storage.join(root, shard.file) for shard in mine]
        return SplitShards(manifest, split, tuple(paths), mine, root)
    paths = []
    for shard in mine:
        path = root / shard.file
        if path.resolve().parent != root:
            raise ManifestError(f"shard {shard.file!r} points outside {root}; refused")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise ManifestError(f"{path}: shard listed in the manifest is missing") from None
        if size != shard.bytes:
            raise ManifestError(
                f"{path}: {size} bytes on disk but the manifest says {shard.bytes}; the shard "
                "is truncated or was replaced (run `tfshards verify` for details)"
            )
        paths.append(str(path))
    return SplitShards(manifest, split, tuple(paths), mine, root)
