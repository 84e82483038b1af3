"""The per-record table: computed from masks, written by every conversion, loaded or built
by ``tfshards.records()``, checked by ``verify``, summarized by ``tfshards records``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import MEMBRANE, run_json_script, write_pairs
from PIL import Image

import tfshards
from tfshards import storage
from tfshards.checks.shard_io import shard_examples
from tfshards.cli import main
from tfshards.errors import ManifestError, OptionsError, RecordTableError
from tfshards.schemas.manifest import Manifest
from tfshards.schemas.record import decode_record
from tfshards.schemas.record_table import GRID, RecordTable, record_row

SETTINGS = dict(val_fraction=0.25, num_shards=3, seed=3, progress=False, workers=1)


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch) -> Path:
    """A user cache folder of the test's own (built tables are kept there)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tfshards" / "record-tables"


def _converted(tmp_path: Path, count: int = 16, **settings) -> Path:
    images, masks = write_pairs(tmp_path / "data", count, classes=4)
    out = tmp_path / "out"
    tfshards.convert(images, masks, out, **{**SETTINGS, **settings})
    return out


def _records(out: Path, split: str) -> list[tuple[str, np.ndarray]]:
    """(key, mask) of every record of a split in manifest order, decoded in pure Python."""
    manifest = Manifest.load(out)
    found = []
    for shard in manifest.splits[split].shards:
        for features in shard_examples(out / shard.file, manifest.compression.type):
            found.append((os.fsdecode(features["key"]), decode_record(features).mask))
    return found


def _assert_rows_match(table: RecordTable, records: list, ignore: int | None) -> None:
    assert len(table) == len(records)
    for index, (key, mask) in enumerate(records):
        row, expected = table.row(index), record_row(key, mask, ignore)
        assert (row.key, row.height, row.width) == (key, *mask.shape)
        assert row.ignored_pixels == expected.ignored_pixels
        for name in ("class_ids", "class_counts", "class_cells"):
            assert np.array_equal(getattr(row, name), getattr(expected, name)), (index, name)


def _drop_table(out: Path, split: str = "train") -> None:
    """Make ``out`` look converted before tables: no file, no manifest entry."""
    (out / f"{split}.records").unlink()
    body = json.loads((out / "tfshards.json").read_text())
    del body["splits"][split]["record_table"]
    (out / "tfshards.json").write_text(json.dumps(body, indent=2))


def _rewrite(out: Path, split: str, data: bytes) -> None:
    """Replace a split's table, with a manifest entry that agrees with the new bytes."""
    (out / f"{split}.records").write_bytes(data)
    body = json.loads((out / "tfshards.json").read_text())
    entry = body["splits"][split]["record_table"]
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (out / "tfshards.json").write_text(json.dumps(body, indent=2))


# ---------------------------------------------------------------- rows from masks


def test_cells_and_counts_of_a_crafted_mask():
    mask = np.zeros((8, 12), np.uint8)
    mask[0:2, 0:3] = 1  # the top-left cell only (cells are 2 rows x 3 columns)
    mask[7, 11] = 2  # the bottom-right cell
    mask[3, 4:7] = 3  # row cell 1, column cells 1 and 2
    mask[5, 0] = 255  # ignored
    row = record_row("k", mask, 255)
    assert (row.height, row.width, row.ignored_pixels) == (8, 12, 1)
    assert row.class_ids.tolist() == [0, 1, 2, 3]
    assert row.class_counts.tolist() == [96 - 6 - 1 - 3 - 1, 6, 1, 3]
    assert row.class_cells.tolist()[1:] == [1 << 0, 1 << 15, (1 << 5) | (1 << 6)]
    assert row.class_cells[0] == (1 << 16) - 1 - (1 << 0)  # class 1 fills cell 0
    assert record_row("k", mask, None).class_ids.tolist() == [0, 1, 2, 3, 255]


