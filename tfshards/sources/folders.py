"""Folders, locks and process checks shared by the readers, without TensorFlow."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tfshards``, else ``~/.cache/tfshards``."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tfshards"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def held_exclusively(lock: Path) -> Iterator[None]:
    """An ``flock`` on ``lock`` (created if missing) held exclusively, waited for, while
    the block runs; the kernel drops it if the process dies."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
