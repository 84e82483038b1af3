"""tfshards.read: the tf.data pipeline, its options, the disk cache, distribution, errors."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import MEMBRANE, mixed_sizes, read_records, write_pairs

import tfshards
from tfshards import ManifestError, OptionsError, ReadOptions, convert

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("read")
    images, masks = write_pairs(root / "data", 40, size=(16, 20), classes=3)
    convert(
        images,
        masks,
        root / "shards",
        num_shards=4,
        val_fraction=0.25,
        num_classes=3,
        seed=1,
        workers=1,
        progress=False,
    )
    return root / "shards"


def copy_dataset(dataset: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(dataset, target, ignore=shutil.ignore_patterns(".tfshards-cache"))
    return target


def digests(batches) -> list[str]:
    """One digest per (image, mask) element, in order."""
    out = []
    for images, masks in batches:
        for image, mask in zip(images.numpy(), masks.numpy(), strict=True):
            out.append(hashlib.sha1(image.tobytes() + mask.tobytes()).hexdigest())
    return out


def expected_digests(dataset: Path, split: str) -> list[str]:
    return [
        hashlib.sha1(
            r["image"].tobytes() + r["mask"].astype(np.int32)[..., None].tobytes()
        ).hexdigest()
        for r in read_records(dataset, split)
    ]


def test_batches_shapes_dtypes_and_cardinality(dataset):
    manifest = tfshards.Manifest.load(dataset)
    train = tfshards.read(dataset, split="train", batch_size=4, seed=0)
    records = manifest.splits["train"].records
    assert int(train.cardinality()) == -(-records // 4)
    image_spec, mask_spec = train.element_spec
    assert image_spec.shape.as_list() == [None, 16, 20, 3] and image_spec.dtype == tf.float32
    assert mask_spec.shape.as_list() == [None, 16, 20, 1] and mask_spec.dtype == tf.int32
    images, masks = next(iter(train))
    assert float(tf.reduce_min(images)) >= 0.0 and float(tf.reduce_max(images)) <= 1.0
    assert set(np.unique(masks.numpy())) <= {0, 1, 2}
    dropped = tfshards.read(dataset, batch_size=4, drop_remainder=True, seed=0)
    assert int(dropped.cardinality()) == records // 4
    assert sum(1 for _ in dropped) == records // 4


def test_every_record_exactly_once_per_epoch(dataset):
    train = tfshards.read(dataset, split="train", batch_size=5, image_dtype="uint8", seed=3)
    expected = sorted(expected_digests(dataset, "train"))
    first, second = digests(train), digests(train)
    assert sorted(first) == expected and sorted(second) == expected
    assert first != second, "the order is reshuffled every epoch"


def test_seed_makes_order_reproducible(dataset):
    one = digests(tfshards.read(dataset, batch_size=5, image_dtype="uint8", seed=11))
    two = digests(tfshards.read(dataset, batch_size=5, image_dtype="uint8", seed=11))
    other = digests(tfshards.read(dataset, batch_size=5, image_dtype="uint8", seed=12))
    assert one == two and one != other


def test_no_shuffle_gives_manifest_order(dataset):
    val = tfshards.read(dataset, split="val", batch_size=3, image_dtype="uint8")
    assert digests(val) == expected_digests(dataset, "val")
    train = tfshards.read(dataset, split="train", batch_size=3, image_dtype="uint8", shuffle=False)
    assert digests(train) == expected_digests(dataset, "train")


def test_image_size_resizes_masks_with_nearest(dataset):
    ds = tfshards.read(dataset, split="val", batch_size=64, image_size=(33, 17), one_hot=True)
    images, masks = next(iter(ds))
    assert images.shape[1:] == (33, 17, 3) and masks.shape[1:] == (33, 17, 3)
    assert set(np.unique(masks.numpy())) == {0.0, 1.0}
    assert np.array_equal(masks.numpy().sum(axis=-1), np.ones(masks.shape[:3]))


def test_mixed_sizes_need_image_size(tmp_path):
    images, masks = write_pairs(tmp_path / "a", 4, size=(8, 8))
    write_pairs(tmp_path / "b", 6, size=(10, 12))
    for name in ("004", "005"):
        (tmp_path / "b" / "images" / f"{name}.png").rename(images / f"{name}.png")
        (tmp_path / "b" / "masks" / f"{name}.png").rename(masks / f"{name}.png")
    convert(images, masks, tmp_path / "out", workers=1, progress=False)
    with pytest.raises(OptionsError, match="differ in size.*image_size"):
        tfshards.read(tmp_path / "out")
    ds = tfshards.read(tmp_path / "out", image_size=(8, 8), batch_size=10)
    assert next(iter(ds))[0].shape == (6, 8, 8, 3)


def test_augment_runs_after_the_cache_and_stays_random(dataset, tmp_path):
    def flip(image, mask):
        coin = tf.random.uniform([]) < 0.5
        return (
            tf.where(coin, tf.reverse(image, [1]), image),
            tf.where(coin, tf.reverse(mask, [1]), mask),
        )

    ds = tfshards.read(
        dataset,
        split="val",
        batch_size=64,
        image_dtype="uint8",
        shuffle=False,
        augment=flip,
        cache=tmp_path / "cache",
    )
    epochs = [digests(ds) for _ in range(3)]
    assert len({tuple(e) for e in epochs}) > 1


def test_uint8_and_memory_cache(dataset):
    ds = tfshards.read(dataset, split="val", batch_size=4, image_dtype="uint8", cache="memory")
    assert ds.element_spec[0].dtype == tf.uint8
    assert digests(ds) == digests(ds) == expected_digests(dataset, "val")


def test_float_images_are_value_over_255_bit_for_bit(dataset):
    import tensorflow as tf

    from tfshards.readers.decode import to_float_image

    every = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    expected = every.astype(np.float32) * np.float32(1.0 / 255.0)
    assert np.array_equal(to_float_image(tf.constant(every)).numpy(), expected)
    as_float = tfshards.read(dataset, batch_size=4, shuffle=False)
    as_uint8 = tfshards.read(dataset, batch_size=4, shuffle=False, image_dtype="uint8")
    for (f, _), (u, _) in zip(as_float, as_uint8, strict=True):
        assert f.dtype == tf.float32
        assert np.array_equal(f.numpy(), u.numpy().astype(np.float32) * np.float32(1 / 255))


@pytest.mark.parametrize("cache", [False, "memory"])
def test_float_batches_held_at_once_keep_their_pixels(dataset, cache):
    """int32 masks are delivered in recycled arrays: a batch still held must never be
    overwritten by a later one, with float32 images or uint8."""
    as_float = tfshards.read(dataset, batch_size=4, seed=3, cache=cache)
    as_uint8 = tfshards.read(dataset, batch_size=4, seed=3, cache=cache, image_dtype="uint8")
    for _ in range(2):  # the second epoch of a cache reads from the store
        held, held_uint8 = list(as_float), list(as_uint8)
        assert len(held) == len(held_uint8) > 2
        for (f, fm), (u, um) in zip(held, held_uint8, strict=True):
            assert np.array_equal(f.numpy(), u.numpy().astype(np.float32) * np.float32(1 / 255))
            assert np.array_equal(fm.numpy(), um.numpy())


@pytest.mark.parametrize("image_dtype", ["uint8", "float32"])
@pytest.mark.parametrize("cache", ["disk", "memory"])
def test_a_cache_built_from_png_records_delivers_what_streaming_does(tmp_path, cache, image_dtype):
    """PNG records are decoded by TensorFlow and kept by the store as uint8 while the
    cache is built: the building epoch and the next one (read from the store) deliver
    the stream's batches, masks as int32."""
    images, masks = write_pairs(tmp_path / "data", 12, size=(16, 20), classes=3)
    png = tmp_path / "png"
    convert(images, masks, png, encoding="png", num_classes=3, workers=1, progress=False)
    where = tmp_path / "cache" if cache == "disk" else "memory"
    options = dict(batch_size=4, seed=5, image_dtype=image_dtype)
    stream = tfshards.read(png, **options)
    cached = tfshards.read(png, cache=where, **options)
    for _ in range(2):  # the building epoch, then the store's: each the stream's epoch
        batches, streamed = list(cached), list(stream)
        assert len(batches) == len(streamed) == 3
        for (image, mask), (want_image, want_mask) in zip(batches, streamed, strict=True):
            assert mask.dtype.name == "int32"
            assert np.array_equal(image.numpy(), want_image.numpy())
            assert np.array_equal(mask.numpy(), want_mask.numpy())
    assert cached._tfshards_reader.store.ready


