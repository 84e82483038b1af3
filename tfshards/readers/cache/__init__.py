"""The persistent disk cache of decoded, resized uint8 pairs.

``entry.py``: an entry's folder, names, ``info.json``, size check and lockless
publishing; ``layouts.py``: the fixed-size and variable-size part files;
``stage.py``: the tf.data stage that builds an entry during the first pass and
reads it afterwards.
"""

from tfshards.readers.cache.entry import (
    CacheEntry,
    CacheFolderError,
    CacheInfo,
    CacheSpaceError,
    DiskCache,
    clear_caches,
    default_cache_root,
    list_caches,
    user_cache_dir,
)
from tfshards.readers.cache.stage import disk_cached

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
