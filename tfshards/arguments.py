"""Checks of public arguments at the call: each refusal is an OptionsError naming the argument.

A wrong type taken silently does harm later (``shuffle="no"`` is true, so it shuffles;
``seed=-1`` fails inside TensorFlow's iterator), so every public entry point checks its
arguments here first. Bools are bools (NumPy's too), integers are integers (NumPy's too,
never a bool or a float), paths are non-empty strings or ``os.PathLike``.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from tfshards.errors import OptionsError


def is_int(value: object) -> bool:
    """An integer (Python or NumPy), not a bool: what counts, sizes and seeds must be."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def checked_int(
    name: str, value: Any, *, low: int | None = None, high: int | None = None, none: bool = False
) -> int | None:
    """``value`` as an int in ``[low, high)`` (bounds optional; None passes when ``none``)."""
    if value is None and none:
        return None
    if low is not None and high is not None:
        expected = f"an integer in [{low}, {_written(high)})"
    elif low is not None:
        expected = f"an integer of at least {low}"
    else:
        expected = "an integer"
    if not is_int(value):
        what = f"{expected}{' or None' if none else ''}"
        raise OptionsError(f"{name} must be {what}, got {value!r}")
    if (low is not None and value < low) or (high is not None and value >= high):
        raise OptionsError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def _written(bound: int) -> str:
    """2**63 rather than 9223372036854775808."""
    power = int(bound).bit_length() - 1
    return f"2**{power}" if bound > 2**16 and bound == 2**power else str(bound)


def checked_size(name: str, value: object) -> tuple[int, int]:
    """``(height, width)`` of positive integers, or an OptionsError naming ``name``."""
    try:
        height, width = value  # type: ignore[misc]
    except (TypeError, ValueError):
        raise OptionsError(
            f"{name} must be (height, width), two positive integers; got {value!r}"
        ) from None
    if not (is_int(height) and is_int(width) and min(height, width) >= 1):
        raise OptionsError(f"{name} must be (height, width), two positive integers; got {value!r}")
    return int(height), int(width)


def checked_bool(name: str, value: Any, *, none: bool = False) -> bool | None:
    """``value`` as a bool: True or False (NumPy's too), never a string or a number."""
    if value is None and none:
        return None
    if not isinstance(value, bool | np.bool_):
        what = "True, False or None" if none else "True or False"
        raise OptionsError(f"{name} must be {what}, got {value!r}")
    return bool(value)


def checked_path(name: str, value: Any) -> str | os.PathLike:
    """A folder or URL: a non-empty string or an ``os.PathLike`` (an empty string would be
    the current folder, read or written without anyone asking for it)."""
    if not isinstance(value, str | os.PathLike):
        raise OptionsError(
            f"{name} must be a folder path or URL (str or os.PathLike); got {value!r} "
            f"({type(value).__name__})"
        )
    if isinstance(value, str) and not value.strip():
        raise OptionsError(f"{name} is an empty string; give a folder path or URL ('.' for here)")
    return value


def checked_str(name: str, value: Any) -> str:
    """A non-empty string (a split name, a format name)."""
    if not isinstance(value, str) or not value:
        raise OptionsError(f"{name} must be a non-empty string; got {value!r}")
    return value


def checked_callable(name: str, value: Any, *, none: bool = True) -> Callable | None:
    """A function (or other callable), or None when ``none``."""
    if value is None and none:
        return None
    if not callable(value):
        raise OptionsError(
            f"{name} must be a function{' or None' if none else ''}; got {value!r} "
            f"({type(value).__name__})"
        )
    return value
