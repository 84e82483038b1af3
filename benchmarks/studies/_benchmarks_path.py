"""Puts ``benchmarks/`` on ``sys.path`` so a study can import the shared helpers
(``_common``) and the benchmark it varies (``read_throughput``, ``larger_than_ram``)."""

import sys
from pathlib import Path

BENCHMARKS = str(Path(__file__).resolve().parents[1])
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