def test_keras_fit_evaluate_predict_without_steps(dataset):
    import keras

    inputs = keras.Input((16, 20, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    down = keras.layers.MaxPooling2D()(x)
    up = keras.layers.UpSampling2D()(keras.layers.Conv2D(4, 3, padding="same")(down))
    merged = keras.layers.Concatenate()([x, up])
    outputs = keras.layers.Conv2D(3, 1, activation="softmax")(merged)
    model = keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    train = tfshards.read(dataset, split="train", batch_size=8, seed=0)
    val = tfshards.read(dataset, split="val", batch_size=8)
    history = model.fit(train, validation_data=val, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and "val_loss" in history.history
    assert len(model.evaluate(val, verbose=0)) == 2
    records = tfshards.Manifest.load(dataset).splits["val"].records
    assert model.predict(val, verbose=0).shape == (records, 16, 20, 3)


# ---- the disk cache -------------------------------------------------------------------


def test_disk_cache_is_built_during_the_first_epoch_and_keyed(dataset, tmp_path):
    cache = tmp_path / "cache"
    ds = tfshards.read(
        dataset, split="train", batch_size=6, image_dtype="uint8", seed=0, cache=cache
    )
    assert [e.state for e in tfshards.list_caches(cache)] == ["incomplete"]
    first = digests(ds)
    entries = tfshards.list_caches(cache)
    assert [e.state for e in entries] == ["ready"] and entries[0].info.split == "train"
    assert sorted(digests(ds)) == sorted(first) == sorted(expected_digests(dataset, "train"))
    # changed options: another entry; same options again: the same entry
    tfshards.read(dataset, split="train", image_size=(8, 8), cache=cache)
    tfshards.read(dataset, split="train", batch_size=2, cache=cache)
    assert len(tfshards.list_caches(cache)) == 2
    assert tfshards.clear_caches(cache) > 0 and tfshards.list_caches(cache) == []


def test_a_cached_epoch_is_a_function_of_seed_and_epoch(dataset, tmp_path):
    cache = tmp_path / "cache"
    ds = tfshards.read(
        dataset, split="train", batch_size=6, image_dtype="uint8", seed=0, cache=cache
    )
    expected = sorted(expected_digests(dataset, "train"))
    built = digests(ds)  # builds the entry
    assert sorted(built) == expected
    cached = [digests(ds) for _ in range(3)]
    assert all(sorted(epoch) == expected for epoch in cached), "each record once per epoch"
    assert len({tuple(epoch) for epoch in cached}) == 3, "a new order each cached epoch"
    fresh = tfshards.read(
        dataset, split="train", batch_size=6, image_dtype="uint8", seed=0, cache=cache
    )
    assert digests(fresh) == built, "epoch 0 is the same, built or read from the cache"
    streamed = tfshards.read(dataset, split="train", batch_size=6, image_dtype="uint8", seed=0)
    assert [digests(streamed) for _ in range(4)] == [built, *cached], "cached or streamed"


def test_cache_true_lives_beside_the_shards(dataset, tmp_path):
    shards = copy_dataset(dataset, tmp_path / "shards")
    digests(tfshards.read(shards, split="val", cache=True))
    assert [e.state for e in tfshards.list_caches(shards)] == ["ready"]
    assert (shards / ".tfshards-cache").is_dir()


def test_changed_data_builds_a_new_cache_never_reads_the_stale_one(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 10)
    out, cache = tmp_path / "shards", tmp_path / "cache"
    convert(images, masks, out, workers=1, progress=False)
    before = digests(
        tfshards.read(out, batch_size=10, shuffle=False, image_dtype="uint8", cache=cache)
    )
    write_pairs(tmp_path / "data", 10, seed=9)  # new pixels, same names
    convert(images, masks, out, overwrite=True, workers=1, progress=False)
    after = digests(
        tfshards.read(out, batch_size=10, shuffle=False, image_dtype="uint8", cache=cache)
    )
    assert after != before and after == expected_digests(out, "train")
    assert len(tfshards.list_caches(cache)) == 2


# Issue 43 (first hour): the entry of the replaced shards was listed as ready.
def test_the_entry_of_replaced_shards_is_listed_stale_and_cleared_alone(tmp_path, capsys):
    from tfshards.cli import main

    images, masks = write_pairs(tmp_path / "data", 10)
    out = tmp_path / "shards"
    convert(images, masks, out, workers=1, progress=False)
    digests(tfshards.read(out, batch_size=5, image_dtype="uint8", cache=True))
    (old,) = tfshards.list_caches(out)
    write_pairs(tmp_path / "data", 10, seed=9)
    convert(images, masks, out, overwrite=True, workers=1, progress=False)
    assert [(e.path, e.state) for e in tfshards.list_caches(out)] == [(old.path, "stale")]
    digests(tfshards.read(out, batch_size=5, image_dtype="uint8", cache=True))
    states = {e.path: e.state for e in tfshards.list_caches(out)}
    assert sorted(states.values()) == ["ready", "stale"] and states[old.path] == "stale"
    assert main(["-q", "cache", "list", str(out)]) == 0
    assert f"{old.path}  stale" in capsys.readouterr().out
    assert main(["-q", "cache", "clear", "--stale", str(out)]) == 0
    assert f"{old.bytes / 2**20:.1f} MiB freed" in capsys.readouterr().out
    assert [e.state for e in tfshards.list_caches(out)] == ["ready"] and not old.path.exists()
    elsewhere = tmp_path / "cache"  # a cache folder of its own, its dataset removed
    digests(tfshards.read(out, batch_size=5, image_dtype="uint8", cache=elsewhere))
    assert [e.state for e in tfshards.list_caches(elsewhere)] == ["ready"]
    (out / "tfshards.json").unlink()
    assert [e.state for e in tfshards.list_caches(elsewhere)] == ["stale"]


def _files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _project(root: Path) -> Path:
    """A project folder: source images, a converted dataset, code, and folders that look
    like cache entries without being ones."""
    images, masks = write_pairs(root / "data", 6)
    convert(images, masks, root / "shards", workers=1, progress=False)
    (root / "src").mkdir()
    (root / "src" / "train.py").write_text("print('train')\n")
    (root / "notes.txt").write_text("notes\n")
    (root / "0123456789abcdef01234567").mkdir()  # a fingerprint's name, no info.json
    (root / "0123456789abcdef01234567" / "weights.h5").write_bytes(b"w")
    return root / "shards"


# Issue 43 point 1: `cache clear` of a folder that was not a cache removed its subfolders.
def test_cache_clear_removes_only_entries_it_can_prove_it_wrote(tmp_path, capsys, monkeypatch):
    from tfshards.cli import main
    from tfshards.readers.cache import CacheFolderError

    project = tmp_path / "projects" / "unet"
    shards = _project(project)
    mine = project / "cache"
    read = dict(batch_size=3, image_dtype="uint8")
    digests(tfshards.read(shards, cache=True, **read))  # beside the shards
    digests(tfshards.read(shards, cache=mine, **read))
    (ready,) = tfshards.list_caches(mine)
    digests(tfshards.read(shards, cache=mine, image_size=(8, 8), **read))
    (crashed,) = [e.path for e in tfshards.list_caches(mine) if e.path != ready.path]
    (crashed / "ready").rename(crashed / ".building-otherhost-4242-0badf00d")  # a crash's
    tfshards.read(shards, cache=mine, image_size=(6, 6), **read)  # made, never read
    # An entry of an earlier version (another format: never read again, listed stale).
    earlier = mine / "00112233445566778899aabb"
    shutil.copytree(ready.path, earlier)
    info = json.loads((earlier / "info.json").read_text())
    (earlier / "info.json").write_text(json.dumps({**info, "cache_format": 2}))
    # Not entries: a folder of the user's holding an info.json, a file beside the entries.
    user = mine / "aabbccddeeff001122334455"
    shutil.copytree(ready.path, user)
    (user / "results.csv").write_text("epoch,loss\n")
    linked = mine / "1234567890abcdef12345678"  # its ready/ a link to the source images
    linked.mkdir()
    shutil.copy(ready.path / "info.json", linked / "info.json")
    (linked / "ready").symlink_to(project / "data")
    (mine / "README").write_text("my caches\n")
    entries = {e.path: e.state for e in tfshards.list_caches(mine)}
    assert sorted(entries.values()) == ["incomplete", "incomplete", "ready", "stale"]
    assert entries[crashed] == "incomplete" and entries[earlier] == "stale"
    before = _files_under(tmp_path)
    for folder in (project, project.parent):
        assert tfshards.list_caches(folder) == []
        assert main(["-q", "cache", "list", str(folder)]) == 0
        assert capsys.readouterr().out == f"no caches under {folder}\n"
        assert main(["-q", "cache", "clear", str(folder)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"tfshards cache: error: {folder} is not a dataset folder")
        assert "nothing was removed" in err
        with pytest.raises(CacheFolderError, match="holds no tfshards cache entries"):
            tfshards.clear_caches(folder)
    monkeypatch.chdir(project)
    with pytest.raises(OptionsError, match="location of the caches is empty"):
        tfshards.clear_caches("")
    assert main(["-q", "cache", "clear", ""]) == 2
    assert "location of the caches is empty" in capsys.readouterr().err
    for missing in (project / "nope", project / "notes.txt"):
        with pytest.raises(CacheFolderError, match="no such folder|not a folder"):
            tfshards.clear_caches(missing)
        assert main(["-q", "cache", "clear", str(missing)]) == 1
    assert _files_under(tmp_path) == before
    # The entries are cleared, and only they.
    assert tfshards.clear_caches(mine) > 0 and tfshards.list_caches(mine) == []
    assert main(["-q", "cache", "clear", str(shards)]) == 0
    assert tfshards.list_caches(shards) == []
    caches = ("projects/unet/cache/", "projects/unet/shards/.tfshards-cache/")
    kept = {k: v for k, v in before.items() if not k.startswith(caches)}
    for folder in (user, linked):
        left = str(folder.relative_to(tmp_path))
        kept.update({k: v for k, v in before.items() if k.startswith(left)})
    kept["projects/unet/cache/README"] = before["projects/unet/cache/README"]
    assert _files_under(tmp_path) == kept


def _reader_script(shards: Path, cache: Path, extra: str = "") -> str:
    return textwrap.dedent(f"""
        import hashlib, sys, time
        import tfshards
        ds = tfshards.read({str(shards)!r}, split="train", batch_size=4, image_dtype="uint8",
                           shuffle=False, cache={str(cache)!r})
        seen = []
        for images, masks in ds:
            {extra}
            for image, mask in zip(images.numpy(), masks.numpy()):
                seen.append(hashlib.sha1(image.tobytes() + mask.tobytes()).hexdigest())
        print(",".join(sorted(seen)))
    """)


def _run_python(script: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, **kwargs
    )


def test_a_new_process_reads_the_cache_without_decoding(dataset, tmp_path):
    shards = copy_dataset(dataset, tmp_path / "shards")
    cache = tmp_path / "cache"
    first = _run_python(_reader_script(shards, cache))
    assert first.returncode == 0, first.stderr
    expected = ",".join(sorted(expected_digests(dataset, "train")))
    assert first.stdout.strip() == expected
    # Zero every shard's bytes (sizes unchanged): only a reader that never decodes succeeds.
    for shard in shards.glob("train-*"):
        shard.write_bytes(bytes(shard.stat().st_size))
    second = _run_python(_reader_script(shards, cache))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == expected
    assert "did not fully read" not in first.stderr + second.stderr


@pytest.fixture(scope="module")
def many_records(tmp_path_factory) -> Path:
    """Enough records that read-ahead buffers cannot finish an epoch behind a slow consumer."""
    root = tmp_path_factory.mktemp("many")
    images, masks = write_pairs(root / "data", 400, size=(8, 8))
    convert(images, masks, root / "shards", workers=1, progress=False)
    return root / "shards"


def test_killed_cache_build_then_a_clean_run(many_records, tmp_path):
    dataset = many_records
    cache = tmp_path / "cache"
    slow = "time.sleep(0.05); print('batch', flush=True, file=sys.stderr)"
    process = subprocess.Popen(
        [sys.executable, "-c", _reader_script(dataset, cache, slow)],
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in process.stderr:  # kill it during the first epoch
        if "batch" in line:
            break
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert [e.state for e in tfshards.list_caches(cache)] == ["incomplete"]
    rerun = _run_python(_reader_script(dataset, cache))
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == ",".join(sorted(expected_digests(dataset, "train")))
    assert "lockfile" not in rerun.stderr and "did not fully read" not in rerun.stderr
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]


def test_early_stopped_pass_is_not_published(many_records, tmp_path):
    cache = tmp_path / "cache"
    ds = tfshards.read(many_records, batch_size=1, cache=cache, shuffle=False)
    for _ in ds.take(1):
        pass
    assert [e.state for e in tfshards.list_caches(cache)] == ["incomplete"]
    assert len(digests(ds)) == 400
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]


def test_two_processes_started_together_share_a_cache(dataset, tmp_path):
    cache = tmp_path / "cache"
    script = _reader_script(dataset, cache)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in processes]
    expected = ",".join(sorted(expected_digests(dataset, "train")))
    for process, (stdout, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert stdout.strip() == expected
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]
    third = _run_python(_reader_script(dataset, cache))
    assert third.stdout.strip() == expected


def test_cache_refused_when_the_disk_lacks_room(dataset, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 100, 100))
    with pytest.raises(tfshards.TfshardsError, match=r"needs about \d+ MiB but .* has 0 MiB free"):
        tfshards.read(dataset, cache=tmp_path / "cache")


# ---- distribution ---------------------------------------------------------------------


def test_input_context_pipelines_split_every_round_evenly(dataset):
    everything = sorted(expected_digests(dataset, "train"))
    seen, lengths = [], []
    for pipeline in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2
        )
        ds = tfshards.read(
            dataset, batch_size=4, image_dtype="uint8", shuffle=False, input_context=context
        )
        part = digests(ds)
        assert int(ds.cardinality()) == len(part) // 2  # per-replica batch of 2
        seen += part
        lengths.append(len(part))
    # Whole rounds of 2 x 2 records only: the same batch count on every pipeline.
    assert lengths[0] == lengths[1] == len(everything) // 4 * 2
    assert len(set(seen)) == len(seen) and set(seen) <= set(everything)