@pytest.mark.parametrize("shape", [(1, 1), (3, 100), (5, 7), (33, 17)])
def test_cells_agree_with_a_pixel_by_pixel_count(shape):
    mask = np.random.default_rng(sum(shape)).integers(0, 5, shape, dtype=np.uint8)
    row = record_row("k", mask[..., None], 4)  # [H, W, 1] as the reader gives it
    height, width = shape
    for klass, count, cells in zip(row.class_ids, row.class_counts, row.class_cells, strict=True):
        ys, xs = np.nonzero(mask == klass)
        pixels = zip(ys, xs, strict=True)
        expected = {(y * GRID // height) * GRID + x * GRID // width for y, x in pixels}
        assert count == len(ys) and cells == sum(1 << cell for cell in expected)
    assert 4 not in row.class_ids and row.ignored_pixels == int((mask == 4).sum())


def test_concatenated_tables_are_the_bytes_of_one_table_of_all_rows():
    rng = np.random.default_rng(0)
    rows = [record_row(f"key{i}", rng.integers(0, 3 + i, (4, 9), np.uint8), None) for i in range(9)]
    parts = [RecordTable.from_rows(rows[a:b], 256) for a, b in ((0, 2), (2, 2), (2, 9))]
    whole = RecordTable.from_rows(rows, 12)
    assert RecordTable.concatenated(parts, 12).to_bytes() == whole.to_bytes()
    again = RecordTable.from_bytes(whole.to_bytes(), where="t")
    assert list(again.keys) == [f"key{i}" for i in range(9)]
    assert np.array_equal(np.asarray(again.class_pixels), np.asarray(whole.class_pixels))


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda d: d[:-3], "cut short"),
        (lambda d: d + b"\0", "bytes follow the last column"),
        (lambda d: b"x" + d[1:], "magic line"),
        (lambda d: d[:30], "not a readable"),
    ],
)
def test_damaged_bytes_are_refused_naming_the_file(damage, match):
    rows = [record_row(str(i), np.full((2, 2), i, np.uint8), None) for i in range(3)]
    data = RecordTable.from_rows(rows, 3).to_bytes()
    with pytest.raises(RecordTableError, match=rf"train\.records: .*{match}"):
        RecordTable.from_bytes(damage(data), where="train.records")


def test_ends_that_do_not_add_up_are_refused():
    rows = [record_row(str(i), np.full((2, 2), i, np.uint8), None) for i in range(3)]
    table = RecordTable.from_rows(rows, 3)
    ends = table.class_ends.copy()
    ends[1] = 0  # record 1 would end before it starts
    columns = {name: getattr(table, name) for name in ("key_ends", "key_bytes", "heights")}
    with pytest.raises(RecordTableError, match="class_ends does not run from 0 to 3"):
        RecordTable(
            **columns,
            widths=table.widths,
            ignored_pixels=table.ignored_pixels,
            class_ends=ends,
            class_ids=table.class_ids,
            class_counts=table.class_counts,
            class_cells=table.class_cells,
            num_classes=3,
        )


# ---------------------------------------------------------------- written by conversion


def test_conversion_writes_a_table_per_split_that_agrees_with_the_records(tmp_path):
    out = _converted(tmp_path, ignore_label=3)
    manifest = Manifest.load(out)
    for split, info in manifest.splits.items():
        listed = info.record_table
        data = (out / f"{split}.records").read_bytes()
        assert (listed.file, listed.bytes) == (f"{split}.records", len(data))
        assert listed.sha256 == hashlib.sha256(data).hexdigest()
        table = tfshards.records(out, split)
        _assert_rows_match(table, _records(out, split), ignore=3)
        assert np.asarray(table.class_pixels).sum(axis=0).tolist() == info.class_pixels
        assert int(table.ignored_pixels.sum()) == info.ignored_pixels > 0
        assert table.num_classes == 3  # the largest class present + 1; 3 is ignored
    assert tfshards.verify(out).ok


def test_the_table_is_on_disk_before_the_manifest(tmp_path, monkeypatch):
    seen = []
    save = Manifest.save

    def save_and_look(manifest, folder, storage_options=None):
        seen.append(sorted(p.name for p in Path(folder).glob("*.records")))
        return save(manifest, folder, storage_options)

    monkeypatch.setattr(Manifest, "save", save_and_look)
    _converted(tmp_path)
    assert seen == [["train.records", "val.records"]]


