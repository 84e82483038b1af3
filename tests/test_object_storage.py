"""Datasets in object storage, write side: the storage layer, convert into and from a bucket
(moto's S3 server on 127.0.0.1, a GCS emulator), resume, overwrite, Beam, credentials."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import convert_args, write_pairs
from PIL import Image
from s3_server import s3_environment, s3_objects, upload_folder

from tfshards import convert, storage
from tfshards.checks.verify import verify
from tfshards.cli import main
from tfshards.errors import ManifestError, OptionsError, OutputError, StorageError
from tfshards.schemas import Manifest

# The default deflate library: its bytes must be the same from every process (ISA-L's
# levels 1 and 2 were not, which made these comparisons flaky; see schemas/deflate.py).
SETTINGS = dict(num_shards=4, val_fraction=0.2, num_classes=3, seed=5, progress=False)
ROOT = Path(__file__).resolve().parents[1]


def local_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# ---------------------------------------------------------------- storage layer


def test_storage_on_memory_urls(tmp_path):
    root = "memory://tfshards-test/walk"
    storage.write_bytes(f"{root}/a.txt", b"one")
    storage.write_bytes(f"{root}/sub/b.txt", b"two")
    storage.write_bytes(f"{root}/.hidden/c.txt", b"three")
    assert storage.walk(root) == [".hidden/c.txt", "a.txt", "sub/b.txt"]
    assert storage.walk(root, skip_hidden_folders=True) == ["a.txt", "sub/b.txt"]
    assert storage.exists(f"{root}/a.txt") and not storage.exists(f"{root}/nope")
    assert storage.size(f"{root}/sub/b.txt") == 3
    (tmp_path / "up.bin").write_bytes(b"x" * 1000)
    storage.put(tmp_path / "up.bin", f"{root}/up.bin")
    storage.get(f"{root}/up.bin", tmp_path / "down.bin")
    assert storage.file_digests(tmp_path / "down.bin") == storage.file_digests(tmp_path / "up.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["down.bin", "up.bin"]  # no temporary
    storage.remove(f"{root}/sub", recursive=True)
    storage.remove(f"{root}/never-there")  # no error
    assert storage.walk(root) == [".hidden/c.txt", "a.txt", "up.bin"]
    assert storage.join(root, "x", "y.png") == f"{root}/x/y.png"
    assert storage.join(tmp_path, "y.png") == tmp_path / "y.png"
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{root}/nope")


def test_local_paths_take_plain_calls(tmp_path):
    storage.write_bytes(tmp_path / "f.bin", b"abc")
    assert storage.walk(tmp_path) == ["f.bin"]  # no temporary file left
    assert storage.stat(str(tmp_path / "f.bin")).size == 3
    assert not storage.is_url(tmp_path) and not storage.is_url("data/s3:/x")
    assert "fsspec" not in storage.join.__code__.co_names


def test_missing_protocol_package_names_the_url_and_the_extra():
    pytest.importorskip("s3fs")
    with pytest.raises(StorageError, match=r"nosuchproto://b/x: .*nosuchproto"):
        storage.exists("nosuchproto://b/x")
    try:
        import adlfs  # noqa: F401
    except ImportError:
        with pytest.raises(StorageError, match=r"az://container/x: the az:// protocol needs"):
            storage.exists("az://container/x")


def test_display_drops_user_info():
    assert storage.display("ftp://user:s3cret@host/data") == "ftp://host/data"


def test_parse_storage_options():
    parsed = storage.parse_options(
        ["anon=true", "profile=training", "client_kwargs.region_name=eu-west-1", "retries=3"]
    )
    assert parsed == {
        "anon": True,
        "profile": "training",
        "client_kwargs": {"region_name": "eu-west-1"},
        "retries": 3,
    }
    with pytest.raises(OptionsError, match="number 2 is not KEY=VALUE") as caught:
        storage.parse_options(["anon=true", "pasted-secret"])
    assert "pasted-secret" not in str(caught.value)


def test_transient_errors_are_retried_then_named(monkeypatch):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(104, "Connection reset by peer")
        return "ok"

    monkeypatch.setattr(storage, "_FIRST_DELAY", 0.01)
    assert storage.retrying("read", "s3://b/k", flaky) == "ok" and len(calls) == 3

    def down():
        raise TimeoutError("timed out")

    started = time.monotonic()
    with pytest.raises(StorageError, match=r"s3://b/k: cannot read after \d+ attempts \(Timeout"):
        storage.retrying("read", "s3://b/k", down, seconds=0.3)
    assert time.monotonic() - started < 2

    def denied():
        raise PermissionError("Access Denied")

    with pytest.raises(StorageError, match=r"s3://b/k: cannot read \(PermissionError"):
        storage.retrying("read", "s3://b/k", denied)


def test_a_server_that_is_down_fails_within_the_bound(monkeypatch, s3_server):
    from s3_server import free_port

    monkeypatch.setattr(storage, "RETRY_SECONDS", 2.0)
    options = {
        "endpoint_url": f"http://127.0.0.1:{free_port()}",
        "key": "k",
        "secret": "s",
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"s3://bucket/x/tfshards.json: cannot read"):
        storage.read_bytes("s3://bucket/x/tfshards.json", options)
    assert time.monotonic() - started < 30


# ---------------------------------------------------------------- convert into S3


def test_convert_local_to_s3_is_byte_identical(tmp_path, s3_bucket):
    images, masks = write_pairs(tmp_path / "data", 30)
    local = convert(images, masks, tmp_path / "local", workers=2, **SETTINGS)
    out = f"{s3_bucket}/shards"
    remote = convert(images, masks, out, workers=2, **SETTINGS)
    # shards and manifest, nothing else; decoded alike, and byte-identical or reported
    _assert_same_as_local(s3_objects(out), tmp_path / "local", tmp_path / "remote-copy")
    assert remote == local
    assert Manifest.load(out) == local
    report = verify(out)
    assert report.ok, report.table()


def test_index_files_and_tfds_metadata_in_a_bucket(tmp_path, s3_bucket):
    pytest.importorskip("tensorflow_datasets")
    images, masks = write_pairs(tmp_path / "data", 12)
    extra = dict(index=True, tfds_metadata=True, workers=1, **SETTINGS)
    convert(images, masks, tmp_path / "local", **extra)
    out = f"{s3_bucket}/shards"
    convert(images, masks, out, **extra)
    objects, files = s3_objects(out), local_files(tmp_path / "local")
    assert objects.keys() == files.keys()
    assert any(name.endswith(".idx") for name in objects)
    for name in ("dataset_info.json", "features.json"):  # TFDS's JSON; its paths differ
        assert json.loads(objects.pop(name)) and files.pop(name)
    assert objects == files


def test_convert_s3_to_s3_with_name_patterns(tmp_path, s3_bucket):
    images, masks = write_pairs(tmp_path / "data", 20)
    both = tmp_path / "both"
    both.mkdir()
    for path in images.iterdir():
        (both / f"image_{path.name}").write_bytes(path.read_bytes())
    for path in masks.iterdir():
        (both / f"mask_{path.name}").write_bytes(path.read_bytes())
    patterns = dict(image_pattern="image_{key}.png", mask_pattern="mask_{key}.png")
    local = convert(both, None, tmp_path / "local", workers=1, **patterns, **SETTINGS)
    upload_folder(both, f"{s3_bucket}/inputs")
    out = f"{s3_bucket}/shards"
    remote = convert(f"{s3_bucket}/inputs", None, out, workers=2, **patterns, **SETTINGS)
    assert remote.source["images"] == f"{s3_bucket}/inputs"
    # The manifests differ in the sources they record, not in the shards.
    copy = tmp_path / "remote-copy"
    _assert_same_as_local(s3_objects(out), tmp_path / "local", copy, skip="tfshards.json")
    assert remote.splits == local.splits


def test_inputs_from_two_prefixes_via_cli(tmp_path, s3_bucket, capsys):
    images, masks = write_pairs(tmp_path / "data", 12)
    upload_folder(tmp_path / "data", f"{s3_bucket}/data")
    out = f"{s3_bucket}/shards"
    command = convert_args(f"{s3_bucket}/data/images", f"{s3_bucket}/data/masks", out)
    assert main([*command, "--num-shards", "2"]) == 0
    assert "12 pairs" in capsys.readouterr().out
    assert main(["verify", out]) == 0
    assert "OK: s3://" in capsys.readouterr().out
    assert main(["inspect", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == out


def test_inspect_preview_of_a_dataset_in_a_bucket(tmp_path, s3_bucket, capsys):
    images, masks = write_pairs(tmp_path / "data", 12)
    out = f"{s3_bucket}/shards"
    convert(images, masks, out, workers=1, **SETTINGS)
    preview = tmp_path / "preview.png"
    assert main(["-q", "inspect", out, "--preview", str(preview), "--count", "3"]) == 0
    assert "train" in capsys.readouterr().out
    assert Image.open(preview).size == (3 * 160, 14 + 3 * (160 + 14) + 14)  # 3 rows


def test_bench_copies_inputs_from_a_bucket_then_measures_the_local_disk(tmp_path, s3_bucket):
    write_pairs(tmp_path / "data", 24, size=(16, 16))
    upload_folder(tmp_path / "data", f"{s3_bucket}/data")
    grid = ["--shards", "1", "--encodings", "raw", "--compression", "none"]
    command = [
        *["-q", "bench", "--images", f"{s3_bucket}/data/images"],
        *["--masks", f"{s3_bucket}/data/masks", "--work", str(tmp_path / "work")],
        *["--report", str(tmp_path / "report"), *grid, "--cycle-lengths", "1"],
    ]
    assert main(command) == 0
    for name in ("images", "masks"):
        copied = tmp_path / "work" / "inputs" / name
        for source in (tmp_path / "data" / name).iterdir():
            assert (copied / source.name).read_bytes() == source.read_bytes()
    body = json.loads((tmp_path / "report" / "results.json").read_text())
    assert body["complete"] and body["pairs"] == 24


def test_bench_refuses_a_bucket_for_its_scratch_or_report_and_an_empty_input(
    tmp_path, s3_bucket, capsys
):
    local = ["--images", str(tmp_path), "--masks", str(tmp_path)]
    assert main(["bench", *local, "--work", f"{s3_bucket}/work"]) == 2
    assert "--work must be a local folder" in capsys.readouterr().err
    assert main(["bench", *local, "--report", f"{s3_bucket}/report"]) == 2
    assert "--report must be a local folder" in capsys.readouterr().err
    remote = ["--images", f"{s3_bucket}/none", "--masks", f"{s3_bucket}/none2"]
    assert main(["-q", "bench", *remote, "--work", str(tmp_path / "w")]) == 2
    assert f"{s3_bucket}/none: not a folder, or an empty one" in capsys.readouterr().err


def test_missing_input_prefix_is_bad_usage(tmp_path, s3_bucket, capsys):
    assert main(convert_args(f"{s3_bucket}/none", f"{s3_bucket}/none2", tmp_path / "o")) == 2
    assert f"{s3_bucket}/none: not a folder" in capsys.readouterr().err


def test_verify_names_a_flipped_byte_in_a_bucket(tmp_path, s3_bucket):
    import s3fs

    images, masks = write_pairs(tmp_path / "data", 12)
    out = f"{s3_bucket}/shards"
    manifest = convert(images, masks, out, workers=1, **SETTINGS)
    shard = manifest.splits["train"].shards[1].file
    fs = s3fs.S3FileSystem()
    key = f"{out.removeprefix('s3://')}/{shard}"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(key, bytes(data))
    report = verify(out, quick=True)
    assert not report.ok
    bad = [s for s in report.shards if not s.ok]
    assert [s.file for s in bad] == [shard] and "sha256 differs" in bad[0].problems[0]


def test_a_prefix_without_manifest_is_no_dataset(s3_bucket):
    with pytest.raises(
        ManifestError,
        match=r"s3://.*/nothing: no manifest \(tfshards.json\): not a finished dataset",
    ):
        Manifest.load(f"{s3_bucket}/nothing")


def test_non_empty_prefix_needs_resume_or_overwrite(tmp_path, s3_bucket):
    images, masks = write_pairs(tmp_path / "data", 10)  # 8 would leave val empty: refused
    storage.write_bytes(f"{s3_bucket}/shards/notes.txt", b"mine")
    with pytest.raises(OutputError, match=r"not empty .*resume=True .* overwrite=True"):
        convert(images, masks, f"{s3_bucket}/shards", workers=1, **SETTINGS)


def test_overwrite_removes_the_old_dataset_after_the_new_manifest(tmp_path, s3_bucket):
    images, masks = write_pairs(tmp_path / "data", 24)
    out = f"{s3_bucket}/shards"
    convert(images, masks, out, workers=1, **SETTINGS)
    storage.write_bytes(f"{out}/README.txt", b"not ours")
    settings = {**SETTINGS, "num_shards": 2}
    new = convert(images, masks, out, workers=1, overwrite=True, **settings)
    convert(images, masks, tmp_path / "local", workers=1, **settings)
    objects = s3_objects(out)
    assert objects.pop("README.txt") == b"not ours"  # only tfshards' own objects go
    assert objects == local_files(tmp_path / "local")
    assert Manifest.load(out) == new


def test_a_failed_overwrite_leaves_no_manifest(tmp_path, s3_bucket):
    from PIL import Image

    images, masks = write_pairs(tmp_path / "data", 12)
    out = f"{s3_bucket}/shards"
    convert(images, masks, out, workers=1, **SETTINGS)
    Image.new("L", (3, 3)).save(masks / "004.png")
    with pytest.raises(Exception, match=r"pair '004'"):
        convert(images, masks, out, workers=1, overwrite=True, **SETTINGS)
    assert "tfshards.json" not in s3_objects(out)  # never the old manifest over new shards
    with pytest.raises(ManifestError, match="no manifest"):
        Manifest.load(out)


def _journal(out: str) -> list[str]:
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    try:
        return fs.find(f"{out.removeprefix('s3://')}/.tfshards-work/done")
    except FileNotFoundError:
        return []


def test_resume_after_a_kill_uploads_only_the_rest(tmp_path, s3_bucket, s3_server):
    images, masks = write_pairs(tmp_path / "data", 160, size=(96, 96))
    out = f"{s3_bucket}/shards"
    command = [
        sys.executable,
        "-m",
        "tfshards.cli",
        "-q",
        *convert_args(images, masks, out),
        "--num-shards",
        "40",
        "--workers",
        "1",
    ]
    env = {**os.environ, **s3_environment(s3_server.endpoint), "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(_journal(out)) < 3 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    journaled = len(_journal(out))
    assert 3 <= journaled < 40, "the conversion ended before it could be killed"
    assert "tfshards.json" not in s3_objects(out)
    resumed = subprocess.run(
        [*command, "--resume"], env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    reused = int(resumed.stdout.split(" written, ")[1].split(" reused")[0])
    assert reused >= journaled
    written = int(resumed.stdout.split("(")[1].split(" shard")[0])
    assert written + reused == sum(len(s.shards) for s in Manifest.load(out).splits.values())
    local = tmp_path / "local"
    assert main([*convert_args(images, masks, local), "--num-shards", "40"]) == 0
    _assert_same_as_local(s3_objects(out), local, tmp_path / "remote-copy")


def _assert_same_as_local(
    objects: dict[str, bytes], local: Path, scratch: Path, skip: str = ""
) -> None:
    """The same objects as the local conversion's files (but ``skip``), byte for byte;
    a failure says which records and fields differ."""
    expected = local_files(local)
    assert objects.keys() == expected.keys()
    objects = {k: v for k, v in objects.items() if k != skip}
    expected = {k: v for k, v in expected.items() if k != skip}
    for name in (n for n in expected if n.endswith(".tfrecord")):  # what readers see: equal
        assert _decoded(objects[name]) == _decoded(expected[name]), name
    if objects != expected:
        why = _record_differences(objects, local, scratch)
        pytest.fail(f"shards in the bucket decode alike but are not byte-identical:\n{why}")


def test_beam_multi_process_writes_to_s3_like_local(tmp_path, s3_bucket, s3_server):
    pytest.importorskip("apache_beam")
    from tfshards.converters.beam import beam_runner

    images, masks = write_pairs(tmp_path / "data", 24)
    upload_folder(tmp_path / "data", f"{s3_bucket}/data")
    local = convert(images, masks, tmp_path / "local", workers=2, **SETTINGS)
    runner = beam_runner(
        "--runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing"
    )
    out = f"{s3_bucket}/shards"
    remote = convert(
        f"{s3_bucket}/data/images", f"{s3_bucket}/data/masks", out, runner=runner, **SETTINGS
    )
    # The manifests differ in the options they record (the runner), not in the shards.
    copy = tmp_path / "remote-copy"
    _assert_same_as_local(s3_objects(out), tmp_path / "local", copy, skip="tfshards.json")
    assert remote.splits == local.splits


def test_a_secret_key_is_never_printed_nor_stored(tmp_path, s3_bucket, s3_server, capfd):
    secret = "SECRETtfshards0xC0FFEE0xC0FFEE"
    images, masks = write_pairs(tmp_path / "data", 8)
    out = f"{s3_bucket}/shards"
    flags = [
        f"--storage-option=key={os.environ['AWS_ACCESS_KEY_ID']}",
        f"--storage-option=secret={secret}",
        f"--storage-option=endpoint_url={s3_server.endpoint}",
    ]
    log = tmp_path / "log.txt"
    import logging

    handler = logging.FileHandler(log)
    logging.getLogger().addHandler(handler)
    try:
        assert main(["-v", *convert_args(images, masks, out), *flags, "--num-shards", "2"]) == 0
        assert main(["verify", out, *flags]) == 0
        assert main(["inspect", out, *flags]) == 0
        # Failures: a missing prefix, a bucket that does not exist.
        assert main(["verify", f"{s3_bucket}/absent", *flags]) == 1
        assert main([*convert_args(images, masks, "s3://no-such-bucket-x/o"), *flags]) == 1
        assert main(["convert", "--images", "x", "--out", "y", "--storage-option", secret]) == 2
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    printed = capfd.readouterr()
    assert "error" in printed.err
    for text in (printed.out, printed.err, log.read_text()):
        assert secret not in text
    for name, data in s3_objects(out).items():
        assert secret.encode() not in data, name


def test_gcs_emulator_smoke(tmp_path, monkeypatch):
    """gs:// through gcsfs against gcp-storage-emulator (in-memory) on 127.0.0.1."""
    pytest.importorskip("gcsfs")
    from s3_server import start_gcs

    server = start_gcs(monkeypatch, bucket="tfshards-gcs")
    try:
        images, masks = write_pairs(tmp_path / "data", 12)
        local = convert(images, masks, tmp_path / "local", workers=1, **SETTINGS)
        options = {"token": "anon", "project": "test"}
        out = "gs://tfshards-gcs/shards"
        remote = convert(images, masks, out, workers=1, storage_options=options, **SETTINGS)
        assert remote == local
        names = storage.walk(out, options)
        assert names == sorted(local_files(tmp_path / "local"))
        for name in names:
            data = storage.read_bytes(f"{out}/{name}", options)
            assert data == (tmp_path / "local" / name).read_bytes()
        assert verify(out, storage_options=options).ok
    finally:
        server.stop()


