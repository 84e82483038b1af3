"""Helpers shared by the benchmark scripts: timing rows, peak RSS of a child process,
synthetic pixels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from tfshards.converters.synth import synth


def drop_pages(path: Path) -> None:
    """Write out and drop one file's page cache (ours only; nothing system-wide, no root)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def peak_rss_of(code: str) -> dict:
    """Run Python code in a fresh process; it prints a JSON dict; add its peak RSS in MiB."""
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child forked from a
    # large parent would report the parent's peak.
    wrapper = (
        "import json, resource\n"
        + code
        + "\nself_rss = next(int(l.split()[1]) for l in open('/proc/self/status') "
        "if l.startswith('VmHWM:')) / 1024\n"
        "child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "RESULT.update(peak_rss_mib=round(self_rss, 1), peak_child_rss_mib=round(child_rss, 1))\n"
        "print('RESULT ' + json.dumps(RESULT))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def markdown_table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def synthetic_pixels(count: int, size: int | tuple[int, int]) -> list[np.ndarray]:
    """The image and mask pixels of ``count`` ``tfshards synth`` pairs, image then mask."""
    with tempfile.TemporaryDirectory(prefix="tfshards-pixels-") as tmp:
        images, masks = synth(Path(tmp), count=count, size=size)
        pairs = zip(sorted(images.iterdir()), sorted(masks.iterdir()), strict=True)
        return [np.ascontiguousarray(Image.open(f)) for pair in pairs for f in pair]
