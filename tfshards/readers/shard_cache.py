"""The shard cache moved to ``tfshards/sources/shard_cache.py`` (it needs no TensorFlow);
these names stay importable from here."""

from tfshards.sources.shard_cache import ShardCache, ShardCheckError, shard_cache_key

__all__ = ["ShardCache", "ShardCheckError", "shard_cache_key"]