def _decoded(shard: bytes) -> list[tuple[str, bytes, bytes]]:
    """Each record's key and decoded pixels, in order (pure Python, CRCs checked)."""
    import io

    from tfshards.schemas.record import decode_record
    from tfshards.schemas.tfrecord import iter_records, parse_example

    records = (decode_record(parse_example(data)) for data in iter_records(io.BytesIO(shard)))
    return [(r.key, r.image.tobytes(), r.mask.tobytes()) for r in records]


def _record_differences(objects: dict[str, bytes], local: Path, scratch: Path) -> str:
    """Which records of which shards differ, for the failure message."""
    scratch.mkdir(exist_ok=True)
    lines = []
    for path in sorted(local.glob("*.tfrecord*")):
        ours, theirs = path.read_bytes(), objects.get(path.name)
        if theirs is None or theirs == ours:
            lines.append(f"{path.name}: {'missing' if theirs is None else 'same bytes'}")
            continue
        pairs = zip(ours, theirs, strict=False)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        lines.append(f"{path.name}: {len(ours)} vs {len(theirs)} bytes, first differs at {first}")
        (scratch / path.name).write_bytes(theirs)
        try:
            lines += _differing_records(path, scratch / path.name)
        except Exception as exc:  # noqa: BLE001 - a diagnostic: say why it could not decode
            lines.append(f"  records not comparable: {type(exc).__name__}: {exc}")
    return "\n".join(lines)


