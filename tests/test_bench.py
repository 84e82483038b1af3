"""A tiny `tfshards bench` sweep produces every output with the right columns."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import pytest
from conftest import write_pairs

from tfshards.benchmarking.report import COLUMNS, markdown, plot_series
from tfshards.benchmarking.sweep import SweepConfig, SweepResult
from tfshards.cli import bench, build_parser, main
from tfshards.cli.bench import _config, quick_size


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
        "3",
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
    assert "cold = streamed" in text and "warm = read from" in text
    out = capsys.readouterr().out
    assert "wrote" in out and "Found" not in out, "Keras' 'Found N files.' lines are kept out"


def test_without_matplotlib_the_report_says_how_to_get_the_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    images, masks = write_pairs(tmp_path / "data", 12, size=(8, 8))
    args = bench_args(tmp_path, images, masks)
    args[args.index("1,2")] = "1"
    args[args.index("--repeats") + 1] = "1"
    assert main(args) == 0
    assert not (tmp_path / "report" / "throughput.png").exists()
    assert 'pip install "tfshards[bench]"' in capsys.readouterr().out
    assert (tmp_path / "report" / "results.csv").exists()


def result_with(rows, *, repeats=3, note=""):
    config = SweepConfig(Path("i"), Path("m"), Path("w"), repeats=repeats, note=note)
    return SweepResult(
        config,
        {},
        "page cache warm",
        4 * 2**20,
        300,
        pair_pixels=64 * 64 * 4,
        baselines={"keras_first_epoch": 100.0, "keras_disk_cached": 900.0},
        rows=rows,
        complete=True,
    )


ROW = dict(
    shards=4,
    encoding="deflate",
    compression="none",
    cycle_length=4,
    bytes=3 * 2**20,
    disk_ratio=0.8,
    cold_pairs_per_s=3000.0,
    warm_pairs_per_s=1300.0,
    cold_vs_keras=30.0,
)


def test_report_and_plot_show_warm_and_cold_and_say_why_warm_is_slower():
    result = result_with([ROW, dict(ROW, shards=16, warm_pairs_per_s=3500.0)])
    text = markdown(result)
    assert "Warm epochs were slower than cold ones in 1 of 2 rows" in text
    assert "not timed" in text and "small data" in text
    assert plot_series(result) == {
        "deflate/none cold": ([4, 16], [3000.0, 3000.0]),
        "deflate/none warm": ([4, 16], [1300.0, 3500.0]),
    }


def test_a_recommendation_needs_three_passes():
    assert result_with([ROW]).recommendation() is not None
    single = result_with([ROW], repeats=1)
    assert single.recommendation() is None
    assert "at least 3 passes per point, and this run made 1" in markdown(single)


def test_quick_mode_states_its_size_and_makes_three_passes(tmp_path):
    args = build_parser().parse_args(["bench", "--synthetic", "1000", "--quick"])
    assert quick_size(args) == (300, 64)
    config = _config(args, tmp_path / "i", tmp_path / "m", tmp_path)
    assert config.repeats >= 3
    assert "300 synthetic pairs of 64x64 (asked for 1000 of 256x256)" in config.note
    assert config.note in markdown(result_with([ROW], note=config.note))


def test_log_lines_during_the_bench_progress_bar_start_on_their_own_line(tmp_path, capsys):
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(handler)
    images, masks = write_pairs(tmp_path / "data", 4, size=(8, 8))
    config = SweepConfig(
        images,
        masks,
        tmp_path / "w",
        shards=(1,),
        encodings=("raw",),
        compressions=("none",),
        cycle_lengths=(1,),
        repeats=1,
    )

    def sweep(config, on_step, result):
        on_step("one")
        logging.getLogger("tfshards").warning("a log line")
        on_step("two")
        raise KeyboardInterrupt

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(bench, "run_sweep", sweep)
            assert bench._sweep_and_report(config, tmp_path / "r", quiet=False) == 130
    finally:
        logging.getLogger().removeHandler(handler)
    err = capsys.readouterr().err
    before = err[: err.index("a log line")]
    assert before.endswith(("\r", "\n")) or before.rstrip(" ").endswith(("\r", "\n")), before


def test_compare_baseline_prints_both_pipelines_both_epochs_and_the_ratios(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 40, size=(16, 16))
    args = ["-q", "bench", "--images", str(images), "--masks", str(masks), "--compare-baseline"]
    args += ["--work", str(tmp_path / "work"), "--report", str(tmp_path / "report")]
    assert main([*args, "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row] for row in rows]
    measured = {(row[0], row[1]): row for row in cells if row[1] in ("first", "warm")}
    assert set(measured) == {
        (pipeline, epoch)
        for pipeline in (
            "tfshards.read(cache=True)",
            "keras image_dataset_from_directory + .cache(file)",
        )
        for epoch in ("first", "warm")
    }
    assert all(float(row[2]) > 0 and float(row[4]) > 0 for row in measured.values()), measured
    ratios = {row[0]: [float(x) for x in row[1:]] for row in cells if "ours / keras" in row[0]}
    assert set(ratios) == {
        f"{epoch} epoch {what}, ours / keras"
        for epoch in ("first", "warm")
        for what in ("pairs/s", "cpu ms per pair")
    }
    assert all(low <= middle <= high and low > 0 for middle, low, high in ratios.values())
    assert "40 pairs" in out and "2 rounds" in out and "Found" not in out
    assert (tmp_path / "report" / "compare.md").read_text().strip() in out
    assert not (tmp_path / "work" / "compare-shards").exists(), "its shards are removed"


def test_bench_help_names_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--compare-baseline" in text and "image_dataset_from_directory" in text
    for default in (
        "(default 256)",
        "(default ./bench)",
        "(default 1,4,16,64)",
        "(default deflate,keep,raw)",
        "(default none,gzip)",
        "(default 1,4,16)",
        "(default 3)",
        "(default 4.0)",
    ):
        assert default in text, default
