"""Python called from tf.data threads, and a clean interpreter exit.

The ordered reader runs Python (``tf.py_function``) on tf.data's threads. If a script
ends while a dataset is still being iterated, the interpreter finalizes, frees the
iterator, and TensorFlow waits for calls in flight, which can no longer take the GIL:
the process hangs (seen in about 1 exit in 3 with an iterator left mid-epoch). So every
such call goes through :func:`guarded`, and at exit (``atexit``, while threads can still
run Python) new calls fail at once and the exit waits until none has started for a
moment: the pipelines' buffers are then full and nothing calls Python any more.
"""

from __future__ import annotations

import atexit
import functools
import threading
import time
from collections.abc import Callable

QUIET_SECONDS = 0.3  # no call started for this long: the pipelines are at rest
MOST_SECONDS = 10.0  # never delay an exit longer than this

_lock = threading.Lock()
_state = {"closing": False, "in_flight": 0, "last_start": 0.0}


class InterpreterExiting(RuntimeError):
    """The interpreter is exiting: tfshards' readers stop producing batches."""


def guarded(function: Callable) -> Callable:
    """``function`` for tf.py_function: counted while it runs, refused once exiting."""

    @functools.wraps(function)
    def call(*args):
        with _lock:
            if _state["closing"]:
                raise InterpreterExiting("the interpreter is exiting")
            _state["in_flight"] += 1
            _state["last_start"] = time.monotonic()
        try:
            return function(*args)
        finally:
            with _lock:
                _state["in_flight"] -= 1

    return call


def _settle() -> None:
    with _lock:
        _state["closing"] = True
    end = time.monotonic() + MOST_SECONDS
    while time.monotonic() < end:
        with _lock:
            busy = _state["in_flight"] > 0
            recent = time.monotonic() - _state["last_start"] < QUIET_SECONDS
        if not busy and not recent:
            return
        time.sleep(0.02)


atexit.register(_settle)
