"""TensorFlow's CPU allocator: ask for its BFC allocator before TensorFlow starts.

TensorFlow's default CPU allocator hands large buffers (a batch of 512x512 float32
images is 100 MB) back to the operating system when they are freed and maps fresh ones
for the next batch, so the kernel zeroes new pages for every batch: measured in
``benchmarks/larger_than_ram.py``, that system time is most of the CPU a float32 stream
spends. TensorFlow's own BFC allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``) keeps and
reuses those buffers. TensorFlow reads the variable once, when it starts, so it only
counts when set before the first ``import tensorflow`` (or ``import keras``).

``import tfshards`` sets it when TensorFlow is not imported yet and the variable is
unset; a value the user set (``TF_CPU_ALLOCATOR_USE_BFC=false`` opts out) is kept.
"""

from __future__ import annotations

import logging
import os
import sys

ALLOCATOR_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"

_log = logging.getLogger("tfshards")


def prefer_bfc_allocator() -> bool:
    """Set ``TF_CPU_ALLOCATOR_USE_BFC=true`` if TensorFlow has not started and the variable
    is unset; return True if it was set here. Logged at debug level either way."""
    if ALLOCATOR_VARIABLE in os.environ:
        _log.debug(
            "%s=%s kept (set before tfshards was imported)",
            ALLOCATOR_VARIABLE,
            os.environ[ALLOCATOR_VARIABLE],
        )
        return False
    if "tensorflow" in sys.modules:
        _log.debug(
            "TensorFlow was imported before tfshards: its CPU allocator is left as it is "
            "(set %s=true before importing TensorFlow to use the BFC allocator)",
            ALLOCATOR_VARIABLE,
        )
        return False
    os.environ[ALLOCATOR_VARIABLE] = "true"
    _log.debug(
        "%s=true: TensorFlow will reuse its CPU buffers (set it to false before "
        "importing tfshards to keep TensorFlow's default allocator)",
        ALLOCATOR_VARIABLE,
    )
    return True
