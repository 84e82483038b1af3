"""The reader side: the tf.data pipeline, the disk cache, distribution."""

from tfshards.readers.cache import clear_caches, list_caches
from tfshards.readers.pipeline import ReadOptions, read

__all__ = ["ReadOptions", "clear_caches", "list_caches", "read"]