# Issue 43 point 10: each pipeline filled a full-size cache that never completed.
@pytest.mark.parametrize("cache", [True, "memory"])
def test_a_cache_read_by_index_with_several_input_pipelines_is_refused(dataset, tmp_path, cache):
    shards = copy_dataset(dataset, tmp_path / "shards")
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0)
    with pytest.raises(OptionsError, match="cannot be combined with input_context") as info:
        tfshards.read(shards, batch_size=4, input_context=context, cache=cache)
    records = tfshards.Manifest.load(shards).splits["train"].records
    assert f"none reads all {records} records" in str(info.value)
    assert "Pass cache=None" in str(info.value)
    assert not (shards / ".tfshards-cache").exists()
    one = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0)
    digests(tfshards.read(shards, batch_size=4, input_context=one, cache=cache))


def test_cropped_reads_with_input_pipelines_share_one_global_order(dataset, tmp_path):
    """Crops are read by index like every read: each pipeline its slice of every round
    (equal batch counts); a cache across pipelines is refused, as for every ordered read."""
    options = dict(batch_size=4, image_dtype="uint8", crop_size=(8, 8), seed=0)
    counts = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline)
        batches = list(tfshards.read(dataset, input_context=context, **options))
        counts.append([int(images.shape[0]) for images, _ in batches])
        with pytest.raises(tfshards.OptionsError, match="cannot be combined with input_context"):
            tfshards.read(dataset, input_context=context, cache=tmp_path / "c", **options)
    rounds = tfshards.Manifest.load(dataset).splits["train"].records // 8
    assert counts == [[4] * rounds] * 2


