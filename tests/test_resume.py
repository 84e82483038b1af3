"""Exact mid-epoch resume: start anywhere bit for bit, SIGKILL and rerun, refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import mixed_sizes, write_pairs

import tfshards
from tfshards.readers.resume import ResumeError

SCRIPT = Path(__file__).with_name("resume_training.py")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume")
    images, masks = write_pairs(root / "data", count=50, size=(16, 16))
    out = root / "shards"
    tfshards.convert(images, masks, out, options=tfshards.ConvertOptions(num_shards=3))
    return out


def _batches(ds, count=None) -> list[bytes]:
    out = []
    for images, masks in ds:
        out.append(images.numpy().tobytes() + masks.numpy().tobytes())
        if count is not None and len(out) == count:
            break
    return out


@pytest.mark.parametrize("cache", [None, "memory", "disk"])
def test_start_at_any_position_is_bit_for_bit(dataset, tmp_path, cache):
    cache = tmp_path / "c" if cache == "disk" else cache
    options = dict(batch_size=4, seed=5, image_dtype="uint8", cache=cache)
    ds = tfshards.read(dataset, **options)
    epochs = [_batches(ds) for _ in range(5)]
    stream = [b for epoch in epochs for b in epoch]
    per_epoch = len(epochs[0])
    assert per_epoch == 13 and int(ds.cardinality()) == 13
    # A batch, the last of an epoch, the first of the next, and the very last.
    for epoch, batch in [(0, 5), (0, 12), (1, 0), (2, 12)]:
        resumed = tfshards.read(dataset, **options, start=(epoch, batch))
        got = _batches(resumed) + _batches(resumed)
        at = epoch * per_epoch + batch
        assert got == stream[at : at + 2 * per_epoch]  # two iterations: 26 batches on


def test_an_epoch_is_the_same_in_another_process(dataset):
    code = (
        "import sys, hashlib, tfshards\n"
        f"ds = tfshards.read({str(dataset)!r}, batch_size=4, seed=5, image_dtype='uint8',"
        " start=(4, 0))\n"
        "print(hashlib.sha1(b''.join(i.numpy().tobytes() for i, m in ds)).hexdigest())\n"
    )
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    ds = tfshards.read(dataset, batch_size=4, seed=5, image_dtype="uint8")
    import hashlib

    for _ in range(4):
        _batches(ds)
    here = hashlib.sha1(b"".join(i.numpy().tobytes() for i, _ in ds)).hexdigest()
    assert runs[0].stdout.strip() == runs[1].stdout.strip() == here


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    return mixed_sizes(tmp_path_factory.mktemp("mixed"))


SIZED = {
    "crop": dict(batch_size=4, crop_size=(16, 16)),
    "crop_scale": dict(
        batch_size=4, crop_size=(16, 16), options=tfshards.ReadOptions(crop_scale=(0.5, 1.5))
    ),
    "pad": dict(batch_size=4, pad_to=(40, 48)),
    "native": dict(batch_size=1),
}


@pytest.mark.parametrize("cache", [None, "memory", "disk"])
@pytest.mark.parametrize("sizing", SIZED)
def test_crops_pads_and_native_sizes_start_anywhere_bit_for_bit(mixed, tmp_path, sizing, cache):
    """Records of many sizes, cropped (and scaled), padded or at their own size in
    batches of one: a read started at (epoch, batch) delivers the uninterrupted read's
    batches from there, crops included; with a cache, from the cache its first epoch
    built (whole records, each at its own size), the same pixels."""
    cache = tmp_path / "c" if cache == "disk" else cache
    options = dict(seed=3, image_dtype="uint8", cache=cache, **SIZED[sizing])
    ds = tfshards.read(mixed, **options)
    per_epoch = int(ds.cardinality())
    stream = [b for _ in range(3) for b in _batches(ds)]
    assert len(set(stream[:per_epoch])) == per_epoch
    if sizing.startswith("crop"):
        assert stream[:per_epoch] != stream[per_epoch : 2 * per_epoch], "new crops each epoch"
    for epoch, batch in [(0, 1), (1, 0), (1, per_epoch - 1)]:
        resumed = tfshards.read(mixed, **options, start=(epoch, batch))
        at = epoch * per_epoch + batch
        assert _batches(resumed) == stream[at : at + per_epoch]
    if cache is not None and cache != "memory":
        assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]


@pytest.fixture(scope="module")
def png_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("png")
    images, masks = write_pairs(root / "data", count=30, size=(16, 16))
    out = root / "shards"
    tfshards.convert(images, masks, out, options=tfshards.ConvertOptions(encoding="keep"))
    return out


@pytest.mark.parametrize("encoding", ["default", "png"])
@pytest.mark.parametrize("cache", [None, "memory", "disk"])
def test_crops_of_fixed_size_records_resume_with_each_cache(
    dataset, png_dataset, tmp_path, cache, encoding
):
    """The cache holds whole records; crops cut from them resume exactly, from a cache
    being built (first read) and from a ready one (the resumed reads); records decoded
    by the reader (default) or by TensorFlow (PNG)."""
    dataset = png_dataset if encoding == "png" else dataset
    cache = tmp_path / "c" if cache == "disk" else cache
    options = dict(batch_size=4, seed=5, image_dtype="uint8", cache=cache, crop_size=(9, 7))
    ds = tfshards.read(dataset, **options)
    stream = [b for _ in range(2) for b in _batches(ds)]
    per_epoch = len(stream) // 2
    for epoch, batch in [(0, 3), (1, 0)]:
        resumed = tfshards.read(dataset, **options, start=(epoch, batch))
        at = epoch * per_epoch + batch
        assert _batches(resumed, count=per_epoch - batch) == stream[at : at + per_epoch - batch]


def test_crops_are_the_same_in_another_process(mixed):
    """Crop positions and scales come from (seed, epoch, batch, position), not from a
    generator of the process: another process draws the same ones."""
    code = (
        "import hashlib, tfshards\n"
        f"ds = tfshards.read({str(mixed)!r}, batch_size=4, seed=9, image_dtype='uint8',"
        " crop_size=(16, 16), options=tfshards.ReadOptions(crop_scale=(0.5, 1.5)),"
        " start=(2, 1))\n"
        "print(hashlib.sha1(b''.join(i.numpy().tobytes() for i, m in ds)).hexdigest())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import hashlib

    ds = tfshards.read(
        mixed, batch_size=4, seed=9, image_dtype="uint8", crop_size=(16, 16),
        options=tfshards.ReadOptions(crop_scale=(0.5, 1.5)),
    )  # fmt: skip
    stream = [i.numpy().tobytes() for _ in range(4) for i, _ in ds]
    here = hashlib.sha1(b"".join(stream[2 * 3 + 1 : 3 * 3 + 1])).hexdigest()
    assert run.stdout.strip() == here


def _train(dataset, backup, log, cache, kill_at, repeat=False, **env) -> int:
    return _run_training(dataset, backup, log, cache, kill_at, repeat, **env).returncode


def _run_training(dataset, backup, log, cache, kill_at, repeat=False, **env):
    args = [sys.executable, str(SCRIPT), str(dataset), str(backup), str(log), cache, str(kill_at)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env)
    run = subprocess.run(
        args + (["repeat"] if repeat else []), capture_output=True, text=True, env=env
    )
    if run.returncode not in (0, -9):
        raise AssertionError(run.stderr[-3000:])
    return run


def _effective(log: Path) -> tuple[list[str], str]:
    """Batches whose updates survived: each killed run's up to its last backup."""
    runs, current = [], []
    for line in log.read_text().splitlines():
        if line.startswith("WEIGHTS"):
            return [b for run in runs for b in run] + current, line
        if line == "SAVE":
            runs.append(current)
            current = []
        elif line == "KILLED":
            current = []
        else:
            current.append(line)
    raise AssertionError("the last run did not finish")


