"""tfshards verify / inspect, damaged datasets, and running out of disk during conversion."""

from __future__ import annotations

import errno
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import convert_args, run_json_script, shard_bytes, write_pairs
from PIL import Image

import tfshards
from tfshards import convert, storage, verify
from tfshards.checks.info import weights_from_pixels
from tfshards.checks.inspect import dataset_summary, write_preview
from tfshards.cli import main


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("checks")
    images, masks = write_pairs(root / "data", 30, classes=3)
    convert(
        images,
        masks,
        root / "shards",
        num_shards=3,
        val_fraction=0.2,
        num_classes=3,
        compression="gzip",
        workers=1,
        progress=False,
    )
    return root / "shards"


@pytest.fixture
def damaged(good, tmp_path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "copy"))


def first_shard(path: Path) -> Path:
    return (
        path
        / json.loads((path / "tfshards.json").read_text())["splits"]["train"]["shards"][0]["file"]
    )


def test_a_good_dataset_verifies(good, capsys):
    report = verify(good)
    manifest = tfshards.Manifest.load(good)
    assert report.ok and len(report.shards) == sum(len(s.shards) for s in manifest.splits.values())
    assert sum(s.records_found for s in report.shards) == 30
    assert main(["-q", "verify", str(good)]) == 0
    assert "OK:" in capsys.readouterr().out
    quick = verify(good, quick=True)
    assert quick.ok and all(s.records_found is None for s in quick.shards)


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-7]), "bytes, manifest says"),
        (lambda p: p.unlink(), "missing"),
        (lambda p: p.write_bytes(_flip(p.read_bytes(), 200)), "sha256 differs"),
    ],
    ids=["truncated", "missing", "flipped-byte"],
)
def test_damaged_shards_are_named(damaged, capsys, damage, message):
    shard = first_shard(damaged)
    damage(shard)
    report = verify(damaged)
    bad = [s for s in report.shards if not s.ok]
    assert [s.file for s in bad] == [shard.name] and message in bad[0].problems[0]
    assert main(["-q", "verify", str(damaged)]) == 1
    captured = capsys.readouterr()
    assert shard.name in captured.out and "failed verification" in captured.err


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


def test_flipped_byte_with_a_matching_manifest_is_caught_by_crc(damaged):
    shard = first_shard(damaged)
    # Rewrite the shard uncompressed with a flipped byte and fix size/hash in the manifest,
    # so only the record CRCs can tell.
    import gzip
    import hashlib

    raw = _flip(gzip.decompress(shard.read_bytes()), 500)
    shard.write_bytes(gzip.compress(raw))
    body = json.loads((damaged / "tfshards.json").read_text())
    entry = body["splits"]["train"]["shards"][0]
    entry["bytes"], entry["sha256"], entry["crc32c"] = (
        shard.stat().st_size,
        hashlib.sha256(shard.read_bytes()).hexdigest(),
        storage.file_digests(shard, ["crc32c"])["crc32c"],
    )
    (damaged / "tfshards.json").write_text(json.dumps(body))
    report = verify(damaged)
    assert not report.ok
    assert "CRC mismatch" in next(s for s in report.shards if not s.ok).problems[0]


def test_a_shard_whose_crc32c_differs_from_the_manifests_is_named(damaged):
    """The CRC-32C that bucket downloads are checked by is checked by verify as well."""
    body = json.loads((damaged / "tfshards.json").read_text())
    entry = body["splits"]["train"]["shards"][0]
    assert entry["crc32c"] == storage.file_digests(damaged / entry["file"], ["crc32c"])["crc32c"]
    entry["crc32c"] = f"{int(entry['crc32c'], 16) ^ 1:08x}"
    (damaged / "tfshards.json").write_text(json.dumps(body))
    bad = [s for s in verify(damaged).shards if not s.ok]
    assert [s.file for s in bad] == [entry["file"]]
    assert bad[0].problems == ["crc32c differs from the manifest (corrupted or replaced)"]


def test_a_manifest_without_crc32c_is_checked_by_sha256_alone(damaged):
    """Manifests written before the field: verify passes them, and still checks the sha256."""
    body = json.loads((damaged / "tfshards.json").read_text())
    for split in body["splits"].values():
        for shard in split["shards"]:
            del shard["crc32c"]
    (damaged / "tfshards.json").write_text(json.dumps(body))
    assert verify(damaged).ok
    body["splits"]["train"]["shards"][0]["sha256"] = ""
    (damaged / "tfshards.json").write_text(json.dumps(body))
    bad = [s for s in verify(damaged).shards if not s.ok]
    assert len(bad) == 1 and bad[0].problems == [
        "sha256 differs from the manifest (corrupted or replaced)"
    ]


