"""Folders, locks and process checks shared by the readers, without TensorFlow.

After a fork, the child is a copy of one thread of the parent: a ``threading.Lock``
that another thread held at that moment stays held in the child for ever, and a lock
file's descriptor copied into the child keeps its ``flock`` (the lock belongs to the
open file, which the child now shares) after the parent lets go of it. So the readers'
objects that hold either ask :func:`reset_in_forked_children` to be reset in each
child, and every lock file goes through :func:`open_lock_file` and
:func:`close_lock_file`, whose descriptors each child closes first thing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


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
    fd = open_lock_file(lock)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        close_lock_file(fd)


class ForkReset(Protocol):
    def after_fork(self) -> None:
        """Run in a forked child before anything else: replace locks, forget descriptors."""


_owners: weakref.WeakSet[ForkReset] = weakref.WeakSet()
_lock_files: set[int] = set()  # descriptors of lock files this process opened
_fork_guard = threading.Lock()  # a lock file's open and its note are one step for fork


def reset_in_forked_children(owner: ForkReset) -> None:
    """Call ``owner.after_fork()`` in every child this process forks (while ``owner`` lives)."""
    _owners.add(owner)


def open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created if missing), closed in forked children."""
    with _fork_guard:
        fd = os.open(path, os.O_RDWR | os.O_CREAT)
        _lock_files.add(fd)
    return fd


def close_lock_file(fd: int) -> None:
    with _fork_guard:  # closed and forgotten at once: a child never closes a reused number
        _lock_files.discard(fd)
        os.close(fd)


def _after_fork_in_child() -> None:
    global _fork_guard
    _fork_guard = threading.Lock()
    for fd in _lock_files:
        with contextlib.suppress(OSError):
            os.close(fd)  # the child's copy: the parent's flock stays, and goes when it lets go
    _lock_files.clear()
    for owner in list(_owners):
        owner.after_fork()


os.register_at_fork(
    before=lambda: _fork_guard.acquire(),
    after_in_parent=lambda: _fork_guard.release(),
    after_in_child=_after_fork_in_child,
)