def test_num_classes_given_counts_absent_classes_and_skipped_pairs_are_no_rows(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 10, classes=2)
    Image.new("L", (3, 3)).save(masks / "004.png")  # the wrong size: skipped
    out = tmp_path / "out"
    manifest = tfshards.convert(images, masks, out, num_classes=5, on_error="skip", **SETTINGS)
    assert [s.key for s in manifest.skipped] == ["004"]
    tables = [tfshards.records(out, split) for split in manifest.splits]
    assert sum(len(t) for t in tables) == 9
    assert all("004" not in list(t.keys) and t.class_pixels.shape[1] == 5 for t in tables)
    assert not tables[0].presence(4).any() and tables[0].presence(1).all()


@pytest.mark.skipif(not MEMBRANE.is_dir(), reason="needs ../shared/data/membrane")
def test_membrane_round_trip(tmp_path):
    out = tmp_path / "out"
    code = main(
        ["-q", "convert", "--images", str(MEMBRANE / "image"), "--masks", str(MEMBRANE / "label")]
        + ["--out", str(out), "--binary-masks", "--val-fraction", "0.2", "--workers", "1"]
    )
    assert code == 0
    manifest = Manifest.load(out)
    for split, info in manifest.splits.items():
        table = tfshards.records(out, split)
        assert (table.num_classes, len(table)) == (2, info.records)
        assert table.class_totals().tolist() == info.class_pixels
        assert set(table.heights.tolist()) == set(table.widths.tolist()) == {512}
        for index, key in enumerate(table.keys):  # each row from the source label file
            label = np.asarray(Image.open(MEMBRANE / "label" / f"{key}.png").convert("L"))
            expected = record_row(key, (label > 0).astype(np.uint8), None)
            assert np.array_equal(table.row(index).class_counts, expected.class_counts)
            assert np.array_equal(table.row(index).class_cells, expected.class_cells)


def test_local_beam_and_bucket_tables_are_identical(tmp_path, s3_bucket):
    from tfshards.converters.beam import beam_runner  # apache-beam: in the test extra

    images, masks = write_pairs(tmp_path / "data", 24, classes=4)
    settings = {**SETTINGS, "workers": 2}
    local = tfshards.convert(images, masks, tmp_path / "local", **settings)
    beam = tfshards.convert(
        images, masks, tmp_path / "beam", runner=beam_runner("--runner=DirectRunner"), **settings
    )
    url = f"{s3_bucket}/shards"
    bucket = tfshards.convert(images, masks, url, **settings)
    for split in local.splits:
        digests = {m.splits[split].record_table.sha256 for m in (local, beam, bucket)}
        assert len(digests) == 1, split
        from_bucket = tfshards.records(url, split)
        assert from_bucket.to_bytes() == (tmp_path / "local" / f"{split}.records").read_bytes()
    assert tfshards.verify(url).ok
    # --overwrite: the old dataset's leftovers go after the new manifest, not its tables
    tfshards.convert(images, masks, url, overwrite=True, **{**settings, "seed": 4})
    assert len(tfshards.records(url, "val")) == Manifest.load(url).splits["val"].records
    # a dataset in a bucket converted before tables: built from downloaded shards
    written = storage.read_bytes(f"{url}/train.records")
    body = json.loads(storage.read_bytes(f"{url}/tfshards.json"))
    del body["splits"]["train"]["record_table"]
    storage.write_bytes(f"{url}/tfshards.json", json.dumps(body).encode())
    storage.remove(f"{url}/train.records")
    assert tfshards.records(url, "train").to_bytes() == written


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_odd_keys_and_sizes_round_trip_and_build_alike(tmp_path, compression):
    images, masks = write_pairs(tmp_path / "data", 6)
    for folder in (images, masks):  # a name that is not UTF-8, and one that is not ASCII
        os.rename(bytes(folder / "003.png"), bytes(folder) + b"/\xff\xfe3.png")
        os.rename(folder / "004.png", folder / "\u00fc4.png")
    Image.new("RGB", (7, 10)).save(images / "005.png")  # another size
    Image.new("L", (7, 10), 2).save(masks / "005.png")
    out = tmp_path / "out"
    tfshards.convert(images, masks, out, compression=compression, **{**SETTINGS, "val_fraction": 0})
    table = tfshards.records(out)
    assert sorted(table.keys) == sorted(["000", "001", "002", "\udcff\udcfe3", "\u00fc4", "005"])
    small = list(table.keys).index("005")
    assert (table.heights[small], table.widths[small], table.cells(small, 2)) == (10, 7, 0xFFFF)
    assert tfshards.verify(out).ok
    written = (out / "train.records").read_bytes()
    _drop_table(out)
    assert tfshards.records(out).to_bytes() == written


