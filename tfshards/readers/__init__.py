"""The reader side: the read plan and its stages, the disk cache, distribution.

The names below need TensorFlow, so they are imported on first use: the modules here
that do not (``shards``) stay importable by TensorFlow-free readers (``tfshards.sources``).
"""

from __future__ import annotations

__all__ = ["ReadOptions", "ReadState", "ResumeCallback", "clear_caches", "list_caches", "read"]


def __getattr__(name: str):
    if name in ("clear_caches", "list_caches"):
        from tfshards.readers import cache

        return getattr(cache, name)
    if name == "ReadOptions":
        from tfshards.readers.options import ReadOptions

        return ReadOptions
    if name == "ReadState":
        from tfshards.readers.resume import ReadState

        return ReadState
    if name == "ResumeCallback":
        from tfshards.readers.resume_callback import ResumeCallback

        return ResumeCallback
    if name == "read":
        from tfshards.readers.pipeline import read

        return read
    raise AttributeError(f"module 'tfshards.readers' has no attribute {name!r}")
