"""A newcomer's first hour, round 2: scripts without a main guard, a safe --overwrite,
swapped folders, clean interrupts, no lock files left behind, verify on unfinished folders."""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import convert_args, shard_bytes, write_pairs
from PIL import Image

import tfshards
from tfshards import Manifest, OutputError, PairError, convert
from tfshards.cli import main
from tfshards.converters.local import stop_workers
from tfshards.converters.mask_values import MaskValuesError
from tfshards.converters.shard_job import write_shard

LOCK = ".tfshards.lock"


def test_a_script_without_the_main_guard_converts_with_workers(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 12)
    script = tmp_path / "convert_it.py"
    script.write_text(
        "import tfshards\n"
        f"m = tfshards.convert({str(images)!r}, {str(masks)!r}, 'shards', num_shards=3,\n"
        "                      workers=2, overwrite=True, progress=False)\n"
        "print(m.total_records, 'pairs')\n"
    )
    for _ in range(2):  # the second run overwrites the first
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        assert done.stdout.count("12 pairs") == 1, "workers did not rerun the script"
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [
        "tfshards.json",
        "train-00000-of-00003.tfrecord",
        "train-00001-of-00003.tfrecord",
        "train-00002-of-00003.tfrecord",
        "train.records",
    ]


def test_overwrite_builds_beside_the_old_dataset_and_a_failed_run_keeps_it(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 12)
    out = tmp_path / "out"
    convert(images, masks, out, num_shards=2, workers=1, progress=False)
    before = shard_bytes(out)

    def runner(specs, options, channels, folder, storage_options):
        assert shard_bytes(out) == before, "the old dataset is untouched while building"
        for spec in specs:
            yield write_shard(spec, options, channels, folder, None, storage_options)

    (images / "004.png").write_bytes(b"not a png")
    with pytest.raises(PairError, match="004"):
        convert(images, masks, out, overwrite=True, runner=runner, seed=3, progress=False)
    assert shard_bytes(out) == before and tfshards.verify(out).ok
    assert not (out / LOCK).exists()

    manifest = convert(
        images, masks, out, overwrite=True, on_error="skip", runner=runner, seed=3, progress=False
    )
    assert manifest.total_records == 11 and Manifest.load(out) == manifest
    assert shard_bytes(out) != before and tfshards.verify(out).ok
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def photo_masks(root: Path) -> tuple[Path, Path]:
    """Pairs whose folders were swapped: the 'masks' are grayscale photos."""
    images, masks = write_pairs(root, 6, channels=1)
    for path in masks.iterdir():
        noise = np.random.default_rng(len(path.name)).integers(0, 256, (24, 32), dtype=np.uint8)
        Image.fromarray(noise).save(path)
    return masks, images  # swapped on purpose


@pytest.mark.parametrize("extra", [[], ["--binary-masks"]])
def test_swapped_images_and_masks_stop_before_writing(tmp_path, capsys, extra):
    masks, images = photo_masks(tmp_path / "data")
    out = tmp_path / "out"
    assert main([*convert_args(images, masks, out), *extra]) == 1
    error = capsys.readouterr().err
    assert "look like images" in error and "swapped" in error, error
    assert "--mask-map" not in error.split("swapped")[0], "no option the user did not give"
    assert not out.exists()


def test_num_classes_or_mask_map_silence_the_swap_check(tmp_path):
    masks, images = photo_masks(tmp_path / "data")
    with pytest.raises(MaskValuesError, match="swapped"):
        convert(images, masks, tmp_path / "a", workers=1, progress=False)
    convert(images, masks, tmp_path / "b", num_classes=256, workers=1, progress=False)
    identity = tuple((v, v) for v in range(256))
    convert(images, masks, tmp_path / "c", mask_map=identity, workers=1, progress=False)


def test_no_lock_file_is_left_by_any_refused_or_failed_run(tmp_path, capsys, monkeypatch):
    images, masks = write_pairs(tmp_path / "data", 6)
    out = tmp_path / "out"
    assert main(convert_args(images, masks, out)) == 0
    capsys.readouterr()
    refusals = [
        (convert_args(images, masks, out), "holds a complete dataset"),
        ([*convert_args(images, masks, out), "--resume", "--seed", "4"], "other inputs"),
    ]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    refusals.append((convert_args(images, masks, foreign), "holds no tfshards conversion"))
    for args, message in refusals:
        assert main(args) == 1
        error = capsys.readouterr().err
        assert message in error
        assert "--resume" not in error or "--resume" in args
        assert not (Path(args[-1]) / LOCK).exists(), args
    monkeypatch.chdir(foreign)  # --out . in a folder of other files
    assert main(["-q", "convert", "--images", str(images), "--masks", str(masks), "--out", "."])
    assert "holds no tfshards conversion" in capsys.readouterr().err
    assert not (foreign / LOCK).exists()
    (images / "002.png").write_bytes(b"broken")  # a failed run
    assert main(convert_args(images, masks, tmp_path / "failed")) == 1
    assert "002" in capsys.readouterr().err and not (tmp_path / "failed" / LOCK).exists()
    with open(out / LOCK, "a") as held:  # a refused run never removes another run's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(OutputError, match="another tfshards convert"):
            convert(images, masks, out, overwrite=True, progress=False)
        assert (out / LOCK).exists()