def test_a_missing_dataset_or_a_table_outside_it_is_refused(tmp_path):
    with pytest.raises(ManifestError, match="no such folder"):
        tfshards.records(tmp_path / "nowhere")
    with pytest.raises(OptionsError, match="split must be a non-empty string; got 0"):
        tfshards.records(tmp_path, 0)
    out = _converted(tmp_path)
    body = json.loads((out / "tfshards.json").read_text())
    body["splits"]["train"]["record_table"]["file"] = "../train.records"
    (out / "tfshards.json").write_text(json.dumps(body))
    with pytest.raises(ManifestError, match="'../train.records' is refused"):
        tfshards.records(out)


def test_overwrite_replaces_the_tables_too(tmp_path):
    out = _converted(tmp_path)
    images, masks = write_pairs(tmp_path / "other", 8, classes=2, seed=7)
    tfshards.convert(images, masks, out, **{**SETTINGS, "val_fraction": 0.0, "overwrite": True})
    assert sorted(p.name for p in out.glob("*.records")) == ["train.records"]
    assert len(tfshards.records(out)) == 8 and tfshards.verify(out).ok


# ---------------------------------------------------------------- loaded, or built once


def test_records_of_an_old_dataset_are_built_once_and_kept(tmp_path, cache_home, caplog):
    out = _converted(tmp_path)
    written = (out / "train.records").read_bytes()
    _drop_table(out)
    with caplog.at_level(logging.INFO, logger="tfshards"):
        built = tfshards.records(out, "train")
    assert "building it from the masks of its" in caplog.text
    assert built.to_bytes() == written  # what the conversion would have written
    [kept] = cache_home.iterdir()
    digest = hashlib.sha256((out / "tfshards.json").read_bytes()).hexdigest()
    assert kept.name == f"{digest}-train.records"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfshards"):
        again = tfshards.records(out, "train")
    assert "building" not in caplog.text and again.to_bytes() == written
    assert tfshards.verify(out).ok  # a manifest without tables is a valid dataset


def test_a_damaged_kept_table_is_removed_and_rebuilt(tmp_path, cache_home, caplog):
    out = _converted(tmp_path)
    written = (out / "train.records").read_bytes()
    _drop_table(out)
    tfshards.records(out)
    [kept] = cache_home.iterdir()
    data = bytearray(kept.read_bytes())
    data[-1] ^= 0xFF
    kept.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="tfshards"):
        table = tfshards.records(out)
    assert f"{kept}: kept per-record table is damaged" in caplog.text
    assert "sha256 differs" in caplog.text and "building it" in caplog.text
    assert table.to_bytes() == written and kept.read_bytes() != bytes(data)


def test_records_imports_no_tensorflow(tmp_path):
    out = _converted(tmp_path)
    _drop_table(out, "val")  # built, where the train table is loaded
    found = run_json_script(
        "import json, sys, tfshards\n"
        "sizes = [len(tfshards.records(sys.argv[1], s, progress=False))\n"
        "         for s in ('train', 'val')]\n"
        "print(json.dumps([sizes, 'tensorflow' in sys.modules]))",
        out,
    )
    splits = Manifest.load(out).splits
    assert found == [[splits["train"].records, splits["val"].records], False]