@pytest.mark.parametrize(
    "cache,repeat", [("none", False), ("disk", False), ("none", True)], ids=str
)
def test_sigkill_twice_then_rerun_trains_the_uninterrupted_batches(
    dataset, tmp_path, cache, repeat, uninterrupted
):
    cache_arg = str(tmp_path / "cache") if cache == "disk" else cache
    full_log = uninterrupted if (cache, repeat) == ("none", False) else None
    _killed_twice_and_rerun(dataset, tmp_path, cache_arg, repeat, full_log)


def test_sigkill_twice_then_rerun_from_a_bucket(
    dataset, tmp_path, s3_bucket, monkeypatch, uninterrupted
):
    from s3_server import upload_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # a cold shard cache
    url = f"{s3_bucket}/resume"
    upload_folder(dataset, url)
    _killed_twice_and_rerun(url, tmp_path, "none", False, uninterrupted)  # the same batches


@pytest.fixture(scope="module")
def uninterrupted(dataset, tmp_path_factory) -> Path:
    """The log of resume_training.py run to its end, streamed, repeat=False."""
    root = tmp_path_factory.mktemp("uninterrupted")
    _train(dataset, root / "backup", root / "full.log", "none", 0)
    return root / "full.log"


def test_a_kill_between_the_weights_and_the_state_resumes_the_uninterrupted_run(
    dataset, tmp_path, uninterrupted
):
    """The weights of a backup are written before the state that names them: a kill in
    between (in the first backup, then in the rerun's third) leaves the previous backup
    whole, never new weights with an old position."""
    log, backup = tmp_path / "killed.log", tmp_path / "backup"
    for save in ("1", "3"):
        assert _train(dataset, backup, log, "none", 0, KILL_IN_SAVE=save) == -9
        with open(log, "a") as out:
            out.write("KILLED\n")
    rerun = _run_training(dataset, backup, log, "none", 0)
    full, full_weights = _effective(uninterrupted)
    resumed, resumed_weights = _effective(log)
    assert resumed == full
    assert resumed_weights == full_weights
    assert "resuming from" in rerun.stderr and "tfshards_state.json" in rerun.stderr
    assert "ran out of data" not in rerun.stderr  # the shortened epoch ends quietly
    current = json.loads((backup / "tfshards_state.json").read_text())["current"]
    assert {p.name for p in backup.iterdir()} == {current["weights"], "tfshards_state.json"}