def test_tf_data_service_delivers_every_record_once(dataset):
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [
        service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(2)
    ]
    ds = tfshards.read(
        dataset, batch_size=4, image_dtype="uint8", seed=0, service=dispatcher.target
    )
    assert sorted(digests(ds)) == sorted(expected_digests(dataset, "train"))
    del workers  # the workers serve until here


# ---- errors ---------------------------------------------------------------------------


def test_missing_foreign_and_future_manifests(dataset, tmp_path):
    with pytest.raises(ManifestError, match="no manifest"):
        tfshards.read(tmp_path)
    shards = copy_dataset(dataset, tmp_path / "s")
    body = json.loads((shards / "tfshards.json").read_text())
    (shards / "tfshards.json").write_text(json.dumps({**body, "format": "other"}))
    with pytest.raises(ManifestError, match="not a tfshards manifest"):
        tfshards.read(shards)
    (shards / "tfshards.json").write_text(json.dumps({**body, "schema_version": 99}))
    with pytest.raises(ManifestError, match="schema version 99 cannot be read"):
        tfshards.read(shards)
    (shards / "tfshards.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        tfshards.read(shards)


def test_unknown_split_and_bad_arguments(dataset):
    with pytest.raises(ManifestError, match="no split 'test'; this dataset has train, val"):
        tfshards.read(dataset, split="test")
    with pytest.raises(OptionsError, match="batch_size"):
        tfshards.read(dataset, batch_size=0)
    with pytest.raises(OptionsError, match="cycle_length"):
        tfshards.read(dataset, options=ReadOptions(cycle_length=0))


def test_edited_manifest_and_damaged_shards(dataset, tmp_path):
    shards = copy_dataset(dataset, tmp_path / "s")
    body = json.loads((shards / "tfshards.json").read_text())
    edited = json.loads(json.dumps(body))
    edited["splits"]["train"]["shards"][0]["file"] = "../../etc/passwd"
    (shards / "tfshards.json").write_text(json.dumps(edited))
    with pytest.raises(ManifestError, match="'../../etc/passwd' is refused"):
        tfshards.read(shards)
    edited = json.loads(json.dumps(body))
    edited["splits"]["train"]["records"] += 1
    (shards / "tfshards.json").write_text(json.dumps(edited))
    with pytest.raises(ManifestError, match="differ from the sum over its shards"):
        tfshards.read(shards)
    (shards / "tfshards.json").write_text(json.dumps(body))
    first = shards / body["splits"]["train"]["shards"][0]["file"]
    data = first.read_bytes()
    first.write_bytes(data[:-10])
    with pytest.raises(ManifestError, match="bytes on disk but the manifest says"):
        tfshards.read(shards)
    first.unlink()
    with pytest.raises(ManifestError, match="shard listed in the manifest is missing"):
        tfshards.read(shards)
    # a flipped byte (same size) is caught while reading, never a hang
    first.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    with pytest.raises(tf.errors.OpError):
        digests(tfshards.read(shards, shuffle=False))


@pytest.mark.skipif(not MEMBRANE.is_dir(), reason="needs ../shared/data/membrane")
def test_real_membrane_data_trains(tmp_path):
    convert(
        MEMBRANE / "image",
        MEMBRANE / "label",
        tmp_path / "out",
        mask_map=((0, 0), (255, 1)),
        num_classes=2,
        val_fraction=0.2,
        workers=1,
        progress=False,
    )
    train = tfshards.read(tmp_path / "out", batch_size=4, image_size=(128, 128), cache=True, seed=0)
    images, masks = next(iter(train))
    assert images.shape[1:] == (128, 128, 1) and set(np.unique(masks.numpy())) == {0, 1}
    total = sum(int(i.shape[0]) for i, _ in train)
    assert total == tfshards.Manifest.load(tmp_path / "out").splits["train"].records


@pytest.mark.parametrize("encoding", ["deflate", "raw", "keep"])
@pytest.mark.parametrize("cache", [None, "disk"])
def test_every_encoding_streams_and_caches_exact_pixels(tmp_path, encoding, cache):
    images, masks = write_pairs(tmp_path / "data", 23, size=(12, 10))
    out = tmp_path / "shards"
    convert(images, masks, out, encoding=encoding, num_shards=3, workers=1, progress=False)
    expected = sorted(expected_digests(out, "train"))
    where = tmp_path / "cache" if cache else None
    ds = tfshards.read(out, batch_size=4, image_dtype="uint8", seed=1, cache=where)
    assert sorted(digests(ds)) == expected and sorted(digests(ds)) == expected
    ordered = tfshards.read(out, batch_size=5, image_dtype="uint8", shuffle=False, cache=where)
    assert digests(ordered) == expected_digests(out, "train")
    floats = tfshards.read(out, batch_size=23, seed=1, augment=lambda i, m: (i, m))
    images_batch, masks_batch = next(iter(floats))
    assert images_batch.dtype == tf.float32 and float(tf.reduce_max(images_batch)) <= 1.0
    assert masks_batch.dtype == tf.int32 and images_batch.shape[0] == 23
    as_bytes = tfshards.read(out, batch_size=23, seed=1, image_dtype="uint8", cache=where)
    as_floats = tfshards.read(out, batch_size=23, seed=1, cache=where)
    for (raw_images, _), (float_images, _) in zip(as_bytes, as_floats, strict=True):
        np.testing.assert_allclose(float_images.numpy(), raw_images.numpy() / 255.0, atol=1e-7)


def test_warm_epochs_are_reshuffled_and_complete(dataset, tmp_path):
    ds = tfshards.read(dataset, batch_size=5, image_dtype="uint8", cache=tmp_path / "cache")
    first = digests(ds)  # builds the cache
    assert [e.state for e in tfshards.list_caches(tmp_path / "cache")] == ["ready"]
    warm = [digests(ds) for _ in range(3)]
    assert all(sorted(epoch) == sorted(first) for epoch in warm)
    assert len({tuple(epoch) for epoch in warm}) > 1, "every cached epoch in the same order"


def test_damaged_cache_files_are_rebuilt_not_read(dataset, tmp_path):
    cache = tmp_path / "cache"
    ordered = dict(batch_size=4, image_dtype="uint8", shuffle=False, cache=cache)
    expected = digests(tfshards.read(dataset, **ordered))
    (entry,) = tfshards.list_caches(cache)
    part = entry.path / "ready" / "pairs.image"
    part.write_bytes(part.read_bytes()[:-7])  # truncated
    abandoned = entry.path / f".building-{socket.gethostname()}-999999999-deadbeef"
    abandoned.mkdir()
    assert digests(tfshards.read(dataset, **ordered)) == expected
    assert not abandoned.exists(), "a dead process's build is removed"
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]


