"""Small helpers for messages people read."""

from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """'1 shard', '2 shards', '0 entries' (with ``plural`` for irregular nouns)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def option(name: str, *, cli: bool, value: str | None = "True") -> str:
    """An option as its caller writes it: ``--overwrite`` on the command line,
    ``overwrite=True`` in Python; ``value=None`` for the name alone (``--out``, ``out``)."""
    if cli:
        return "--" + name.replace("_", "-")
    return name if value is None else f"{name}={value}"
