"""The memory a reader may use: cgroup limits, and tf.data's autotune RAM budget from them."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import write_pairs

import tfshards
from tfshards.readers import memory_limits

GIB = 2**30


def test_the_budget_is_a_quarter_of_a_cgroup_limit_below_the_machines_memory(monkeypatch):
    monkeypatch.setattr(memory_limits, "machine_memory", lambda: 24 * GIB)
    monkeypatch.setattr(memory_limits, "cgroup_memory_limit", lambda: 3 * GIB // 2)
    assert memory_limits.autotune_ram_budget() == 3 * GIB // 8
    assert memory_limits.usable_memory() == 3 * GIB // 2
    monkeypatch.setattr(memory_limits, "cgroup_memory_limit", lambda: 32 * GIB)
    assert memory_limits.autotune_ram_budget() is None, "a limit above the machine: no budget"
    monkeypatch.setattr(memory_limits, "cgroup_memory_limit", lambda: None)
    assert memory_limits.autotune_ram_budget() is None, "no cgroup: tf.data's own default"
    assert memory_limits.usable_memory() == 24 * GIB


def test_read_gives_tf_data_the_budget_under_a_limit_and_leaves_the_default_otherwise(
    tmp_path, monkeypatch
):
    images, masks = write_pairs(tmp_path / "data", 6)
    out = tmp_path / "shards"
    tfshards.convert(images, masks, out, workers=1, progress=False)
    monkeypatch.setattr(memory_limits, "machine_memory", lambda: 24 * GIB)
    monkeypatch.setattr(memory_limits, "cgroup_memory_limit", lambda: 2 * GIB)
    limited = tfshards.read(out, batch_size=2, cache=tmp_path / "cache")
    assert limited.options().autotune.ram_budget == GIB // 2
    callback = tfshards.ResumeCallback(tmp_path / "backup", limited)  # raised before
    assert callback.reader is limited._tfshards_reader
    assert sum(1 for _ in limited) == 3, "the budgeted pipeline still reads every batch"
    monkeypatch.setattr(memory_limits, "cgroup_memory_limit", lambda: None)
    assert tfshards.read(out, batch_size=2).options().autotune.ram_budget is None


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """(this process's memory cgroup folder, its limit file's name), v2 or v1."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, group = line.split(":", 2)
        if controllers == "":
            folder = Path("/sys/fs/cgroup") / group.lstrip("/")
            if "memory" in _text(folder / "cgroup.subtree_control"):
                return folder, "memory.max"
        elif "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / group.lstrip("/")
            if (folder / "memory.limit_in_bytes").exists():
                return folder, "memory.limit_in_bytes"
    return None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_a_real_memory_cgroups_limit_is_read_in_the_process_it_holds():
    own = _own_memory_cgroup() if os.geteuid() == 0 else None
    if own is None:
        pytest.skip("needs root and a writable memory cgroup (v1 or v2)")
    parent, limit_file = own
    group = parent / f"tfshards-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup here: {exc}")
    try:
        (group / limit_file).write_text(str(768 * 2**20))
        code = (
            "from tfshards.readers.memory_limits import autotune_ram_budget, "
            "cgroup_memory_limit; print(cgroup_memory_limit(), autotune_ram_budget())"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(768 * 2**20), str(192 * 2**20)]
    finally:
        group.rmdir()