@pytest.mark.parametrize(
    "damage,match",
    [
        ("flip", r"train\.records: sha256 differs from the manifest"),
        ("truncate", r"train\.records: \d+ bytes, the manifest says \d+"),
        ("remove", r"train\.records: missing, but the manifest lists it"),
        ("other dataset", r"train\.records: .*(rows|pixels per class).*another dataset"),
        ("garbage", r"train\.records: not a readable per-record table"),
    ],
)
def test_a_damaged_listed_table_is_an_error_naming_it(tmp_path, damage, match):
    out = _converted(tmp_path)
    path = out / "train.records"
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    elif damage == "truncate":
        path.write_bytes(data[:-1])
    elif damage == "remove":
        path.unlink()
    elif damage == "other dataset":
        other = tfshards.records(_converted(tmp_path / "b", count=20, seed=9))
        _rewrite(out, "train", other.to_bytes())
    else:
        _rewrite(out, "train", b"tfshards-records 1\n" + b"\xff" * 40)
    with pytest.raises(RecordTableError, match=match):
        tfshards.records(out, "train")
    assert not tfshards.verify(out, quick=True).ok


# ---------------------------------------------------------------- verify


def test_verify_finds_an_edited_table_whose_manifest_agrees(tmp_path):
    out = _converted(tmp_path)
    table = tfshards.records(out)
    cells = table.class_cells.copy()
    cells[5] ^= 1  # a cell of one class entry of one record
    edited = RecordTable(**{**vars(table), "class_cells": cells})
    _rewrite(out, "train", edited.to_bytes())
    assert tfshards.verify(out, quick=True).ok  # sizes, hashes and totals agree
    report = tfshards.verify(out)
    assert not report.ok
    [problem] = report.problems
    record = int(np.searchsorted(table.class_ends.astype(np.int64), 5, side="right"))
    assert f"train.records: row {record} (key {table.keys[record]!r})" in problem
    assert "class cells differ" in problem and "train.records" in report.table()


def test_verify_finds_rows_in_another_order(tmp_path):
    out = _converted(tmp_path)
    table = tfshards.records(out)
    rows = [table.row(i) for i in range(len(table))]
    rows[0], rows[1] = rows[1], rows[0]  # same totals, same bytes: only the order differs
    _rewrite(out, "train", RecordTable.from_rows(rows, table.num_classes).to_bytes())
    problems = tfshards.verify(out).problems
    assert [p.split(" (key")[0] for p in problems] == [
        f"{out / 'train.records'}: row {row}" for row in (0, 1)
    ]
    assert all(p.split(": ")[-1].startswith("key, ") for p in problems)


# ---------------------------------------------------------------- the command


def test_cli_records_prints_a_per_class_summary(tmp_path, capsys):
    out = _converted(tmp_path)
    assert main(["records", str(out), "--split", "val"]) == 0
    text = capsys.readouterr().out
    table = tfshards.records(out, "val")
    assert text.startswith(f"val: {len(table)} records, 4 classes (val.records, ")
    lines = text.splitlines()
    assert lines[1].split() == ["class", "records", "of", "records", "pixels", "of", "pixels"]
    shares = [float(line.split()[-1].rstrip("%")) for line in lines[2:6]]
    assert abs(sum(shares) - 100) < 0.05
    assert int(lines[2].split()[1]) == int(table.presence(0).sum())


def test_cli_records_exit_codes(tmp_path, capsys):
    out = _converted(tmp_path)
    (out / "train.records").write_bytes(b"nonsense")
    assert main(["records", str(out)]) == 1
    assert "train.records: 8 bytes, the manifest says" in capsys.readouterr().err
    assert main(["records", str(out), "--split", "test"]) == 1
    assert "no split 'test'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["records", str(out), "--splt", "val"])
    assert exit_.value.code == 2 and "did you mean --split" in capsys.readouterr().err
