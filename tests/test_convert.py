"""End-to-end conversion: round trips, determinism, crash safety, errors, the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
from conftest import MEMBRANE, convert_args, read_records, shard_bytes, write_pairs
from PIL import Image

from tfshards import Manifest, OptionsError, OutputError, PairError, PairingError, convert
from tfshards.cli import main
from tfshards.schemas.manifest import ImageInfo

ENCODINGS = ["deflate", "keep", "png", "jpeg", "raw"]
COMPRESSIONS = ["none", "gzip", "zlib"]


def source_pixels(images: Path, masks: Path, key: str, channels: int):
    image = np.asarray(Image.open(next(images.glob(f"{key}.*"))))
    image = image.reshape(image.shape[0], image.shape[1], channels)
    return image, np.asarray(Image.open(masks / f"{key}.png"))


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_round_trip_every_encoding_and_compression(tmp_path, encoding, compression):
    channels = 1 if compression == "zlib" else 3
    images, masks = write_pairs(tmp_path / "data", 10, channels=channels, mask_mode="P")
    manifest = convert(
        images,
        masks,
        tmp_path / "out",
        encoding=encoding,
        mask_encoding=encoding if encoding in ("raw", "deflate") else "keep",
        compression=compression,
        val_fraction=0.3,
        seed=3,
        workers=1,
        progress=False,
    )
    seen = []
    for split in manifest.splits:
        for record in read_records(tmp_path / "out", split):
            image, mask = source_pixels(images, masks, record["key"], channels)
            assert np.array_equal(record["mask"], mask), "masks are always exact"
            if encoding == "jpeg":
                assert np.abs(record["image"].astype(int) - image).mean() < 12
            else:
                assert np.array_equal(record["image"], image)
            seen.append(record["key"])
    assert sorted(seen) == [f"{i:03d}" for i in range(10)]
    assert manifest.image.channels == channels


def test_keep_copies_source_bytes_and_reencodes_palette_masks(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 4, image_format="jpeg", mask_mode="P")
    convert(images, masks, tmp_path / "out", workers=1, progress=False, encoding="keep")
    import tensorflow as tf

    from tfshards.schemas.record import tf_feature_spec

    shard = next((tmp_path / "out").glob("train-*"))
    for serialized in tf.data.TFRecordDataset(str(shard)):
        parsed = tf.io.parse_single_example(serialized, tf_feature_spec())
        key = parsed["key"].numpy().decode()
        assert parsed["image/encoded"].numpy() == (images / f"{key}.jpg").read_bytes()
        assert parsed["image/format"].numpy() == b"jpeg"
        assert parsed["mask/format"].numpy() == b"png"
        assert parsed["mask/encoded"].numpy() != (masks / f"{key}.png").read_bytes()


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_same_inputs_give_identical_bytes_whatever_the_workers(tmp_path, compression):
    images, masks = write_pairs(tmp_path / "data", 40)
    kwargs = dict(num_shards=5, val_fraction=0.2, seed=7, progress=False, compression=compression)
    convert(images, masks, tmp_path / "w1", workers=1, **kwargs)
    convert(images, masks, tmp_path / "w2", workers=2, **kwargs)
    one, two = shard_bytes(tmp_path / "w1"), shard_bytes(tmp_path / "w2")
    assert len(one) == 5 + 2 + 1 + 2 and one == two  # shards, manifest, two tables


def test_manifest_contents(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 30, classes=3)
    manifest = convert(
        images,
        masks,
        tmp_path / "out",
        num_shards=4,
        val_fraction=0.2,
        num_classes=3,
        workers=1,
        progress=False,
    )
    loaded = Manifest.load(tmp_path / "out")
    assert loaded == manifest
    assert loaded.total_records == 30
    train = loaded.splits["train"]
    assert len(train.shards) == 4
    assert max(s.records for s in train.shards) - min(s.records for s in train.shards) <= 1
    assert sum(sum(split.class_pixels) for split in loaded.splits.values()) == 30 * 24 * 32
    assert len(train.class_pixels) == 3
    for shard in train.shards:
        data = (tmp_path / "out" / shard.file).read_bytes()
        assert len(data) == shard.bytes and hashlib.sha256(data).hexdigest() == shard.sha256
        assert shard.crc32c == f"{google_crc32c.value(data):08x}"
    assert loaded.image == ImageInfo("deflate", channels=3, height=24, width=32)
    assert loaded.mask.encoding == "deflate" and loaded.compression.type == "none"
    assert not (tmp_path / "out" / ".tfshards-work").exists()


def test_adding_pairs_never_moves_existing_pairs_between_splits(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 30)
    first = convert(images, masks, tmp_path / "a", val_fraction=0.3, workers=1, progress=False)
    write_pairs(tmp_path / "more", 60, seed=1)
    for path in sorted((tmp_path / "more" / "images").iterdir())[30:]:
        path.rename(images / path.name)
        (tmp_path / "more" / "masks" / path.name).rename(masks / path.name)
    second = convert(images, masks, tmp_path / "b", val_fraction=0.3, workers=1, progress=False)
    assert first.splits["val"].records < second.splits["val"].records
    keys_a = {s: {r["key"] for r in read_records(tmp_path / "a", s)} for s in first.splits}
    keys_b = {s: {r["key"] for r in read_records(tmp_path / "b", s)} for s in second.splits}
    for split in keys_a:
        assert keys_a[split] <= keys_b[split]


def test_bad_pair_fails_without_manifest_and_skip_lists_it(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 12)
    (images / "005.png").write_bytes(b"not a png")
    with pytest.raises(PairError, match=r"pair '005': image file .*005.png: not an image"):
        convert(images, masks, tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out" / "tfshards.json").exists()
    assert not list((tmp_path / "out").glob(".*.tmp"))
    manifest = convert(
        images, masks, tmp_path / "out", on_error="skip", overwrite=True, workers=1, progress=False
    )
    assert manifest.total_records == 11
    assert [(s.key, Path(s.file).name) for s in manifest.skipped] == [("005", "005.png")]
    assert "not an image" in manifest.skipped[0].reason


def test_bad_pair_in_a_worker_process_is_reported(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 12)
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(masks / "007.png")
    with pytest.raises(PairError, match=r"pair '007': mask file .*007.png: mask is 5x5"):
        convert(images, masks, tmp_path / "out", workers=2, num_shards=3, progress=False)
    assert not (tmp_path / "out" / "tfshards.json").exists()


def test_unpaired_inputs_fail_unless_allowed(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 6)
    (masks / "002.png").unlink()
    with pytest.raises(PairingError, match="1 images without a mask"):
        convert(images, masks, tmp_path / "out", workers=1, progress=False)
    manifest = convert(
        images, masks, tmp_path / "out", allow_unpaired=True, workers=1, progress=False
    )
    assert manifest.total_records == 5 and manifest.unpaired["images"] == 1


def test_non_empty_output_is_refused_without_resume_or_overwrite(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 6)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "something.txt").write_text("mine")
    with pytest.raises(OutputError, match="not empty"):
        convert(images, masks, tmp_path / "out", workers=1, progress=False)
    convert(images, masks, tmp_path / "out", overwrite=True, workers=1, progress=False)
    assert (tmp_path / "out" / "something.txt").read_text() == "mine"
    before = shard_bytes(tmp_path / "out")
    # --resume on a complete conversion of the same inputs does nothing
    convert(images, masks, tmp_path / "out", resume=True, workers=1, progress=False)
    assert shard_bytes(tmp_path / "out") == before
    with pytest.raises(OutputError, match="other inputs or options"):
        convert(images, masks, tmp_path / "out", resume=True, seed=5, workers=1, progress=False)


def test_second_convert_into_the_same_folder_is_locked_out(tmp_path):
    import fcntl

    images, masks = write_pairs(tmp_path / "data", 6)
    (tmp_path / "out").mkdir()
    with open(tmp_path / "out" / ".tfshards.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(OutputError, match="another tfshards convert is writing"):
            convert(images, masks, tmp_path / "out", workers=1, progress=False)


def _convert_cmd(images, masks, out, *extra):
    return [
        sys.executable,
        "-m",
        "tfshards.cli",
        "-q",
        "convert",
        "--images",
        str(images),
        "--masks",
        str(masks),
        "--out",
        str(out),
        "--encoding",
        "raw",
        "--num-shards",
        "12",
        "--compression-level",
        "9",
        "--val-fraction",
        "0.2",
        "--workers",
        "1",
        *extra,
    ]


@pytest.mark.parametrize(
    "kill_after_shards,journal",
    [(0, "current"), (1, "current"), (3, "current"), (6, "current"), (9, "current")]
    + [(3, "written before crc32c"), (3, "written before tables")],
)
def test_resume_after_kill_9_is_byte_identical(tmp_path, kill_after_shards, journal):
    images, masks = write_pairs(tmp_path / "data", 120, size=(96, 96), seed=2)
    reference = tmp_path / "reference"
    subprocess.run(_convert_cmd(images, masks, reference), check=True)
    out = tmp_path / "out"
    process = subprocess.Popen(_convert_cmd(images, masks, out))
    done = out / ".tfshards-work" / "done"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if done.is_dir() and len(list(done.glob("*.json"))) >= kill_after_shards:
            break
        time.sleep(0.002)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the conversion finished before the kill"
    assert not (out / "tfshards.json").exists()
    if journal != "current":  # a journal of an older tfshards, without this field
        field = {"written before crc32c": "crc32c", "written before tables": "record_table"}
        for entry in done.glob("*.json"):
            body = json.loads(entry.read_text())
            del body[field[journal]]
            entry.write_text(json.dumps(body))
    rerun = subprocess.run(
        _convert_cmd(images, masks, out, "--resume"), capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr
    assert shard_bytes(out) == shard_bytes(reference)
    resumed, fresh = (Manifest.load(path).splits for path in (out, reference))
    assert resumed == fresh  # the reused shards' crc32c included
    reused = int(rerun.stdout.split(" reused")[0].rsplit(" ", 1)[-1])
    assert reused >= kill_after_shards


def test_resume_refuses_changed_inputs(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 8)
    out = tmp_path / "out"
    (out / ".tfshards-work" / "done").mkdir(parents=True)
    (out / ".tfshards-work" / "job.json").write_text(json.dumps({"fingerprint": "other"}))
    with pytest.raises(OutputError, match="inputs or options changed"):
        convert(images, masks, out, resume=True, workers=1, progress=False)


def test_cli_exit_codes_and_messages(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 6)
    assert main([*convert_args(images, masks, tmp_path / "out"), "--num-classes", "3"]) == 0
    assert "train" in capsys.readouterr().out
    assert main([*convert_args(images, masks, tmp_path / "out")]) == 1
    assert "holds a complete dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # lossy encodings are not offered for masks
        main([*convert_args(images, masks, tmp_path / "o2"), "--mask-encoding", "jpeg"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'jpeg'" in capsys.readouterr().err
    assert main([*convert_args(images, masks, tmp_path / "o3"), "--num-classes", "2"]) == 1
    assert "is not below --num-classes 2" in capsys.readouterr().err
    assert not (tmp_path / "o3" / "tfshards.json").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "--images", str(images)])
    assert exit_info.value.code == 2


# Issue 28 point 9.
def test_a_split_left_empty_is_refused_before_anything_is_written(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 5)
    out = tmp_path / "out"
    assert main([*convert_args(images, masks, out), "--val-fraction", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "the train split would be empty: 5 pairs split as train 0, val 5, test 0" in err
    assert "lower --val-fraction/--test-fraction" in err
    assert not out.exists() or not any(out.iterdir()), "nothing written"
    with pytest.raises(OptionsError, match=r"the val split would be empty: 5 pairs .*--val-frac"):
        convert(images, masks, out, val_fraction=0.01, workers=1, progress=False)
    assert main([*convert_args(images, masks, out), "--val-fraction", "0.4"]) == 0


def test_cli_help_of_every_subcommand(capsys):
    from tfshards.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name in commands:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
        assert "usage: tfshards " + name in capsys.readouterr().out


def test_synth_then_convert_with_palette_masks(tmp_path, capsys):
    assert (
        main(
            [
                "synth",
                str(tmp_path / "s"),
                "--count",
                "20",
                "--size",
                "32",
                "--classes",
                "4",
                "--palette-masks",
            ]
        )
        == 0
    )
    manifest = convert(
        tmp_path / "s" / "images",
        tmp_path / "s" / "masks",
        tmp_path / "out",
        num_classes=4,
        workers=1,
        progress=False,
    )
    assert manifest.total_records == 20
    records = read_records(tmp_path / "out")
    assert max(int(r["mask"].max()) for r in records) <= 3


@pytest.mark.skipif(not MEMBRANE.is_dir(), reason="needs ../shared/data/membrane")
def test_real_membrane_data(tmp_path):
    manifest = convert(
        MEMBRANE / "image",
        MEMBRANE / "label",
        tmp_path / "out",
        mask_map=((0, 0), (255, 1)),
        num_classes=2,
        val_fraction=0.2,
        workers=2,
        progress=False,
    )
    assert manifest.total_records == 30
    assert manifest.image == ImageInfo("deflate", channels=1, height=512, width=512)
    for split in manifest.splits:
        for record in read_records(tmp_path / "out", split):
            image = np.asarray(Image.open(MEMBRANE / "image" / f"{record['key']}.png"))
            label = np.asarray(Image.open(MEMBRANE / "label" / f"{record['key']}.png"))
            assert np.array_equal(record["image"][:, :, 0], image)
            assert np.array_equal(record["mask"], (label == 255).astype(np.uint8))
    pixels = [
        sum(col) for col in zip(*(s.class_pixels for s in manifest.splits.values()), strict=True)
    ]
    # label 255 (cell interior) outnumbers 0 (the thin membranes)
    assert sum(pixels) == 30 * 512 * 512 and pixels[1] > pixels[0]


def test_progress_counts_from_the_listing_and_ends_with_cpu_per_pair(tmp_path, capsys):
    from tfshards.converters import ConvertOptions, ConvertRun, run_conversion

    images, masks = write_pairs(tmp_path / "data", 6)
    result = run_conversion(
        images, masks, tmp_path / "out", ConvertOptions(), ConvertRun(workers=1, progress=True)
    )
    shown = capsys.readouterr().err
    assert "listing" in shown and "12 files" in shown  # both folders, before any pair
    assert "checking" in shown and "converting" in shown and "MB/s" in shown
    assert "since start" in shown and "pairs/s" in shown
    effort = result.effort
    assert effort.pairs == 6 and effort.source_bytes > 0 and effort.cpu_seconds > 0
    assert 0 < effort.plan_seconds < effort.seconds
    assert f"CPU {effort.cpu_ms_per_pair:.2f} ms per pair" in shown.splitlines()[-1]


def test_summary_counts_every_pair_the_workers_converted(tmp_path, capsys):
    """Workers send progress on a queue that may still be in flight when their last shard's
    result arrives; the summary must count every pair all the same (it once said 7 of 40)."""
    from tfshards.converters import ConvertOptions, ConvertRun, run_conversion

    images, masks = write_pairs(tmp_path / "data", 40, size=(16, 16))
    source = sum(p.stat().st_size for folder in (images, masks) for p in folder.iterdir())
    options = ConvertOptions(num_shards=4, val_fraction=0.2)
    for attempt in range(3):  # the race was lost most times; three runs make it certain
        run = ConvertRun(workers=4, progress=True, overwrite=attempt > 0)
        result = run_conversion(images, masks, tmp_path / "out", options, run)
        assert (result.effort.pairs, result.effort.source_bytes) == (40, source)
        assert capsys.readouterr().err.splitlines()[-1].startswith("tfshards: converted 40 pairs")
    cli = ["convert", "--images", str(images), "--masks", str(masks), "--out", str(tmp_path / "o")]
    assert main([*cli, "--workers", "3", "--num-shards", "3"]) == 0
    assert "tfshards: converted 40 pairs in" in capsys.readouterr().err
