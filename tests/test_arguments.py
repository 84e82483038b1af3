"""Public arguments are checked at the call, with an OptionsError naming the argument: a
wrong type is never taken silently (``shuffle="no"`` shuffled) nor left to fail inside
TensorFlow's iterator or a worker in Python's words."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import convert_args, write_pairs

import tfshards
from tfshards import Manifest, OptionsError, Pairs, ReadOptions, convert, synth
from tfshards.cli import main


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("arguments")
    images, masks = write_pairs(root / "data", 20, size=(16, 20), classes=3)
    convert(images, masks, root / "shards", num_shards=2, val_fraction=0.25, num_classes=3,
            seed=1, workers=1, progress=False)  # fmt: skip
    return root / "shards"


def records(dataset: Path, split: str = "train") -> int:
    return Manifest.load(dataset).splits[split].records


def context(pipeline: int, pipelines: int, replicas: int = 1) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(pipelines, pipeline, replicas)


BAD_READ_ARGUMENTS = [
    ({"shuffle": "no"}, "shuffle must be True, False or None"),
    ({"repeat": "no"}, "repeat must be True or False"),
    ({"one_hot": "yes"}, "one_hot must be True or False"),
    ({"drop_remainder": 1}, "drop_remainder must be True or False"),
    ({"cache": "RAM "}, r"cache='RAM ' .*did you mean cache='memory'"),
    ({"cache": " shards_cache"}, r"cache=' shards_cache' .*without spaces around"),
    ({"cache": "Disk"}, r"cache='Disk' .*did you mean cache=True"),
    ({"seed": -1}, r"seed must be an integer in \[0, 2\*\*63\)"),
    ({"seed": 2**64}, r"seed must be an integer in \[0, 2\*\*63\)"),
    ({"batch_size": 10**12}, r"batch_size must be an integer in \[1, 2\*\*31\)"),
    ({"start": (2**62, 0)}, "start=.* past the last step"),
    ({"start": (1.0, 0)}, r"start must be \(epoch, batch\), integers .*got \(1.0, 0\)"),
    ({"start": (True, 0)}, r"start must be \(epoch, batch\), integers .*got \(True, 0\)"),
    ({"augment": 3}, "augment must be a Keras layer .* or a function"),
    ({"options": 3}, "options must be a tfshards.ReadOptions"),
    ({"split": 3}, "split must be a non-empty string"),
    ({"input_context": context(5, 2)}, r"input_pipeline_id must be an integer in \[0, 2\)"),
    ({"input_context": "x"}, "input_context must be a tf.distribute.InputContext"),
    ({"input_context": context(0, 1, 3)}, "batch_size=32 is the global batch, shared by 3"),
    ({"service": 3}, "service must be a dispatcher address"),
    ({"service": "localhost"}, "service='localhost' is not a dispatcher address"),
    ({"service": "grpc://localhost:99999"}, "is not a dispatcher address"),
]


@pytest.mark.parametrize(("arguments", "match"), BAD_READ_ARGUMENTS)
def test_read_refuses_bad_arguments_at_the_call(dataset, arguments, match):
    with pytest.raises(OptionsError, match=match):
        ds = tfshards.read(dataset, **arguments)
        next(iter(ds))  # before the checks, some failed only here, in TensorFlow's words


@pytest.mark.parametrize(("path", "match"), [(None, "path must be a folder"), ("", "empty")])
def test_read_and_pairs_refuse_a_missing_path(path, match):
    with pytest.raises(OptionsError, match=match):
        tfshards.read(path)
    with pytest.raises(OptionsError, match=match):
        Pairs(path)


def test_no_folder_is_made_for_a_cache_keyword(dataset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for cache in ("RAM ", "ram", "Memory", "none", "disk"):
        with pytest.raises(OptionsError, match="neither 'memory' nor a folder"):
            tfshards.read(dataset, cache=cache)
    assert list(tmp_path.iterdir()) == []


def test_numpy_values_are_taken(dataset):
    ds = tfshards.read(
        dataset, split="val", batch_size=np.int64(2), seed=np.uint32(3),
        shuffle=np.bool_(True), drop_remainder=np.bool_(True), start=(np.int32(0), np.int64(1)),
    )  # fmt: skip
    assert [len(image) for image, _ in ds] == [2] * (records(dataset, "val") // 2)
    ds = tfshards.read(dataset, split="val", batch_size=2, start=np.array([0, 1]))
    assert len(list(ds)) == -(-records(dataset, "val") // 2)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"cycle_length": 2.5}, "cycle_length must be an integer of at least 1 or None"),
        ({"cycle_length": "2"}, "cycle_length must be an integer"),
        ({"shuffle_buffer": True}, "shuffle_buffer must be an integer"),
        ({"block_length": 1.0}, "block_length must be an integer of at least 1"),
        ({"download_ahead": "4"}, "download_ahead must be an integer"),
        ({"deterministic": "yes"}, "deterministic must be True, False or None"),
        ({"crop_scale": ("a", 2)}, r"crop_scale must be \(low, high\)"),
        ({"crop_scale": 2}, r"crop_scale must be \(low, high\)"),
        ({"storage_options": "profile=x"}, "storage_options must be a dict"),
        ({"shard_cache": ""}, "shard_cache is an empty string"),
    ],
)
def test_read_options_refuse_bad_values(options, match):
    with pytest.raises(OptionsError, match=match):
        ReadOptions(**options)


# ---- batches per epoch -------------------------------------------------------------------


def test_drop_remainder_with_a_batch_larger_than_the_split_is_refused(dataset):
    train = records(dataset)
    for repeat in (False, True):  # repeated, 0 batches per epoch divided by zero
        with pytest.raises(
            OptionsError,
            match=rf"batch_size={train + 1} with drop_remainder=True gives no batch per epoch: "
            rf"the split 'train' of .* holds {train} records; pass a batch_size of at most "
            rf"{train}, or drop_remainder=False",
        ):
            tfshards.read(dataset, batch_size=train + 1, drop_remainder=True, repeat=repeat)
    whole = tfshards.read(dataset, batch_size=train, drop_remainder=True, shuffle=False)
    assert [len(image) for image, _ in whole] == [train]


def test_drop_remainder_refused_on_the_per_pair_path_too(dataset):
    train = records(dataset)
    with pytest.raises(OptionsError, match=f"holds {train} records"):
        tfshards.read(dataset, batch_size=train + 1, drop_remainder=True, crop_size=(8, 8))


def test_pipelines_that_leave_no_batch_are_refused(dataset):
    train = records(dataset)
    per_replica = train // 2 + 1  # one round of 2 pipelines is more than the split
    with pytest.raises(
        OptionsError,
        match=rf"holds {train} records, fewer than one batch of {per_replica} on each of 2 "
        rf"input pipelines \({2 * per_replica} records\)",
    ):
        tfshards.read(dataset, batch_size=2 * per_replica, input_context=context(1, 2, 2))


def test_a_batch_larger_than_the_split_is_one_short_batch(dataset):
    val = records(dataset, "val")  # before: buffers of 2**30 rows, allocated in the iterator
    ds = tfshards.read(dataset, split="val", batch_size=2**30, image_dtype="float32")
    assert [len(image) for image, _ in ds] == [val]


def test_start_past_the_epoch_is_refused(dataset):
    batches = -(-records(dataset) // 4)
    match = rf"0 <= batch < {batches} \(this read's batches per epoch\)"
    with pytest.raises(OptionsError, match=match):
        tfshards.read(dataset, batch_size=4, start=(0, batches))


# ---- tf.data service ---------------------------------------------------------------------


def test_a_service_address_with_nothing_listening_is_refused_at_once(dataset):
    with socket.socket() as probe:  # a port nothing listens on: bound, then closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for service in (f"grpc://127.0.0.1:{port}", f"127.0.0.1:{port}"):
        with pytest.raises(
            OptionsError,
            match=rf"no tf.data service dispatcher answers at 127.0.0.1:{port} "
            r"\(Connection refused",
        ):
            tfshards.read(dataset, service=service)


# ---- Pairs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"split": 3}, "split must be a non-empty string"),
        ({"with_keys": "no"}, "with_keys must be True or False"),
        ({"transform": 3}, "transform must be a function or None"),
        ({"options": {"shard_cache": "x"}}, "options must be a tfshards.ReadOptions"),
    ],
)
def test_pairs_refuses_bad_arguments(dataset, arguments, match):
    with pytest.raises(OptionsError, match=match):
        Pairs(dataset, **arguments)


@pytest.mark.parametrize("index", [1.7, "3", True, np.float64(2.0), slice(0, 2), None])
def test_pair_indices_are_integers(dataset, index):
    pairs = Pairs(dataset)
    with pytest.raises(OptionsError, match="pair index .* is not an integer") as caught:
        pairs[index]
    assert isinstance(caught.value, TypeError)  # what Python's sequences raise
    with pytest.raises(OptionsError, match="pair index .* is not an integer"):
        pairs.key(index)


def test_numpy_and_negative_pair_indices_still_work(dataset):
    pairs = Pairs(dataset, with_keys=True)
    assert pairs[np.int64(3)][2] == pairs[3][2] == pairs[-len(pairs) + 3][2]
    assert pairs[np.uint8(1)][2] == pairs.key(1)


# ---- convert and synth -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"seed": "x"}, "seed must be an integer"),
        ({"num_shards": 2.5}, "num_shards must be an integer"),
        ({"workers": 0}, "workers must be an integer of at least 1"),
        ({"overwrite": "no"}, "overwrite must be True or False"),
        ({"progress": 1}, "progress must be True or False"),
        ({"val_fraction": "0.1"}, r"val_fraction must be a number in \[0, 1\)"),
        ({"compression_level": 2.0}, "compression_level must be an integer"),
        ({"channels": 3.0}, "channels must be an integer"),
        ({"binary_masks": "yes"}, "binary_masks must be True or False"),
        ({"resize": (8, "8")}, r"resize must be \(height, width\)"),
        ({"mask_map": [(0, 0.5)]}, r"mask_map entries must be \(source, target\) integers"),
        ({"mask_map": [5]}, r"mask_map entries must be \(source, target\) integers; got 5"),
        ({"mask_map": "0:0,255:1"}, r"mask_map must be \(source, target\) pairs or a mapping"),
        ({"runner": "beam"}, "runner must be a function"),
        ({"storage_options": "profile=x"}, "storage_options must be a dict"),
    ],
)
def test_convert_refuses_bad_arguments(tmp_path, arguments, match):
    images, masks = write_pairs(tmp_path / "data", 4)
    with pytest.raises(OptionsError, match=match):
        convert(images, masks, tmp_path / "out", **{"progress": False, **arguments})
    assert not (tmp_path / "out").exists()


def test_convert_refuses_missing_paths(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 4)
    with pytest.raises(OptionsError, match="images must be a folder path or URL"):
        convert(None, masks, tmp_path / "out")
    with pytest.raises(OptionsError, match="out is an empty string"):
        convert(images, masks, "")


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"size": 0}, "size must be an integer of at least 1"),
        ({"size": (8, 0)}, r"size must be \(height, width\)"),
        ({"count": 1.5}, "count must be an integer of at least 1"),
        ({"classes": 3.0}, "classes must be an integer"),
        ({"seed": -1}, "seed must be an integer of at least 0"),
        ({"channels": True}, "channels must be an integer"),
        ({"palette_masks": "no"}, "palette_masks must be True or False"),
    ],
)
def test_synth_refuses_bad_arguments(tmp_path, arguments, match):
    with pytest.raises(OptionsError, match=match):
        synth(tmp_path / "data", **{"count": 2, "size": 8, **arguments})
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-shards", "2.5"], "argument --num-shards: invalid int value: '2.5'"),
        (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    ],
)
def test_cli_refuses_non_integers_with_argparse_message(tmp_path, capsys, flags, message):
    images, masks = write_pairs(tmp_path / "data", 4)
    with pytest.raises(SystemExit) as exit_info:
        main([*convert_args(images, masks, tmp_path / "out"), *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