@pytest.fixture(scope="module", params=["keep", "raw"])
def four_classes(request, tmp_path_factory) -> Path:
    """24 pairs of 4 classes, as PNG (decoded by TensorFlow) or raw (decoded in fetch)."""
    root = tmp_path_factory.mktemp("four")
    images, masks = write_pairs(root / "data", 24, size=(8, 10), classes=4)
    out = root / "shards"
    convert(images, masks, out, encoding=request.param, num_classes=4, workers=1, progress=False)
    return out


def _flat_entry(cache: Path) -> tuple[Path, int, int]:
    """The ready folder of the only entry, and its bytes per image and per mask."""
    (entry,) = tfshards.list_caches(cache)  # waits for the publishing
    height, width, channels = entry.info.shape
    return entry.path / "ready", height * width * channels, height * width


def _edit(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(at)
        handle.write(data)


def _flip(path: Path, at: int) -> None:
    _edit(path, at, bytes([path.read_bytes()[at] ^ 0xFF]))


def _swap(path: Path, size: int, one: int, other: int) -> None:
    data = bytearray(path.read_bytes())
    a, b = slice(one * size, (one + 1) * size), slice(other * size, (other + 1) * size)
    data[a], data[b] = data[b], data[a]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage", ["image byte", "mask of 200", "two pairs swapped", "checksum byte"]
)
def test_a_changed_cache_byte_stops_the_read_and_the_next_read_rebuilds(
    four_classes, tmp_path, damage
):
    cache = tmp_path / "cache"
    ordered = dict(batch_size=4, image_dtype="uint8", shuffle=False, cache=cache)
    expected = expected_digests(four_classes, "train")
    assert digests(tfshards.read(four_classes, **ordered)) == expected  # builds it
    assert digests(tfshards.read(four_classes, **ordered)) == expected  # reads it, untouched
    ready, image_bytes, mask_bytes = _flat_entry(cache)
    if damage == "image byte":
        _flip(ready / "pairs.image", 6 * image_bytes + 3)
        message = r"pair 6 does not match its checksum"
    elif damage == "mask of 200":
        _edit(ready / "pairs.mask", 5 * mask_bytes + 7, bytes([200]))
        message = r"pair 5 does not match its checksum"
    elif damage == "checksum byte":
        _flip(ready / "pairs.crc32", 4 * 3 + 1)
        message = r"pair 3 does not match its checksum"
    else:  # pairs 1 and 2, image and mask: every byte is a pair's, at another index
        _swap(ready / "pairs.image", image_bytes, 1, 2)
        _swap(ready / "pairs.mask", mask_bytes, 1, 2)
        message = r"pair 1 and 1 more of its batch does not match"
    with pytest.raises(tf.errors.OpError, match=message + r".*next read builds it again"):
        digests(tfshards.read(four_classes, **ordered))
    assert not ready.exists(), "the damaged entry is never named again"
    assert digests(tfshards.read(four_classes, **ordered)) == expected  # rebuilt
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]
    assert digests(tfshards.read(four_classes, **ordered)) == expected  # read, checked