def test_verify_on_an_unfinished_or_empty_folder_is_one_line(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 6)
    unfinished = tmp_path / "unfinished"
    (unfinished / ".tfshards-work" / "done").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    for folder in (unfinished, tmp_path / "empty", tmp_path / "missing"):
        assert main(["verify", str(folder)]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1
        if folder.name == "missing":
            assert lines[0].endswith("missing: no such folder")
            continue
        assert "no manifest" in lines[0] and "not a finished dataset" in err
        assert "--resume" in err


def _start_in_own_group(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [*command, "--workers", "2", "--num-shards", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _interrupted(images: Path, masks: Path, out: Path, when: str) -> subprocess.CompletedProcess:
    """Run the CLI in its own process group and Ctrl-C the whole group (as a terminal does)."""
    # -X faulthandler (inherited by the workers): a hang is shown with every thread's stack.
    command = [sys.executable, "-X", "faulthandler", "-m", "tfshards.cli"]
    command += convert_args(images, masks, out)[1:]
    # A test run started in the background (`cmd &`, nohup) ignores SIGINT, and an ignored
    # signal stays ignored in the children: give the CLI Ctrl-C as a terminal would.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = _start_in_own_group(command)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    work = out / ".tfshards-work"
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        if work.is_dir() and (when != "a shard done" or any((work / "done").glob("*.json"))):
            break
        time.sleep(0.002)
    if when == "workers importing":
        time.sleep(0.3)
    os.killpg(process.pid, signal.SIGINT)
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(_hung(process))
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _hung(process: subprocess.Popen) -> str:
    """What a hung interrupted conversion was doing: the processes of its group still
    running, then each one's threads (SIGABRT makes faulthandler print them)."""
    group = subprocess.run(
        ["ps", "-o", "pid,ppid,stat,wchan:20,args", "-g", str(process.pid)],
        capture_output=True,
        text=True,
    ).stdout
    os.killpg(process.pid, signal.SIGABRT)
    try:
        _, stderr = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
    return f"the interrupted conversion did not end within 60 s\n{group}\n{stderr}"


@pytest.mark.parametrize("when", ["workers starting", "workers importing", "a shard done"])
def test_ctrl_c_prints_one_line_saying_how_to_finish(tmp_path, when):
    images, masks = write_pairs(tmp_path / "data", 160, size=(96, 96))
    out = tmp_path / "out"
    done = _interrupted(images, masks, out, when)
    assert done.returncode == 130, f"finished before the interrupt: {done.stderr}"
    bar = re.compile(r"\[\d+:\d+")  # progress bars (tqdm's elapsed time), not messages
    lines = [x for x in done.stderr.splitlines() if x.strip() and not bar.search(x)]
    assert lines == [
        "tfshards convert: interrupted; rerun the same command, or add --resume, to finish"
    ]
    assert not (out / LOCK).exists() and not (out / "tfshards.json").exists()
    assert main([*convert_args(images, masks, out), "--workers", "2", "--num-shards", "8"]) == 0
    assert tfshards.verify(out).ok


READ_SCRIPT = """
import tfshards
for cache in (None, True, True):
    for image, mask in tfshards.read("out", batch_size=4, cache=cache):
        pass
for cache in (None, True, True):  # records of two sizes, read one at a time (framed cache)
    for image, mask in tfshards.read("mixed", batch_size=1, cache=cache):
        pass
print("read")
"""


def test_reading_in_a_script_logs_nothing_caused_by_tfshards_settings(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 8)
    convert(images, masks, tmp_path / "out", workers=1, progress=False)
    for key in ("000", "001"):  # two pairs of another size
        for folder in (images, masks):
            path = folder / f"{key}.png"
            Image.open(path).resize((16, 12), Image.Resampling.NEAREST).save(path)
    convert(images, masks, tmp_path / "mixed", workers=1, progress=False)
    done = subprocess.run(
        [sys.executable, "-c", READ_SCRIPT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("TF_")},
    )
    assert done.returncode == 0 and done.stdout.strip() == "read", done.stderr[-3000:]
    # TensorFlow 2.21 logs one INFO line on the first TFRecord file any process reads
    # ("`buffer_size` is unspecified"); a buffer set by tfshards made it blame the user.
    assert "overridden by the user specified" not in done.stderr


def test_small_things(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 6)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:  # a typo is not taken as an abbreviation
        main([*convert_args(images, masks, out), "--binary-mask"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --binary-mask" in capsys.readouterr().err
    assert main(convert_args(images, masks, out)) == 0
    capsys.readouterr()
    assert main([*convert_args(images, masks, out), "--resume"]) == 0
    said = capsys.readouterr().out
    assert "is already complete: nothing to do" in said and "pairs/s" not in said
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    index_help = help_text.split("--index write", 1)[1].split("--tfds-metadata", 1)[0]
    assert "cannot inflate the default deflate" in index_help
    assert all(name in index_help for name in ("raw", "png", "keep"))


def test_demo_names_no_folder_it_deleted():
    from tfshards.demo import run_demo

    summary = run_demo(count=8, size=16, progress=False)
    assert "tfshards-demo-" not in summary, summary
    assert "now deleted" in summary and "cache: in the temporary folder" in summary


def test_a_misspelled_option_gets_the_commands_usage_and_the_nearest_option(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 2)
    start = [*convert_args(images, masks, tmp_path / "out")][1:]  # without -q
    cases = {
        ("--val-fration", "0.1"): "did you mean --val-fraction?",
        ("--binary-mask", "--val-fration=0.1"): "did you mean --binary-masks and --val-fraction?",
        ("-q",): "put -q first: tfshards -q convert ...",
        ("--zzz",): "unrecognized arguments: --zzz\n",
    }
    for typo, said in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            main([*start, *typo])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2
        assert err.startswith("usage: tfshards convert [-h] --images IMAGES"), err
        assert f"tfshards convert: error: unrecognized arguments: {' '.join(typo)}" in err
        assert said in err
    assert not (tmp_path / "out").exists()


def test_a_dataset_path_that_does_not_exist_is_said_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a dataset")
    (tmp_path / "unfinished").mkdir()
    said = {
        "nowhere/": "nowhere/?\\)?: no such folder$",  # Pairs names the absolute path
        "notes.txt": "notes.txt( .*)?: a file, not a dataset folder$",
        "unfinished": "no manifest .*rerun the conversion",
    }
    for path, message in said.items():
        for open_it in (tfshards.info, tfshards.Pairs, tfshards.read):
            with pytest.raises(tfshards.ManifestError, match=message):
                open_it(path)
        assert main(["inspect", path]) == 1
        assert re.search(message, capsys.readouterr().err.strip())
    missing = f"nowhere ({tmp_path / 'nowhere'}): no such folder"
    assert tfshards.verify("nowhere").problems == [missing]


def test_refusals_name_the_options_as_the_caller_writes_them(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 6)
    out, other = tmp_path / "out", tmp_path / "other"
    convert(images, masks, out, workers=1, progress=False)
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    said = {  # folder: (what Python's convert says, what the command says)
        out: (
            "holds a complete dataset (tfshards.json); pass overwrite=True to replace it, "
            "or another out folder",
            "holds a complete dataset (tfshards.json); pass --overwrite to replace it, "
            "or another --out folder",
        ),
        other: (
            "choose an empty or new out folder, or pass overwrite=True to write",
            "choose an empty or new --out folder, or pass --overwrite to write",
        ),
    }
    for folder, (python, command) in said.items():
        with pytest.raises(OutputError) as refused:
            convert(images, masks, folder, workers=1, progress=False)
        assert python in str(refused.value) and "--" not in str(refused.value)
        assert main(convert_args(images, masks, folder)) == 1
        assert command in " ".join(capsys.readouterr().err.split())


def test_bench_leaves_out_the_disk_caches_lines_at_every_point(tmp_path, caplog):
    images, masks = write_pairs(tmp_path / "data", 8, size=(8, 8))
    grid = ["--shards", "1,2", "--encodings", "raw", "--compression", "none"]
    grid += ["--cycle-lengths", "1", "--repeats", "1", "--report", str(tmp_path / "report")]
    with caplog.at_level(logging.INFO, logger="tfshards"):
        assert main(["-q", "bench", "--images", str(images), "--masks", str(masks), *grid]) == 0
        assert "disk cache" not in caplog.text
        out = tmp_path / "shards"
        convert(images, masks, out, workers=1, progress=False, val_fraction=0.0)
        for _ in tfshards.read(out, batch_size=4, cache=True):  # outside bench: said again
            pass
    assert "building the disk cache" in caplog.text and "disk cache ready" in caplog.text


def test_an_interrupt_inside_a_bars_constructor_leaves_nothing_to_fail_on():
    """Ctrl-C while tqdm builds a bar leaves an instance registered without its position
    (seen in CI: the interrupt's message became an AttributeError and exit 1)."""
    from tqdm import tqdm

    from tfshards.cli import _end_progress_bars

    class HalfBuilt(tqdm):
        def __init__(self) -> None:  # registered, then interrupted before ``pos`` is set
            self.disable = False
            self._instances.add(self)

    bar = HalfBuilt()
    try:
        _end_progress_bars()
    finally:
        tqdm._instances.discard(bar)
        bar.disable = True  # its __del__ closes it: nothing to close


def _sleep_in_worker(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_stopping_the_workers_leaves_no_pool_thread_behind():
    """An interrupted conversion stops its pool; a pool thread still running at exit
    races the interpreter's own shutdown of it (CPython's `_python_exit` then writes to a
    closed pipe and prints a traceback under the one-line message)."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(2, mp_context=context)
    futures = [pool.submit(_sleep_in_worker, 30) for _ in range(4)]
    while not any(f.running() for f in futures):
        time.sleep(0.01)
    stop_workers(pool)
    assert [t.name for t in threading.enumerate() if "Executor" in type(t).__name__] == []
    assert all(f.done() for f in futures)
