"""Folders and process checks shared by the readers, without TensorFlow."""

from __future__ import annotations

import os
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
