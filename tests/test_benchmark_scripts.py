"""benchmarks/ and benchmarks/studies/: every script still imports and parses its options
(the studies import benchmarks/_common.py and sibling benchmarks through _benchmarks_path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

# One process for all: each script runs as __main__ with --help, from its own folder.
CHECK = """
import runpy, sys
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    sys.path.insert(0, script.rsplit("/", 1)[0])
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        assert exc.code == 0, (script, exc.code)
    else:
        raise AssertionError(f"{script}: --help did not exit")
    # Forget the helpers this script imported and the paths it added, so the next script
    # must find them itself.
    for name, module in list(sys.modules.items()):
        if "/benchmarks/" in (getattr(module, "__file__", None) or ""):
            del sys.modules[name]
    sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith(("benchmarks", "studies"))]
    print("ok", script, flush=True)
"""


def test_every_benchmark_and_study_parses_its_options():
    scripts = sorted(
        str(p)
        for p in [*BENCHMARKS.glob("*.py"), *(BENCHMARKS / "studies").glob("*.py")]
        if not p.name.startswith("_")
    )
    assert len(scripts) == 23  # serial_share.py, direct_reads.py (44), large_images.py (46)
    done = subprocess.run(
        [sys.executable, "-c", CHECK, *scripts],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("ok ") == len(scripts)


def test_studies_say_the_decision_date_and_result():
    for script in (BENCHMARKS / "studies").glob("[!_]*.py"):
        doc = script.read_text().split('"""')[1]
        for word in ("Decision:", "Run: 2026-", "Recorded result:", "Raw output:"):
            assert word in doc, f"{script.name}: {word}"


def test_benchmarks_say_what_they_compare_and_how_long_they_take():
    for script in BENCHMARKS.glob("[!_]*.py"):
        doc = script.read_text().split('"""')[1]
        assert "Compares:" in doc and "Takes:" in doc, script.name