def _killed_twice_and_rerun(
    dataset, tmp_path: Path, cache_arg: str, repeat: bool, full_log: Path | None = None
) -> None:
    if full_log is None:
        full_log = tmp_path / "full.log"
        _train(dataset, tmp_path / "b0", full_log, cache_arg, 0, repeat)
    log = tmp_path / "killed.log"
    for kill_at in (17, 11):  # the first kill in epoch 1, the second in the rerun's epoch 2
        assert _train(dataset, tmp_path / "b1", log, cache_arg, kill_at, repeat) == -9
        with open(log, "a") as out:
            out.write("KILLED\n")
        state = (tmp_path / "b1" / "tfshards_state.json").read_bytes()
        assert len(state) < 1024
    assert _train(dataset, tmp_path / "b1", log, cache_arg, 0, repeat) == 0
    full, full_weights = _effective(full_log)
    resumed, resumed_weights = _effective(log)
    assert resumed == full
    assert resumed_weights == full_weights


def test_bad_states_are_refused(dataset, tmp_path):
    ds = tfshards.read(dataset, batch_size=4, seed=5)
    from tfshards.readers.resume import state_at

    reader = ds._tfshards_reader
    state = state_at(reader.identity, reader.schedule, 7)
    assert len(state.to_json()) < 1024
    assert _batches(tfshards.read(dataset, batch_size=4, seed=5, start=state), 1) == _batches(
        tfshards.read(dataset, batch_size=4, seed=5, start=(0, 7)), 1
    )
    for change, message in [
        (dict(seed=6), "seed=5 but this read has seed=6"),
        (dict(batch_size=5), "not a whole number of steps"),
        (dict(split="val"), "split='train' but this read has split='val'"),
        (dict(shuffle=False), "shuffle=True but this read has shuffle=False"),
    ]:
        options = dict(batch_size=4, seed=5) | change
        if change.get("split") == "val":
            with pytest.raises(Exception, match="no split|split="):
                tfshards.read(dataset, **options, start=state)
            continue
        with pytest.raises(ResumeError, match=message):
            tfshards.read(dataset, **options, start=state)
    other = tmp_path / "other"
    images, masks = write_pairs(tmp_path / "odata", count=50, size=(16, 16), seed=1)
    tfshards.convert(images, masks, other, options=tfshards.ConvertOptions(num_shards=3))
    with pytest.raises(ResumeError, match="dataset="):
        tfshards.read(other, batch_size=4, seed=5, start=state)
    path = tmp_path / "state.json"
    state.save(path)
    path.write_text(path.read_text()[:-9])
    with pytest.raises(ResumeError, match="damaged"):
        tfshards.ReadState.load(path)
    with pytest.raises(tfshards.OptionsError, match=r"0 <= batch < 13"):
        tfshards.read(dataset, batch_size=4, seed=5, start=(0, 13))


