"""Small helpers for messages people read."""

from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """'1 shard', '2 shards', '0 entries' (with ``plural`` for irregular nouns)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"
