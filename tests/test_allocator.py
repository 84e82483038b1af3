"""`import tfshards` asks for TensorFlow's BFC CPU allocator only when it still can and
the user did not choose: each case runs in a fresh Python process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tfshards.allocator import ALLOCATOR_VARIABLE

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != ALLOCATOR_VARIABLE}
    clean.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", **env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean, check=False
    )


def allocator_seen(code: str, **env: str) -> tuple[dict, str]:
    """What a fresh process that runs code saw: the variable, whether TensorFlow was
    imported; and its stderr (debug logging on)."""
    done = run_python(
        "import logging; logging.basicConfig(level=logging.DEBUG)\n" + code + "\n"
        "import os, sys, json\n"
        f"print(json.dumps({{'value': os.environ.get({ALLOCATOR_VARIABLE!r}), "
        "'tensorflow': 'tensorflow' in sys.modules}))",
        **env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_importing_tfshards_before_tensorflow_sets_the_bfc_allocator():
    seen, log = allocator_seen("import tfshards")
    assert seen == {"value": "true", "tensorflow": False}  # set before TensorFlow started
    assert f"{ALLOCATOR_VARIABLE}=true" in log and "set it to false" in log  # how to opt out


def test_importing_tfshards_after_tensorflow_leaves_the_variable_unset():
    seen, log = allocator_seen("import tensorflow\nimport tfshards")
    assert seen == {"value": None, "tensorflow": True}
    assert "TensorFlow was imported before tfshards" in log


def test_a_value_the_user_set_is_kept():
    for value in ("false", "true"):
        seen, log = allocator_seen("import tfshards", **{ALLOCATOR_VARIABLE: value})
        assert seen["value"] == value and "kept" in log


def test_the_cli_runs_tensorflow_with_the_bfc_allocator(tmp_path):
    command = [sys.executable, "-m", "tfshards.cli", "-v", "cache", "list", str(tmp_path)]
    for env, expected in (({}, "true"), ({ALLOCATOR_VARIABLE: "false"}, "false")):
        clean = {k: v for k, v in os.environ.items() if k != ALLOCATOR_VARIABLE}
        clean.update(PYTHONPATH=str(ROOT), **env)
        done = subprocess.run(command, capture_output=True, text=True, env=clean, check=False)
        assert done.returncode == 0, done.stderr
        assert f"TensorFlow's CPU allocator: {ALLOCATOR_VARIABLE}={expected}" in done.stderr