def _differing_records(ours: Path, theirs: Path) -> list[str]:
    import tensorflow as tf

    kind = "GZIP" if ours.name.endswith(".gz") else ""
    local, remote = (
        [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(p), compression_type=kind)]
        for p in (ours, theirs)
    )
    lines = [f"  {len(local)} local records, {len(remote)} remote"]
    for index, (a, b) in enumerate(zip(local, remote, strict=False)):
        if a != b:
            fa, fb = (tf.train.Example.FromString(x).features.feature for x in (a, b))
            fields = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
            lines.append(f"  record {index}: fields differ: {fields}")
            if "mask/encoded" in fields:
                lines.append("  " + _which_compressor(fa, fb))
    return lines


def _which_compressor(local, remote) -> str:
    """Which side's deflated mask a fresh compress of the same pixels reproduces."""
    import zlib

    from tfshards.schemas import deflate

    ours, theirs = (f["mask/encoded"].bytes_list.value[0] for f in (local, remote))
    pixels = zlib.decompress(ours)
    same = zlib.decompress(theirs) == pixels
    fresh = {"tfshards": deflate.compress(pixels, 1), "zlib": zlib.compress(pixels, 1)}
    return (
        f"same pixels: {same}; local is {[k for k, v in fresh.items() if v == ours]}, "
        f"remote is {[k for k, v in fresh.items() if v == theirs]} (a fresh compress here); "
        f"headers {ours[:2].hex()} / {theirs[:2].hex()}"
    )