class _Interrupt(keras.callbacks.Callback):
    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.steps = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.at:
            raise RuntimeError("interrupted")


class _Steps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append([epoch, 0])

    def on_train_batch_end(self, batch, logs=None):
        self.epochs[-1][1] += 1


def _fit(
    dataset, backup: Path, batch_size: int = 4, interrupt_at: int = 0, **options
) -> list[list[int]]:
    """A tiny fit of 2 epochs with ResumeCallback saving every 4 steps (or ``options``);
    ``interrupt_at``: stopped there (its backups stay). [Keras epoch, steps run] of each
    epoch run."""
    train = tfshards.read(dataset, batch_size=batch_size, seed=5)
    inputs = keras.Input(train.element_spec[0].shape[1:])
    model = keras.Model(inputs, keras.layers.Conv2D(3, 1)(inputs))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    options = dict(save_freq=4, delete_checkpoint=False) | options
    steps = _Steps()
    callbacks = [tfshards.ResumeCallback(backup, train, **options), steps]
    if interrupt_at:
        callbacks.append(_Interrupt(interrupt_at))
    model.fit(train, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    return steps.epochs


@pytest.fixture(scope="module")
def backed_up(dataset, tmp_path_factory) -> Path:
    """A backup folder after 6 steps of batch 4, the last backup after step 4."""
    backup = tmp_path_factory.mktemp("backed_up") / "backup"
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(dataset, backup, interrupt_at=6)
    return backup


def test_another_batch_size_is_refused_by_the_callback(dataset, backed_up, tmp_path):
    """16 records done: a batch of 8 divides them, but Keras's step count in the state is
    in batches of 4 (it cut the resumed epoch short by half before)."""
    backup = tmp_path / "backup"
    shutil.copytree(backed_up, backup)
    with pytest.raises(ResumeError, match=r"tfshards_state.json: .*round_records=4.* has 8"):
        _fit(dataset, backup, batch_size=8)


def _edited(body: dict, field: str, value) -> dict:
    body = json.loads(json.dumps(body))
    *path, last = field.split(".")
    inner = body
    for key in path:
        inner = inner[key]
    inner[last] = value
    return body


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("current.read.epoch", 1, "read.epoch=1 .* data step 17, but keras_epoch=0"),
        ("current.read.records_done", 0, "read.records_done=0 are data step 0"),
        ("current.keras_steps", 100, "keras_steps=100, more than the 13 steps"),
        ("current.keras_steps", -4, "current: keras_steps=-4 is not a whole number"),
        ("current.keras_steps", 4.0, "current: keras_steps=4.0 is not a whole number"),
        ("current.keras_epoch", 1, "keras_epoch=1 and keras_steps=4 are data step 17"),
        ("current.read.records_done", -16, "records_done=-16 is below 0"),
        ("current.read.seed", 6, "seed=6 but this read has seed=5"),
        ("current.weights", "../x.weights.h5", "weights='../x.weights.h5' is not a file"),
        ("current.weights", "step-8.weights.h5", "are not those of data step 4"),
        ("version", 99, "version=99, this tfshards reads version 2"),
        ("version", True, "version=True"),
    ],
)
def test_an_edited_callback_state_is_refused(dataset, backed_up, tmp_path, field, value, message):
    backup = tmp_path / "backup"
    shutil.copytree(backed_up, backup)
    state = backup / "tfshards_state.json"
    state.write_text(json.dumps(_edited(json.loads(state.read_text()), field, value)))
    with pytest.raises(ResumeError, match=f"tfshards_state.json: .*{message}"):
        _fit(dataset, backup)