@pytest.mark.parametrize("damage", ["image byte", "index truncated", "pixels truncated"])
def test_a_damaged_cache_of_records_of_many_sizes(tmp_path, damage):
    """Records of many sizes are cached each at its own size, with an index: a changed
    byte stops the read and removes the entry; a truncated file makes it not ready, so
    the next read builds it again; either way, the crops are the same as before."""
    shards, cache = mixed_sizes(tmp_path), tmp_path / "cache"
    options = dict(batch_size=4, image_dtype="uint8", seed=1, crop_size=(16, 16), cache=cache)
    expected = digests(tfshards.read(shards, **options))  # builds
    (entry,) = tfshards.list_caches(cache)
    ready = entry.path / "ready"
    assert sorted(p.name for p in ready.iterdir()) == [
        "pairs.crc32", "pairs.image", "pairs.index", "pairs.mask"
    ]  # fmt: skip
    index = np.fromfile(ready / "pairs.index", "<i8").reshape(12, 4)
    assert sorted(map(tuple, index[:, 2:])) == sorted([(20, 32), (40, 24), (12, 12), (32, 48)] * 3)
    if damage == "image byte":
        _flip(ready / "pairs.image", int(index[7, 0]) + 5)
        with pytest.raises(tf.errors.OpError, match="pair 7 does not match its checksum"):
            digests(tfshards.read(shards, **options))
        assert not ready.exists(), "the damaged entry is never named again"
    else:
        name = "pairs.index" if damage == "index truncated" else "pairs.mask"
        os.truncate(ready / name, (ready / name).stat().st_size - 8)
    assert digests(tfshards.read(shards, **options)) == expected  # rebuilt
    assert digests(tfshards.read(shards, **options)) == expected  # read, checked
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]