@pytest.mark.parametrize("value", [123, "ABCDEF01", "abc", ""])
def test_a_malformed_crc32c_in_the_manifest_is_named_on_load(damaged, value):
    body = json.loads((damaged / "tfshards.json").read_text())
    shard = body["splits"]["train"]["shards"][0]
    shard["crc32c"] = value
    (damaged / "tfshards.json").write_text(json.dumps(body))
    with pytest.raises(tfshards.ManifestError, match=f"shard '{shard['file']}' crc32c"):
        tfshards.Manifest.load(damaged)


def test_stray_shard_file_and_edited_manifests(damaged):
    (damaged / "train-00009-of-00010.tfrecord.gz").write_bytes(b"old")
    (damaged / "README.txt").write_text("notes are fine")
    report = verify(damaged)
    assert report.problems == [
        "stray file 'train-00009-of-00010.tfrecord.gz' looks like a shard "
        "but is not in the manifest"
    ]
    (damaged / "train-00009-of-00010.tfrecord.gz").unlink()
    body = json.loads((damaged / "tfshards.json").read_text())
    body["splits"]["train"]["shards"][0]["file"] = "../../etc/passwd"
    (damaged / "tfshards.json").write_text(json.dumps(body))
    assert "'../../etc/passwd' is refused" in verify(damaged).problems[0]
    (damaged / "tfshards.json").write_text("{")
    assert "not valid JSON" in verify(damaged).problems[0]


def test_wrong_record_count_in_manifest(damaged):
    body = json.loads((damaged / "tfshards.json").read_text())
    body["splits"]["train"]["shards"][0]["records"] += 1
    body["splits"]["train"]["records"] += 1
    (damaged / "tfshards.json").write_text(json.dumps(body))
    report = verify(damaged)
    bad = [s for s in report.shards if not s.ok]
    assert len(bad) == 1 and "records, manifest says" in bad[0].problems[0]


def test_inspect_summary_weights_and_preview(good, tmp_path, capsys):
    summary = dataset_summary(good)
    assert summary["records"] == 30 and set(summary["splits"]) == {"train", "val"}
    assert sum(summary["class_pixels"]) == 30 * 24 * 32
    weights = weights_from_pixels([100, 300, 0, 200], "median_frequency")
    assert weights == pytest.approx([2.0, 2 / 3, 0.0, 1.0])
    assert main(["-q", "inspect", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 30
    assert (
        main(["-q", "inspect", str(good), "--preview", str(tmp_path / "p.png"), "--count", "3"])
        == 0
    )
    assert "weight (train, median frequency)" in capsys.readouterr().out
    preview = Image.open(tmp_path / "p.png")  # titles, 3 rows with keys, a legend line
    assert preview.size == (3 * 160, 14 + 3 * (160 + 14) + 14)
    val_records = tfshards.Manifest.load(good).splits["val"].records
    assert write_preview(good, tmp_path / "q.png", count=100, split="val") == val_records


def test_disk_full_during_conversion_leaves_no_manifest_and_resume_completes(tmp_path, monkeypatch):
    from tfshards.converters import writer

    images, masks = write_pairs(tmp_path / "data", 40)
    reference = tmp_path / "reference"
    convert(images, masks, reference, num_shards=4, workers=1, progress=False)
    calls = {"n": 0}
    real_frame = writer.frame_record

    def frame_until_full(data: bytes) -> bytes:
        calls["n"] += 1
        if calls["n"] == 25:  # in the third shard
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_frame(data)

    monkeypatch.setattr(writer, "frame_record", frame_until_full)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="No space left on device"):
        convert(images, masks, out, num_shards=4, workers=1, progress=False)
    assert not (out / "tfshards.json").exists() and not list(out.glob(".*.tmp"))
    assert len(list(out.glob("train-*"))) == 2
    monkeypatch.setattr(writer, "frame_record", real_frame)  # room again
    convert(images, masks, out, num_shards=4, workers=1, progress=False, resume=True)
    assert shard_bytes(out) == shard_bytes(reference)


def test_disk_full_reported_by_the_cli(tmp_path, monkeypatch, capsys):
    from tfshards.converters import writer

    images, masks = write_pairs(tmp_path / "data", 4)

    def full(data: bytes) -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "frame_record", full)
    code = main([*convert_args(images, masks, tmp_path / "out"), "--workers", "1"])
    assert code == 1
    assert "No space left on device" in capsys.readouterr().err