@pytest.mark.parametrize(
    "damage", [lambda text: text[: len(text) // 2], lambda _: "not json", lambda _: "[1]"]
)
def test_a_damaged_callback_state_is_refused(dataset, backed_up, tmp_path, damage):
    backup = tmp_path / "backup"
    shutil.copytree(backed_up, backup)
    state = backup / "tfshards_state.json"
    state.write_text(damage(state.read_text()))
    with pytest.raises(ResumeError, match="tfshards_state.json: (cannot be read|version=None)"):
        _fit(dataset, backup)


def test_a_backup_after_an_epoch_last_step_resumes_at_the_next_epoch(dataset, tmp_path, caplog):
    """Saved after step 13 of 13, killed before the epoch's end: the next epoch, whole."""
    backup = tmp_path / "backup"
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(dataset, backup, interrupt_at=13, save_freq=13)
    assert _fit(dataset, backup) == [[1, 13]]
    assert "Epoch 2 after 0 of its steps (start=(1, 0) in the read)" in caplog.text


def test_double_checkpoint_falls_back_to_the_previous_backup(dataset, tmp_path, caplog):
    backup = tmp_path / "backup"
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(dataset, backup, interrupt_at=10, double_checkpoint=True)
    assert sorted(p.name for p in backup.glob("*.h5")) == [
        "step-4.weights.h5",
        "step-8.weights.h5",
    ]
    (backup / "step-8.weights.h5").write_bytes(b"damaged")
    assert _fit(dataset, backup, double_checkpoint=True) == [[0, 9], [1, 13]]
    assert "Epoch 1 after 4 of its steps (start=(0, 4) in the read)" in caplog.text


def test_missing_weights_are_refused(dataset, backed_up, tmp_path):
    backup = tmp_path / "backup"
    shutil.copytree(backed_up, backup)
    (backup / "step-4.weights.h5").unlink()
    with pytest.raises(ResumeError, match=r"cannot load the backed-up weights: .*step-4.weights"):
        _fit(dataset, backup)


def test_keras_own_backup_is_refused(dataset, tmp_path):
    """keras.callbacks.BackupAndRestore's files say nothing of the data's position."""
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / "training_metadata.json").write_text('{"epoch": 0, "batch": 3}')
    with pytest.raises(ResumeError, match="training_metadata.json but no tfshards_state.json"):
        _fit(dataset, backup)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("records_done", -1, "records_done=-1 is below 0"),
        ("records_done", 51, "records_done=51 is more than the 50 records"),
        ("epoch", -1, "epoch=-1 is below 0"),
        ("epoch", 1.0, "epoch=1.0 is not a whole number"),
        ("records_done", True, "records_done=True is not a whole number"),
        ("shuffle", 1, "shuffle=1 is not a bool"),
        ("round_records", 0, "round_records=0 is below 1"),
        ("version", 99, "version=99, this tfshards reads version 1"),
    ],
)
def test_a_read_state_out_of_range_is_refused(dataset, field, value, message):
    reader = tfshards.read(dataset, batch_size=4, seed=5)._tfshards_reader
    from tfshards.readers.resume import state_at

    good = json.loads(state_at(reader.identity, reader.schedule, 3).to_json())
    with pytest.raises(ResumeError, match=f"ReadState: {message}"):
        tfshards.ReadState(**(good | {field: value}))
    with pytest.raises(ResumeError, match=f"state.json: ReadState: {message}"):
        tfshards.ReadState.from_json(json.dumps(good | {field: value}), "state.json")


def test_pipelines_get_equal_batches_and_the_global_order_is_elastic(dataset):
    whole = _batches(tfshards.read(dataset, batch_size=12, seed=5, image_dtype="uint8"))
    import tensorflow as tf

    parts = []
    for pipeline in range(3):
        context = tf.distribute.InputContext(3, pipeline, 3)
        ds = tfshards.read(
            dataset, batch_size=12, seed=5, image_dtype="uint8", input_context=context
        )
        parts.append(_batches(ds))
    assert [len(p) for p in parts] == [4, 4, 4]  # 50 records: 4 whole rounds of 12
    image_bytes = 16 * 16 * 3
    for round_index in range(4):
        pipelines = [np.frombuffer(parts[p][round_index], np.uint8) for p in range(3)]
        images = np.concatenate([p[: 4 * image_bytes] for p in pipelines])
        assert (
            images.tobytes()
            == np.frombuffer(whole[round_index], np.uint8)[: 12 * image_bytes].tobytes()
        )