def test_a_cache_damaged_under_an_open_dataset_stops_its_next_epoch(four_classes, tmp_path):
    cache = tmp_path / "cache"
    ds = tfshards.read(four_classes, batch_size=4, image_dtype="uint8", seed=2, cache=cache)
    assert sorted(digests(ds)) == sorted(expected_digests(four_classes, "train"))  # builds
    ready, image_bytes, _ = _flat_entry(cache)
    _flip(ready / "pairs.image", 23 * image_bytes)  # in the page cache the dataset reads
    with pytest.raises(tf.errors.OpError, match=f"disk cache {ready.parent}: pair 23 does not"):
        digests(ds)
    assert not ready.exists()


def test_a_damaged_entry_found_late_leaves_the_one_rebuilt_in_its_place(four_classes, tmp_path):
    cache = tmp_path / "cache"
    ordered = dict(batch_size=4, image_dtype="uint8", shuffle=False, cache=cache)
    expected = expected_digests(four_classes, "train")
    digests(tfshards.read(four_classes, **ordered))  # builds entry A
    old = tfshards.read(four_classes, **ordered)  # holds A's files open
    ready, image_bytes, _ = _flat_entry(cache)
    _flip(ready / "pairs.image", 2 * image_bytes)
    ready.rename(tmp_path / "moved-away")  # as another process's read would
    assert digests(tfshards.read(four_classes, **ordered)) == expected  # builds entry B
    rebuilt = _flat_entry(cache)[0] / "pairs.image"
    inode = rebuilt.stat().st_ino
    with pytest.raises(tf.errors.OpError, match="pair 2 does not match"):
        digests(old)
    assert rebuilt.exists() and rebuilt.stat().st_ino == inode, "B is left alone"
    assert digests(tfshards.read(four_classes, **ordered)) == expected