def test_unusual_inputs_are_converted_or_refused_clearly(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 4)
    rgb = np.full((24, 32, 3), 70, np.uint8)
    Image.fromarray(rgb).save(images / "000.bmp")
    (images / "000.png").unlink()
    Image.fromarray(rgb).save(images / "001.webp", lossless=True)
    (images / "001.png").unlink()
    Image.fromarray(rgb).convert("RGBA").save(images / "002.png")
    manifest = convert(images, masks, tmp_path / "out", workers=1, progress=False)
    assert manifest.total_records == 4 and verify(tmp_path / "out").ok
    Image.fromarray(np.zeros((24, 32), np.uint16)).save(images / "003.png")
    refused = "003.png: the image holds 1 channel.* of uint16 .* never cut to 8 bits"
    with pytest.raises(tfshards.PairError, match=refused):
        convert(images, masks, tmp_path / "out2", workers=1, progress=False)


def test_gif_and_tiff_images_are_converted(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 3)
    rgb = np.full((24, 32, 3), 120, np.uint8)
    Image.fromarray(rgb).save(images / "000.gif")
    (images / "000.png").unlink()
    Image.fromarray(rgb).save(images / "001.tiff")
    (images / "001.png").unlink()
    manifest = convert(images, masks, tmp_path / "out", workers=1, progress=False)
    assert manifest.total_records == 3 and verify(tmp_path / "out").ok


def test_non_utf8_file_names_pair_and_convert(tmp_path):
    import os

    images, masks = write_pairs(tmp_path / "data", 2)
    odd = os.fsdecode(b"caf\xe9")  # Latin-1 bytes, not valid UTF-8
    (images / "000.png").rename(images / f"{odd}.png")
    (masks / "000.png").rename(masks / f"{odd}.png")
    manifest = convert(images, masks, tmp_path / "out", workers=1, progress=False)
    assert manifest.total_records == 2
    assert verify(tmp_path / "out").ok
    json.dumps(tfshards.Manifest.load(tmp_path / "out").to_json())  # the manifest stays valid


def test_cache_cli_lists_and_clears(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 6)
    convert(images, masks, tmp_path / "shards", workers=1, progress=False)
    ds = tfshards.read(tmp_path / "shards", batch_size=3, cache=True)
    assert sum(int(i.shape[0]) for i, _ in ds) == 6
    assert main(["-q", "cache", "list", str(tmp_path / "shards")]) == 0
    out = capsys.readouterr().out
    assert "ready" in out and "split=train" in out
    assert main(["-q", "cache", "clear", str(tmp_path / "shards")]) == 0
    assert "MiB freed" in capsys.readouterr().out
    assert main(["-q", "cache", "list", str(tmp_path / "shards")]) == 0
    assert "no caches" in capsys.readouterr().out


# Issue 43 (first hour): `cache list` took 6 s, most of it importing TensorFlow.
def test_cache_list_and_clear_import_no_tensorflow(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 6)
    convert(images, masks, tmp_path / "shards", workers=1, progress=False)
    assert sum(int(i.shape[0]) for i, _ in tfshards.read(tmp_path / "shards", cache=True)) == 6
    code = (
        "import json, sys\n"
        "import tfshards\n"
        "from tfshards.cli import main\n"
        "assert main(['-q', 'cache', 'list', sys.argv[1]]) == 0\n"
        "states = [e.state for e in tfshards.list_caches(sys.argv[1])]\n"
        "freed = tfshards.clear_caches(sys.argv[1], stale=True)\n"
        "print(json.dumps([states, freed, 'tensorflow' in sys.modules]))\n"
    )
    assert run_json_script(code, tmp_path / "shards") == [["ready"], 0, False]


def test_keys_repeated_across_shards_are_reported(damaged):
    import hashlib

    body = json.loads((damaged / "tfshards.json").read_text())
    train = body["splits"]["train"]["shards"][0]
    copy = damaged / "val-00009-of-00010.tfrecord.gz"  # the same records, listed again in val
    shutil.copy(damaged / train["file"], copy)
    body["splits"]["val"]["shards"].append(
        {**train, "file": copy.name, "sha256": hashlib.sha256(copy.read_bytes()).hexdigest()}
    )
    body["splits"]["val"]["records"] += train["records"]
    (damaged / "tfshards.json").write_text(json.dumps(body))
    bad = [s for s in verify(damaged).shards if not s.ok]
    assert [s.file for s in bad] == [copy.name]
    assert "also in " + train["file"] in bad[0].problems[0]


CHECKS_SCRIPT = """
import sys
import tfshards
assert tfshards.verify(sys.argv[1]).ok
tfshards.dataset_summary(sys.argv[1])
tfshards.class_weights(sys.argv[1])
tfshards.checks.inspect.write_preview(sys.argv[1], sys.argv[1] + "/../p.png", count=2)
loaded = [name for name in ("tensorflow", "tensorflow_datasets") if name in sys.modules]
print("loaded:", loaded)
"""


def test_checks_and_their_record_decoder_need_no_tensorflow(good):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", CHECKS_SCRIPT, str(good)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded: []"
