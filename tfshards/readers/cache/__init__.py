"""The persistent disk cache of decoded, resized uint8 pairs.

``entries.py``: the entries as files (names, ``info.json``, where they live), listed
and cleared without TensorFlow; ``entry.py``: an entry's building, size check and
lockless publishing; ``store.py``: the ordered reader's entries of records of one size
(flat files read by index), ``native.py``: of records of many sizes (the same, with an
index); ``layouts.py``: the part files of older entries and of ``tfshards bench``'s
cache baseline. The names that need TensorFlow are imported on first use, so that
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
    "list_caches",
    "user_cache_dir",
]


def __getattr__(name: str):
    if name in ("CacheSpaceError", "DiskCache"):
        from tfshards.readers.cache import entry

        return getattr(entry, name)
    raise AttributeError(f"module 'tfshards.readers.cache' has no attribute {name!r}")