@pytest.mark.parametrize("change", ["truncated", "extended", "missing"])
def test_a_checksum_file_of_another_size_is_rebuilt_not_trusted(
    four_classes, tmp_path, caplog, change
):
    cache = tmp_path / "cache"
    ordered = dict(batch_size=4, image_dtype="uint8", shuffle=False, cache=cache)
    expected = expected_digests(four_classes, "train")
    digests(tfshards.read(four_classes, **ordered))
    ready, _, _ = _flat_entry(cache)
    checksums = ready / "pairs.crc32"
    body = checksums.read_bytes()
    assert len(body) == 4 * len(expected)
    if change == "missing":
        checksums.unlink()
    else:
        checksums.write_bytes(body[:-1] if change == "truncated" else body + b"\0\0\0\0")
    with caplog.at_level(logging.WARNING, logger="tfshards"):
        assert digests(tfshards.read(four_classes, **ordered)) == expected
    assert "incomplete or damaged cache files; rebuilding them" in caplog.text
    assert checksums.read_bytes() == body, "rebuilt: the same pairs, the same checksums"


@pytest.mark.parametrize("library", ["isal", "zlib"])
def test_pair_checksums_tell_each_byte_and_index(library, monkeypatch):
    import zlib

    from tfshards.readers.cache import store
    from tfshards.readers.cache.store import pair_checksums

    if library == "zlib":  # where isal is not installed: the same values
        monkeypatch.setattr(store, "_crc32_at", lambda: None)
    else:
        assert store._crc32_at() is not None

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 4, 5, 3), dtype=np.uint8)
    masks = rng.integers(0, 4, (3, 4, 5, 1), dtype=np.uint8)
    indices = np.array([7, 0, 12])
    base = pair_checksums(indices, images, masks)
    for k, index in enumerate(indices):  # the documented layout (docs/reading.md)
        assert base[k] == zlib.crc32(images[k].tobytes() + masks[k].tobytes(), int(index))
    swapped = pair_checksums(indices[[1, 0, 2]], images, masks)
    assert swapped[0] != base[0] and swapped[1] != base[1] and swapped[2] == base[2]
    flipped = masks.copy()
    flipped[2, 3, 4, 0] ^= 1
    changed = pair_checksums(indices, images, flipped)
    assert list(changed[:2]) == list(base[:2]) and changed[2] != base[2]


def test_a_process_started_while_the_cache_is_half_built(many_records, tmp_path):
    dataset = many_records
    cache = tmp_path / "cache"
    slow = "time.sleep(0.05); print('batch', flush=True, file=sys.stderr)"
    builder = subprocess.Popen(
        [sys.executable, "-c", _reader_script(dataset, cache, slow)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in builder.stderr:  # the builder is part-way through its first epoch
        if "batch" in line:
            break
    assert [e.state for e in tfshards.list_caches(cache)] == ["incomplete"]
    late = _run_python(_reader_script(dataset, cache))
    stdout, stderr = builder.communicate(timeout=300)
    expected = ",".join(sorted(expected_digests(dataset, "train")))
    assert late.returncode == 0 and builder.returncode == 0, late.stderr + stderr
    assert late.stdout.strip() == expected and stdout.strip() == expected
    assert [e.state for e in tfshards.list_caches(cache)] == ["ready"]
    assert _run_python(_reader_script(dataset, cache)).stdout.strip() == expected


def test_a_cropped_read_of_fixed_size_records_reuses_its_disk_cache(dataset, tmp_path, caplog):
    """The cache holds whole decoded records, cropped after: a cropped read and an
    uncropped one share one entry (flat files), each reading it once it is built."""
    cache = tmp_path / "cache"
    options = dict(batch_size=4, image_dtype="uint8", seed=0, crop_size=(8, 8), cache=cache)
    first = digests(tfshards.read(dataset, **options))
    with caplog.at_level(logging.INFO, logger="tfshards"):
        assert digests(tfshards.read(dataset, **options)) == first
        digests(tfshards.read(dataset, batch_size=4, image_dtype="uint8", seed=0, cache=cache))
    assert "reading the disk cache" in caplog.text and "building" not in caplog.text
    states = sorted((e.info.files, e.state) for e in tfshards.list_caches(cache))
    assert states == [("flat", "ready")]
