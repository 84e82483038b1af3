"""The reader side: the read plan and its stages, the disk cache, distribution."""

from tfshards.readers.cache import clear_caches, list_caches
from tfshards.readers.options import ReadOptions
from tfshards.readers.pipeline import read

__all__ = ["ReadOptions", "clear_caches", "list_caches", "read"]