def test_resume_needs_the_ordered_reader(dataset):
    import tensorflow as tf

    dispatcher = tf.data.experimental.service.DispatchServer()
    with pytest.raises(tfshards.OptionsError, match="start= needs a read by index"):
        tfshards.read(dataset, batch_size=4, seed=5, service=dispatcher.target, start=(0, 1))
    with pytest.raises(ResumeError, match="needs the dataset returned by tfshards.read"):
        tfshards.ResumeCallback("b", tfshards.read(dataset, batch_size=4).map(lambda a, b: a))


def test_state_json_round_trip(dataset):
    ds = tfshards.read(dataset, batch_size=4, seed=5)
    from tfshards.readers.resume import state_at

    state = state_at(ds._tfshards_reader.identity, ds._tfshards_reader.schedule, 20)
    assert (state.epoch, state.records_done) == (1, 28)
    assert tfshards.ReadState.from_json(state.to_json()) == state
    assert json.loads(state.to_json())["seed"] == 5


AUGMENT = """
import hashlib, sys, keras, tfshards
layer = keras.layers.Pipeline(
    [keras.layers.RandomFlip("horizontal", seed=1), keras.layers.RandomRotation(0.2, seed=2)]
)
path, start, skip = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = None if start == "-" else tuple(int(v) for v in start.split(","))
ds = tfshards.read(path, batch_size=4, seed=3, augment=layer, start=start, repeat=True)
for image, mask in ds.skip(skip).take(4):
    print(hashlib.sha1(image.numpy().tobytes() + mask.numpy().tobytes()).hexdigest())
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_augmented_batches_resume_exactly(dataset, backend):
    def run(start: str, skip: int) -> list[str]:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        args = [sys.executable, "-c", AUGMENT, str(dataset), start, str(skip)]
        out = subprocess.run(args, capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()

    per_epoch = int(tfshards.read(dataset, batch_size=4, seed=3).cardinality())
    uninterrupted = run("-", per_epoch + 2)  # epoch 1 from batch 2, reached by reading
    assert len(uninterrupted) == 4 and uninterrupted == run("-", per_epoch + 2)
    assert run("1,2", 0) == uninterrupted, "started there: the same augmented batches"


def test_a_state_resumes_on_another_number_of_pipelines(dataset):
    """Elastic: the same global batch on 3 pipelines continues the 1-pipeline sequence;
    a global batch that does not divide the position is refused, naming both."""
    import tensorflow as tf

    from tfshards.readers.resume import state_at

    one = tfshards.read(dataset, batch_size=12, seed=5, image_dtype="uint8")
    reader = one._tfshards_reader
    state = state_at(reader.identity, reader.schedule, 2)  # 24 records of epoch 0 done
    expected = np.frombuffer(_batches(one)[2], np.uint8)
    image_bytes = 16 * 16 * 3
    slices = []
    for pipeline in range(3):
        context = tf.distribute.InputContext(3, pipeline, 3)
        ds = tfshards.read(
            dataset, batch_size=12, seed=5, image_dtype="uint8", input_context=context,
            start=state,
        )  # fmt: skip
        slices.append(np.frombuffer(_batches(ds, 1)[0], np.uint8)[: 4 * image_bytes])
    assert np.concatenate(slices).tobytes() == expected[: 12 * image_bytes].tobytes()
    context = tf.distribute.InputContext(2, 0, 2)
    with pytest.raises(ResumeError, match=r"2 pipelines x batch 5.*saved with 12 records"):
        tfshards.read(dataset, batch_size=10, seed=5, input_context=context, start=state)


EXIT_MID_EPOCH = """
import sys, tfshards
cache = None if sys.argv[2] == "none" else sys.argv[2]
iterator = iter(tfshards.read(sys.argv[1], batch_size=4, seed=0, cache=cache))
next(iterator)
print("left mid-epoch", flush=True)
"""


@pytest.mark.parametrize("cache", ["none", "disk"])
def test_a_script_that_ends_mid_epoch_exits(dataset, tmp_path, cache):
    """Python on tf.data's threads must not hang the interpreter's exit (it did in about
    1 exit in 3 with an iterator left mid-epoch)."""
    cache_arg = str(tmp_path / "cache") if cache == "disk" else cache
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for _ in range(4):
        run = subprocess.run(
            [sys.executable, "-c", EXIT_MID_EPOCH, str(dataset), cache_arg],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0 and "left mid-epoch" in run.stdout, run.stderr[-2000:]
