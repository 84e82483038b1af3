"""A tiny `tfshards bench` sweep produces every output with the right columns."""

from __future__ import annotations

import csv
import json
import sys

from conftest import write_pairs

from tfshards.benchmarking.report import COLUMNS
from tfshards.cli import main


def bench_args(tmp_path, images, masks):
    return [
        "-q",
        "bench",
        "--images",
        str(images),
        "--masks",
        str(masks),
        "--work",
        str(tmp_path / "work"),
        "--report",
        str(tmp_path / "report"),
        "--shards",
        "1,2",
        "--encodings",
        "raw",
        "--compression",
        "none",
        "--cycle-lengths",
        "1",
        "--repeats",
        "1",
    ]


def test_tiny_sweep_writes_every_output(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 36, size=(16, 16))
    assert main(bench_args(tmp_path, images, masks)) == 0
    report = tmp_path / "report"
    with open(report / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == COLUMNS
    assert [int(r["shards"]) for r in rows] == [1, 2]
    assert all(float(r["cold_pairs_per_s"]) > 0 and float(r["warm_pairs_per_s"]) > 0 for r in rows)
    body = json.loads((report / "results.json").read_text())
    assert body["complete"] and body["pairs"] == 36
    assert set(body["baselines_pairs_per_s"]) == {
        "keras_first_epoch",
        "keras_disk_cached",
        "list_files_map",
    }
    assert {"cores", "ram_gib", "disk_free_gib", "tensorflow"} <= set(body["machine"])
    assert "page cache" in body["page_cache"] or "dropped" in body["page_cache"]
    assert body["recommendation"]["convert"].startswith("tfshards convert")
    text = (report / "report.md").read_text()
    assert "## Recommendation" in text and "--encoding raw" in text
    assert (report / "throughput.png").stat().st_size > 0
    assert "wrote" in capsys.readouterr().out


def test_without_matplotlib_the_report_says_how_to_get_the_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    images, masks = write_pairs(tmp_path / "data", 12, size=(8, 8))
    args = bench_args(tmp_path, images, masks)
    args[args.index("1,2")] = "1"
    assert main(args) == 0
    assert not (tmp_path / "report" / "throughput.png").exists()
    assert 'pip install "tfshards[bench]"' in capsys.readouterr().out
    assert (tmp_path / "report" / "results.csv").exists()
