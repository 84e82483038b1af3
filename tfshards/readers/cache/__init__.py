"""The persistent disk cache of decoded, resized uint8 pairs.

``entries.py``: the entries as files (names, ``info.json``, where they live), listed
and cleared without TensorFlow; ``entry.py``: an entry's building, size check and
lockless publishing; ``layouts.py``: the fixed-size and variable-size part files;
``stage.py``: the tf.data stage that builds an entry during the first pass and reads
it afterwards. The names that need TensorFlow are imported on first use, so that
``tfshards cache list`` starts without it.
"""

from tfshards.readers.cache.entries import (
    CacheEntry,
    CacheFolderError,
    CacheInfo,
    clear_caches,
    default_cache_root,
    list_caches,
    user_cache_dir,
)

__all__ = [
    "CacheEntry",
    "CacheFolderError",
    "CacheInfo",
    "CacheSpaceError",
    "DiskCache",
    "clear_caches",
    "default_cache_root",
    "disk_cached",
    "list_caches",
    "user_cache_dir",
]


def __getattr__(name: str):
    if name in ("CacheSpaceError", "DiskCache"):
        from tfshards.readers.cache import entry

        return getattr(entry, name)
    if name == "disk_cached":
        from tfshards.readers.cache.stage import disk_cached

        return disk_cached
    raise AttributeError(f"module 'tfshards.readers.cache' has no attribute {name!r}")
