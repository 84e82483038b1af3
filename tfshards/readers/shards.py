"""The shards a reader may open: listed by the manifest, never by a glob."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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

    @property
    def records(self) -> int:
        return sum(shard.records for shard in self.shards)

    @property
    def compression_type(self) -> str:
        return COMPRESSIONS[self.manifest.compression.type].tf_name


def split_shards(
    root: str | os.PathLike,
    split: str,
    *,
    pipeline: tuple[int, int] = (0, 1),
    manifest: Manifest | None = None,
) -> SplitShards:
    """Shards of ``split`` for input pipeline ``(index, count)``, with sizes checked.

    Sizes are compared with the manifest at open (cheap); hashes are checked
    by ``tfshards verify``.
    """
    root = Path(root).resolve()
    manifest = manifest or Manifest.load(root)
    if split not in manifest.splits:
        raise ManifestError(
            f"{root}: no split {split!r}; this dataset has {', '.join(manifest.splits)}"
        )
    shards = manifest.splits[split].shards
    index, count = pipeline
    if len(shards) < count:
        raise ManifestError(
            f"split {split!r} has {len(shards)} shards, fewer than the {count} input pipelines "
            "reading it; convert with --num-shards of at least the number of pipelines"
        )
    mine = tuple(shards[index::count])
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
    return SplitShards(manifest, split, tuple(paths), mine)