def test_cli_at_default_verbosity_keeps_third_party_info_lines_out(tmp_path, s3_bucket, s3_server):
    """botocore logs "Found credentials in environment variables." at INFO; the CLI printed
    it as ``tfshards: INFO: ...`` into the progress bar. Only tfshards' own lines show."""
    images, masks = write_pairs(tmp_path / "data", 6)
    env = {**os.environ, **s3_environment(s3_server.endpoint), "PYTHONPATH": str(ROOT)}
    env.pop("AWS_PROFILE", None)
    out = f"{s3_bucket}/shards"
    for command in (
        ["convert", "--images", str(images), "--masks", str(masks), "--out", out],
        ["verify", out],
        ["inspect", out],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "tfshards.cli", *command],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Found credentials" not in done.stderr and "Found endpoint" not in done.stderr
        assert not [line for line in done.stderr.splitlines() if line.startswith("botocore")]
    verbose = subprocess.run(
        [sys.executable, "-m", "tfshards.cli", "-v", "verify", "--quick", out],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert "botocore: DEBUG:" in verbose.stderr  # -v still shows every library's lines


@pytest.mark.parametrize("where", ["s3", "memory", "local"])
def test_download_hashed_writes_the_object_and_returns_its_size_and_sha256(
    where, request, tmp_path
):
    body = os.urandom(9 * 2**20 + 123)  # more than two of its 4 MiB chunks
    if where == "s3":
        source = f"{request.getfixturevalue('s3_bucket')}/dir/obj.bin"
    elif where == "memory":
        source = f"memory://tfshards-hashed-{os.getpid()}/obj.bin"
    else:
        source = str(tmp_path / "obj.bin")
    storage.write_bytes(source, body)
    target = tmp_path / "copy.bin"
    target.write_bytes(b"stale bytes of an earlier attempt, longer than nothing")
    size, digest = storage.download_hashed(source, target)
    assert (size, digest) == (len(body), hashlib.sha256(body).hexdigest())
    assert target.read_bytes() == body


def test_download_hashed_keeps_the_callers_client_options(s3_bucket, tmp_path):
    storage.write_bytes(f"{s3_bucket}/a.bin", b"abc")
    options = {"config_kwargs": {"connect_timeout": 3}}
    merged = storage._download_options(f"{s3_bucket}/a.bin", options)
    assert merged["config_kwargs"] == {
        "connect_timeout": 3,
        "response_checksum_validation": "when_required",
    }
    assert options == {"config_kwargs": {"connect_timeout": 3}}, "the caller's dict untouched"
    assert storage.download_hashed(f"{s3_bucket}/a.bin", tmp_path / "a", options)[0] == 3
    with pytest.raises(FileNotFoundError):
        storage.download_hashed(f"{s3_bucket}/missing.bin", tmp_path / "m")


def test_the_download_helper_imports_this_tfshards_not_one_in_the_working_folder(
    tmp_path, monkeypatch
):
    from tfshards import download_process

    stranger = tmp_path / "cwd" / "tfshards"
    stranger.mkdir(parents=True)
    (stranger / "__init__.py").write_text("")
    (stranger / "download_process.py").write_text("raise SystemExit(0)\n")
    monkeypatch.chdir(stranger.parent)
    monkeypatch.setattr(download_process, "_shared", None)  # a helper started here
    source = tmp_path / "object.bin"
    source.write_bytes(b"shard bytes" * 1000)
    size, digest = download_process.DownloadProcess().get(str(source), tmp_path / "copy")
    assert (size, digest) == (11000, storage.file_digests(source)["sha256"])
    assert (tmp_path / "copy").read_bytes() == source.read_bytes()
