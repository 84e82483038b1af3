"""Another version of tfshards beside this checkout: its package extracted from a git
revision, run in child processes by ``PYTHONPATH``, so a benchmark times both side by side
and a regression shows before it lands."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # this checkout's root: the tree measured


def tree_of(revision: str, root: Path) -> tuple[Path, str]:
    """The ``tfshards`` package of ``revision`` extracted under ``root/trees/<commit>``
    (once; kept for reruns), and the commit's short hash. ``git archive``, not a worktree:
    the repository's list of worktrees is left alone."""
    commit = _git("rev-parse", "--verify", f"{revision}^{{commit}}").strip()
    tree = root / "trees" / commit[:12]
    if not (tree / "tfshards" / "__init__.py").exists():
        archive = subprocess.run(
            ["git", "-C", str(HERE), "archive", "--format=tar", commit, "tfshards"],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
        tree.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
    return tree, commit[:9]


def env_of(tree: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``tree``'s tfshards first on the import path."""
    return {**os.environ, "PYTHONPATH": str(tree), **extra}


def run_in(tree: Path, code: str) -> str:
    """Run Python ``code`` in a fresh process importing ``tree``'s tfshards; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env_of(tree),
        check=False, cwd=tree,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"in {tree}: {done.stderr[-3000:]}")
    return done.stdout


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(HERE), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout
