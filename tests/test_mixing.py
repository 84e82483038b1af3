"""Several datasets read as one (read({name: path}, weights=, epoch_size=)) and label maps
(read(path, label_map=...)): issue 47."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tfshards
from tests.conftest import run_json_script
from tfshards.errors import OptionsError
from tfshards.readers.labels import label_map, remapped_table
from tfshards.readers.resume import ReadState, ResumeError
from tfshards.schemas.record_table import RecordTable, record_row

SIZES = {"a": 40, "b": 15}  # records of each dataset
TAGS = {"a": 1, "b": 2}  # an image's channel 1: which dataset it came from


def _mask(name: str, index: int, side: int = 8) -> np.ndarray:
    """a: classes 0..3 (3 in every 4th record); b: classes 0..2 (2 in every 3rd)."""
    mask = np.zeros((side, side), np.uint8)
    mask[: side // 2, : side // 2] = 1
    if name == "a" and index % 4 == 0:
        mask[side // 2 :, side // 2 :] = 3
    if name == "a" and index % 2 == 0:
        mask[0, side - 1] = 2
    if name == "b" and index % 3 == 0:
        mask[side // 2 :, :2] = 2
    return mask


def _dataset(root: Path, name: str, count: int, side: int = 8, **options) -> Path:
    """``count`` pairs; image channel 0 is the pair's index, channel 1 the dataset's tag."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for index in range(count):
        image = np.zeros((side, side, 3), np.uint8)
        image[..., 0], image[..., 1] = index, TAGS.get(name, 9)
        Image.fromarray(image).save(root / "images" / f"{index:03d}.png")
        Image.fromarray(_mask(name, index, side)).save(root / "masks" / f"{index:03d}.png")
    classes = 4 if name == "a" else 3
    settings = {"num_shards": 2, "encoding": "raw", "num_classes": classes, **options}
    tfshards.convert(
        root / "images", root / "masks", root / "out", options=tfshards.ConvertOptions(**settings)
    )
    return root / "out"


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    return {name: _dataset(root / name, name, count) for name, count in SIZES.items()}


def _seen(read) -> list[tuple[int, int]]:
    """(dataset tag, pair index) of every pair read, in order."""
    return [
        (int(tag), int(index))
        for image, _ in read
        for index, tag in image[:, 0, 0, :2].numpy().tolist()
    ]


def _mixed(two, **arguments):
    settings = {"weights": {"a": 0.75, "b": 0.25}, "epoch_size": 40, "batch_size": 8}
    settings.update(arguments)
    return tfshards.read(two, **{"image_dtype": "uint8", **settings})


# Point 4: one dataset's label map -------------------------------------------------------


def test_a_label_map_remaps_every_mask_pixel_at_read_time(two):
    plain = tfshards.read(two["a"], batch_size=8, image_dtype="uint8", shuffle=False)
    mapped = tfshards.read(
        two["a"], batch_size=8, image_dtype="uint8", shuffle=False, label_map={3: 1, 2: None}
    )
    lookup = np.array([0, 1, 255, 1])
    for (image, mask), (image2, mask2) in zip(plain, mapped, strict=True):
        assert np.array_equal(image.numpy(), image2.numpy())
        assert np.array_equal(lookup[mask.numpy()], mask2.numpy())  # pixel by pixel
    assert (lookup == 255).any()


def test_a_label_map_applies_to_a_cached_read_and_the_cache_serves_any_map(two, tmp_path):
    arguments = {"batch_size": 8, "image_dtype": "uint8", "shuffle": False}
    plain = [m.numpy() for _, m in tfshards.read(two["a"], **arguments)]
    lookup = np.array([0, 0, 0, 1])
    for given in ([0, 0, 0, 1], None, [0, 0, 0, 1]):  # built mapped, read back both ways
        read = tfshards.read(two["a"], cache=tmp_path, label_map=given, **arguments)
        masks = [m.numpy() for _, m in read]
        wanted = plain if given is None else [lookup[m] for m in plain]
        assert all(np.array_equal(x, y) for x, y in zip(masks, wanted, strict=True))
    assert [entry.state for entry in tfshards.list_caches(tmp_path)] == ["ready"]


def test_a_label_map_remaps_info_and_class_weights(two):
    own = tfshards.info(two["a"])
    mapped = tfshards.info(two["a"], label_map={3: 1})
    assert (own.num_classes, mapped.num_classes) == (4, 3)
    pixels = own.class_pixels("train")
    assert mapped.class_pixels("train") == [pixels[0], pixels[1] + pixels[3], pixels[2]]
    weights = tfshards.class_weights(two["a"], label_map={3: 1, 2: None})
    assert sorted(weights) == [0, 1, 255] and weights[255] == 0.0


def test_a_remapped_table_merges_classes_and_counts_ignored_pixels():
    masks = [_mask("a", i) for i in range(8)]
    table = RecordTable.from_rows((record_row(str(i), m, None) for i, m in enumerate(masks)), 4)
    lookup = np.arange(256)
    lookup[3], lookup[2] = 1, -1
    mapped = remapped_table(table, lookup, 2)
    expected = RecordTable.from_rows(
        (record_row(str(i), np.where(m == 2, 255, np.where(m == 3, 1, m)), 255)
         for i, m in enumerate(masks)), 2,
    )  # fmt: skip
    assert mapped.to_bytes() == expected.to_bytes()


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({4: 1}, r"4 is not one of its 4 classes"),
        ({-1: 1}, r"-1 is not one of its 4 classes"),
        ({1: 2.5}, r"maps to 2.5"),
        ([0, 1, 2], r"one entry per class of the dataset \(4\), got 3"),
        ("0123", r"label_map takes"),
    ],
)
def test_bad_label_maps_are_refused_before_the_first_batch(two, given, match):
    with pytest.raises(OptionsError, match=match):
        tfshards.read(two["a"], label_map=given)


def test_a_label_map_target_outside_num_classes_is_refused(two):
    with pytest.raises(OptionsError, match=r"reads classes \[3\] but the shared taxonomy has 3"):
        tfshards.read(two["a"], label_map={1: 1}, num_classes=3)
    manifest = tfshards.Manifest.load(two["a"])
    with pytest.raises(OptionsError, match="ignore label 255 is one of"):
        label_map({1: 300}, manifest, where="x")


# Point 1: weighted mixing ---------------------------------------------------------------


def _epochs(read, count: int) -> list[list[tuple[int, int]]]:
    return [_seen(read) for _ in range(count)]


def test_each_dataset_gets_its_share_of_every_epoch_floor_or_ceiling(two):
    read = _mixed(two, epoch_size=42, seed=3)  # a: 31.5, b: 10.5 records an epoch
    assert read.cardinality().numpy() == 6
    counts = []
    for epoch in _epochs(read, 6):
        assert len(epoch) == 42
        per_source = [sum(tag == t for tag, _ in epoch) for t in (1, 2)]
        assert per_source in ([31, 11], [32, 10])
        counts.append(per_source[0])
        for tag in (1, 2):  # larger than its count: sampled without repeats
            picked = [index for t, index in epoch if t == tag]
            assert len(set(picked)) == len(picked)
    assert set(counts) == {31, 32}  # the extra record goes either way, by (seed, epoch)
    assert abs(np.mean(counts) - 31.5) <= 0.5  # shares within one record per epoch


def test_a_dataset_smaller_than_its_count_is_read_whole_then_sampled(two):
    read = _mixed(two, weights={"a": 1, "b": 1}, epoch_size=40, seed=0)  # b: 20 of its 15
    for epoch in _epochs(read, 3):
        picked = [index for tag, index in epoch if tag == 2]
        assert len(picked) == 20
        held = np.bincount(picked, minlength=SIZES["b"])
        assert held.min() == 1 and held.max() == 2 and (held == 2).sum() == 5


def test_datasets_are_interleaved_through_the_epoch_not_in_blocks(two):
    read = _mixed(two, weights={"a": 1, "b": 1}, epoch_size=30, seed=5, batch_size=5)
    for epoch in _epochs(read, 3):
        tags = [tag for tag, _ in epoch]
        runs = 1 + sum(x != y for x, y in zip(tags, tags[1:], strict=False))
        assert runs >= 8  # blocks would give 2; a random merge of 15 + 15 about 16
        assert {1, 2} <= set(tags[:10]) and {1, 2} <= set(tags[-10:])


def test_mixed_epochs_are_the_same_in_another_process_and_differ_between_epochs(two):
    read = _mixed(two, seed=7)
    here = _epochs(read, 2)
    assert here[0] != here[1]
    code = (
        "import json, sys\nimport tfshards\n"
        "r = tfshards.read({'a': sys.argv[1], 'b': sys.argv[2]}, weights={'a': 0.75, "
        "'b': 0.25}, epoch_size=40, batch_size=8, image_dtype='uint8', seed=7)\n"
        "print(json.dumps([[[int(v) for v in p] for i, _ in r for p in i[:, 0, 0, :2].numpy()]"
        " for _ in range(2)]))"
    )
    there = run_json_script(code, two["a"], two["b"])
    assert there == [[[i, t] for t, i in epoch] for epoch in here]


@pytest.mark.parametrize("position", [(0, 0), (0, 3), (1, 4), (3, 2)])
def test_a_mixed_read_resumes_at_any_batch_bit_for_bit(two, position):
    read = _mixed(two, seed=2, repeat=True)
    flat = [(i.numpy(), m.numpy()) for i, m in read.take(5 * 5)]
    epoch, batch = position
    resumed = _mixed(two, seed=2, repeat=True, start=position)
    for k, (image, mask) in enumerate(resumed.take(4)):
        want = flat[epoch * 5 + batch + k]
        assert np.array_equal(image.numpy(), want[0]) and np.array_equal(mask.numpy(), want[1])


def test_a_state_of_another_mix_is_refused_and_its_own_resumes(two):
    read = _mixed(two, seed=0)
    state = ReadState(**(read._tfshards_reader.identity | {"epoch": 1, "records_done": 16}))
    whole = [_seen(read) for _ in range(2)][1]
    assert _seen(_mixed(two, seed=0, start=state))[:24] == whole[16:]  # one epoch long
    for other in ({"weights": {"a": 0.5, "b": 0.5}}, {"epoch_size": 48}):
        with pytest.raises(ResumeError, match="made with"):
            list(_mixed(two, seed=0, start=state, **other))


def test_mixed_pipelines_read_equal_batches_that_make_up_the_epoch(two):
    import tensorflow as tf

    single = _seen(_mixed(two, seed=1))
    parts = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(2, pipeline, 1)
        read = _mixed(two, seed=1, batch_size=8, input_context=context)
        parts.append([_seen([batch]) for batch in read])
    assert len(parts[0]) == len(parts[1]) == 2  # 40 records: 2 whole rounds of 2 x 8
    rounds = [x + y for x, y in zip(parts[0], parts[1], strict=True)]
    assert sum(rounds, []) == single[:32]  # the one global order, cut per round


def test_a_mixed_cache_keeps_one_entry_per_dataset_and_serves_later_epochs(two, tmp_path):
    read = _mixed(two, weights={"a": 1, "b": 1}, epoch_size=80, seed=0, cache=tmp_path)
    first = _seen(read)  # 40 of each: every record of both drawn in the first epoch
    entries = tfshards.list_caches(tmp_path)
    assert sorted(e.info.records for e in entries) == [15, 40]
    assert {e.state for e in entries} == {"ready"}
    again = _mixed(two, weights={"a": 1, "b": 1}, epoch_size=80, seed=0, cache=tmp_path)
    assert _seen(again) == first and _seen(again) == _seen(
        _mixed(two, weights={"a": 1, "b": 1}, epoch_size=80, seed=0, start=(1, 0))
    )


# Point 3: one taxonomy -------------------------------------------------------------------

B_MAP = {"b": tfshards.Source, "label_map": {2: 3}, "unannotated": [2]}


def _taxonomy(two) -> dict:
    """b's class 2 is a's class 3; b never annotated shared class 2 (its own 0 holds it),
    so b's 0 pixels are ignored: [0, 1, 2] -> [255, 1, 3]."""
    return {"a": two["a"], "b": tfshards.Source(two["b"], label_map={2: 3, 0: 2}, unannotated=[2])}


def test_each_dataset_is_read_through_its_map_into_one_taxonomy(two):
    plain = {
        name: tfshards.read(two[name], batch_size=64, image_dtype="uint8", shuffle=False)
        for name in two
    }
    stored = {}
    for name, read in plain.items():
        for image, mask in read:
            for index, m in zip(image[:, 0, 0, 0].numpy(), mask.numpy(), strict=True):
                stored[TAGS[name], int(index)] = m
    lookup = {1: np.array([0, 1, 2, 3]), 2: np.array([255, 1, 3])}
    read = _mixed(_taxonomy(two), weights=[1, 1], seed=0)
    checked = 0
    for image, mask in read:
        for (index, tag), m in zip(image[:, 0, 0, :2].numpy(), mask.numpy(), strict=True):
            assert np.array_equal(m, lookup[tag][stored[tag, index]])  # pixel by pixel
            checked += tag == 2
    assert checked >= 15


def test_class_weights_and_the_report_are_in_the_shared_taxonomy(two):
    sources = _taxonomy(two)
    report = tfshards.mix_exposure(sources, weights=[0.5, 0.5], epoch_size=30)
    assert report.pixels.shape == (2, 4) and report.epoch_records == 30
    assert report.pixels[1, 0] == 0 and report.pixels[1, 2] == 0  # b: ignored, never mapped
    b_pixels = tfshards.info(two["b"]).class_pixels("train")
    assert report.pixels[1, 3] == pytest.approx(b_pixels[2] * 15 / SIZES["b"])
    weights = tfshards.class_weights(sources, weights=[0.5, 0.5], epoch_size=30)
    assert sorted(weights) == [0, 1, 2, 3, 255] and weights[255] == 0
    total = report.pixels.sum(axis=0)
    assert weights[0] / weights[3] == pytest.approx(total[3] / total[0])


def test_datasets_of_different_sizes_mix_with_crop_size_or_image_size(two, tmp_path):
    large = _dataset(tmp_path / "big", "b", 10, side=16)
    sources = {"a": two["a"], "b": large}
    with pytest.raises(OptionsError, match=r"'a' and 'b' differ in size \(8x8 and 16x16\)"):
        _mixed(sources, weights=[1, 1])
    for sizing in ({"crop_size": (8, 8)}, {"image_size": (8, 8)}):
        read = _mixed(sources, weights=[1, 1], epoch_size=20, seed=0, **sizing)
        seen = _seen(read)
        assert len(seen) == 20 and {t for t, _ in seen} == {1, 2}
    for image, mask in _mixed(sources, weights=[1, 1], epoch_size=20, crop_size=(8, 8)):
        assert image.shape[1:] == (8, 8, 3) and mask.shape[1:] == (8, 8, 1)


def test_datasets_of_other_channels_or_ignore_labels_are_refused_naming_both(two, tmp_path):
    gray = _dataset(tmp_path / "gray", "b", 6, channels=1)
    with pytest.raises(OptionsError, match=r"'a' and 'g' differ in image channels \(3 and 1\)"):
        _mixed({"a": two["a"], "g": gray}, weights=[1, 1])
    deep = tmp_path / "deep"  # 3 channels of uint16 (.npy images)
    (deep / "images").mkdir(parents=True), (deep / "masks").mkdir()
    for index in range(6):
        np.save(deep / "images" / f"{index:03d}.npy", np.full((8, 8, 3), 40_000, np.uint16))
        Image.fromarray(_mask("b", index, 8)).save(deep / "masks" / f"{index:03d}.png")
    tfshards.convert(deep / "images", deep / "masks", deep / "out", num_classes=3,
                     encoding="raw", progress=False)  # fmt: skip
    with pytest.raises(
        OptionsError, match=r"'a' and 'u' differ in image dtype \(uint8 and uint16\)"
    ):
        tfshards.read({"a": two["a"], "u": deep / "out"}, weights=[1, 1])  # float32
    ignoring = _dataset(tmp_path / "ignoring", "b", 6, ignore_label=255)
    with pytest.raises(OptionsError, match=r"'a' and 'i' declare different ignore labels"):
        _mixed({"a": two["a"], "i": ignoring}, weights=[1, 1])


# Point 2: per-dataset subsets and sampling -----------------------------------------------


def test_a_subset_of_one_dataset_and_class_balance_within_another(two):
    keys = [f"{i:03d}" for i in range(10)]
    balanced = tfshards.ClassBalanced(exclude=[0, 1])
    sources = {
        "a": tfshards.Source(two["a"], sampling=balanced),
        "b": tfshards.Source(two["b"], records=keys),
    }
    for epoch in _epochs(_mixed(sources, weights=[0.5, 0.5], epoch_size=40, seed=1), 3):
        b = sorted(index for tag, index in epoch if tag == 2)
        assert b == sorted(list(range(10)) * 2)  # its 10 records, each twice
        a = [index for tag, index in epoch if tag == 1]
        assert len(a) == 20 and sum(i % 4 == 0 for i in a) >= 8  # class 3: half the draws


# Point 5: the report ---------------------------------------------------------------------


def test_the_report_gives_each_dataset_and_class_share_of_an_epoch(two, capsys):
    from tfshards.cli import main

    report = tfshards.mix_exposure(two, weights={"a": 0.75, "b": 0.25}, epoch_size=40)
    assert report.source_share.tolist() == [0.75, 0.25]
    assert report.records.tolist() == [30, 10]
    a_holding = np.mean([i % 4 == 0 for i in range(40)])  # class 3, a only
    assert report.class_record_share[3] == pytest.approx(0.75 * a_holding)
    read = _mixed(two, seed=0)
    seen = np.concatenate(
        [[(m == 3).any() for m in mask.numpy()] for _ in range(10) for _, mask in read]
    )
    assert abs(seen.mean() - report.class_record_share[3]) < 0.03  # over 10 epochs
    assert main(["inspect", f"a={two['a']}", f"b={two['b']}", "--weights", "3", "1"]) == 0
    out = capsys.readouterr().out
    assert "one epoch of 55 records" in out and "75.0%" in out and "25.0%" in out
    assert main(["inspect", f"a={two['a']}", f"b={two['b']}", "--weights", "3", "1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [d["share"] for d in shown["datasets"]] == [0.75, 0.25]
    assert shown["classes"][3]["pixels_from"] == {"a": 1.0, "b": 0.0}


# Point 6: bad input, refused before the first batch --------------------------------------


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"weights": None}, r"need weights="),
        ({"weights": {"a": 1}}, r"missing \['b'\]"),
        ({"weights": {"a": 1, "b": 1, "c": 1}}, r"unknown \['c'\]"),
        ({"weights": [1]}, r"1 weights for 2 datasets"),
        ({"weights": {"a": -1, "b": 1}}, r"'a' must be a finite number >= 0"),
        ({"weights": {"a": float("nan"), "b": 1}}, r"'a' must be a finite number >= 0"),
        ({"weights": [0, 0]}, r"all zero"),
        ({"weights": [1, 1], "records": [0]}, r"records= with several datasets"),
        ({"weights": [1, 1], "label_map": {1: 0}}, r"label_map= with several datasets"),
        ({"weights": [1, 1], "epoch_size": 0}, r"epoch_size"),
        ({"weights": [1, 1], "normalize": True}, r"normalize=True with several datasets"),
        ({"weights": [1, 1], "num_classes": 3}, r"'a'.*reads classes \[3\]"),
    ],
)
def test_bad_mixes_are_refused(two, arguments, match):
    with pytest.raises(OptionsError, match=match):
        tfshards.read(two, **arguments)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ({"label_map": {5: 1}}, r"dataset 'b'.*5 is not one of its 3 classes"),
        ({"label_map": {1: 9}, "unannotated": []}, r"reads classes \[9\] but the shared"),
        ({"unannotated": [7]}, r"unannotated of dataset 'b': class 7 is outside"),
        ({"records": ["nope"]}, r"dataset 'b': records=.*nope"),
        ({"sampling": [1.0]}, r"dataset 'b': sampling= needs one weight per record"),
    ],
)
def test_bad_sources_are_refused_naming_them(two, source, match):
    sources = {"a": two["a"], "b": tfshards.Source(two["b"], **source)}
    with pytest.raises(OptionsError, match=match):
        tfshards.read(sources, weights=[1, 1], num_classes=4)


# Pairs: the same for PyTorch and Grain ---------------------------------------------------


def test_pairs_read_a_label_map_like_read(two):
    pairs = tfshards.Pairs(two["a"], label_map={3: 1, 2: None})
    plain = tfshards.Pairs(two["a"])
    lookup = np.array([0, 1, 255, 1])
    for index in range(len(pairs)):
        assert np.array_equal(pairs[index][1], lookup[plain[index][1]])
        assert pairs[index][1].dtype == np.uint8


def test_mixed_pairs_give_reads_epochs_and_pairs(two):
    sources = _taxonomy(two)
    pairs = tfshards.Pairs(sources, weights=[0.75, 0.25], epoch_size=40, seed=4)
    assert isinstance(pairs, tfshards.Pairs) and len(pairs) == 55
    read = _mixed(sources, weights=[0.75, 0.25], seed=4)
    for epoch in range(2):
        batches = [(i.numpy(), m.numpy()) for i, m in read]
        images = np.concatenate([i for i, _ in batches])
        masks = np.concatenate([m for _, m in batches])
        got = pairs.__getitems__(pairs.epoch(epoch).tolist())
        assert np.array_equal(np.stack([g[0] for g in got]), images)
        assert np.array_equal(np.stack([g[1] for g in got]).astype(np.int32), masks)


def test_one_split_given_twice_is_refused(two):
    with pytest.raises(OptionsError, match=r"'a' and 'again' are the same split of one dataset"):
        tfshards.read({"a": two["a"], "again": two["a"]}, weights=[1, 1])


def test_exposure_takes_a_label_map_as_read_does(two):
    report = tfshards.exposure(two["a"], label_map={3: 1}, epoch_size=40)
    plain = tfshards.exposure(two["a"], epoch_size=40)
    assert len(report.pixels) == 3
    assert report.pixels[1] == pytest.approx(plain.pixels[1] + plain.pixels[3])


def test_a_dataset_in_a_bucket_mixes_with_a_local_one(two, s3_bucket, tmp_path):
    from s3_server import upload_folder

    url = f"{s3_bucket}/b"
    upload_folder(two["b"], url)
    options = tfshards.ReadOptions(shard_cache=tmp_path / "shards")
    local = _seen(_mixed(two, seed=3, weights=[1, 1]))
    remote = _seen(_mixed({"a": two["a"], "b": url}, seed=3, weights=[1, 1], options=options))
    assert remote == local  # the same records in the same order, wherever they are
    resumed = _mixed(
        {"a": two["a"], "b": url}, seed=3, weights=[1, 1], options=options, start=(0, 2)
    )
    assert _seen(resumed)[:24] == local[16:]  # an iteration is one epoch long


def test_resume_callback_resumes_a_mixed_fit_where_it_stopped(two, tmp_path):
    import keras

    class Stop(keras.callbacks.Callback):
        def __init__(self, at: int) -> None:
            super().__init__()
            self.at, self.steps = at, []

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append(batch)
            if len(self.steps) == self.at:
                raise RuntimeError("interrupted")

    def fit(stop_at: int) -> list[int]:
        train = _mixed(two, seed=5, image_dtype="float32")
        inputs = keras.Input(train.element_spec[0].shape[1:])
        model = keras.Model(inputs, keras.layers.Conv2D(4, 1)(inputs))
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        stop = Stop(stop_at)
        backup = tfshards.ResumeCallback(tmp_path / "backup", train, save_freq=2)
        with contextlib.suppress(RuntimeError):
            model.fit(train, epochs=2, verbose=0, callbacks=[backup, stop])
        return stop.steps

    assert fit(3) == [0, 1, 2]  # saved after step 2, stopped after step 3
    assert fit(99) == [0, 1, 2, 0, 1, 2, 3, 4]  # the 3 batches left of epoch 0, then epoch 1


def test_class_balanced_crops_of_a_mixed_source_find_their_class(two):
    balanced = tfshards.ClassBalanced(exclude=[0, 1, 2])  # a: drawn for class 3 only
    sources = {"a": tfshards.Source(two["a"], sampling=balanced), "b": two["b"]}
    read = _mixed(sources, weights=[0.5, 0.5], epoch_size=40, seed=2, crop_size=(4, 4))
    crops = 0
    for image, mask in read:
        for tag, m in zip(image[:, 0, 0, 1].numpy(), mask.numpy(), strict=True):
            if tag == 1:
                assert (m == 3).any()  # centred on a cell of class 3
                crops += 1
    assert crops == 20


def test_a_source_repeated_many_times_is_read_whole_each_time_then_sampled(two):
    read = _mixed(two, weights={"a": 0.02, "b": 0.98}, epoch_size=200, seed=1)
    for epoch in _epochs(read, 2):
        held = np.bincount([i for tag, i in epoch if tag == 2], minlength=SIZES["b"])
        assert held.sum() in (196, 197) and held.max() - held.min() <= 1  # 13 or 14 each


def test_tiny_epochs_and_unshuffled_mixes(two):
    one = _seen(_mixed(two, epoch_size=1, batch_size=1, seed=0))
    assert len(one) == 1
    ordered = _seen(_mixed(two, weights=[1, 1], epoch_size=20, shuffle=False))
    assert [tag for tag, _ in ordered] == [1] * 10 + [2] * 10  # each source in turn
    for tag, name in ((1, "a"), (2, "b")):  # its records in the manifest's order
        pairs = tfshards.Pairs(two[name])
        place = {int(pairs[i][0][0, 0, 0]): i for i in range(len(pairs))}
        records = [place[index] for t, index in ordered if t == tag]
        assert records == sorted(records) and len(set(records)) == 10


def test_class_balance_after_a_label_map_draws_in_the_mapped_classes(two):
    merged = tfshards.ClassBalanced(exclude=[0, 2], ratios={1: 1.0})
    read = tfshards.read(
        two["a"], batch_size=8, seed=0, label_map={3: 1}, sampling=merged, image_dtype="uint8"
    )
    assert sum(len(m) for _, m in read) == SIZES["a"]
    with pytest.raises(OptionsError, match="names class 3, but the dataset has 3 classes"):
        tfshards.read(two["a"], label_map={3: 1}, sampling=tfshards.ClassBalanced(ratios={3: 2}))


def test_mixed_pairs_index_like_a_sequence_and_transform(two):
    pairs = tfshards.Pairs(
        two, weights=[1, 1], with_keys=True, transform=lambda i, m: (i[..., 1].max(), m)
    )
    assert pairs[-1][0] == 2 and pairs[0][0] == 1
    assert pairs[-1][2] == tfshards.Pairs(two["b"]).key(14) == pairs.key(54)
    with pytest.raises(IndexError, match="out of range for 55 pairs"):
        pairs[55]
    with pytest.raises(OptionsError, match="given to each"):
        tfshards.Pairs(two, weights=[1, 1], label_map={1: 0})


def test_one_hot_masks_are_in_the_mapped_classes(two):
    arguments = {"batch_size": 8, "image_dtype": "uint8", "shuffle": False}
    plain = [m.numpy()[..., 0] for _, m in tfshards.read(two["a"], **arguments)]
    mapped = tfshards.read(two["a"], label_map={3: 1, 2: None}, one_hot=True, **arguments)
    lookup = np.array([0, 1, -1, 1])  # -1: ignored, all zeros
    for (_, hot), mask in zip(mapped, plain, strict=True):
        wanted = np.eye(2, dtype=np.float32)[lookup[mask]] * (lookup[mask] >= 0)[..., None]
        assert np.array_equal(hot.numpy(), wanted)
    mixed = _mixed(_taxonomy(two), weights=[1, 1], one_hot=True, seed=0)
    image, hot = next(iter(mixed))
    assert hot.shape[-1] == 4 and set(hot.numpy().sum(-1).ravel().tolist()) <= {0.0, 1.0}


def test_a_keras_layer_and_one_hot_after_a_label_map(two):
    import keras

    flip = keras.layers.RandomFlip("horizontal", seed=0)
    arguments = {"batch_size": 8, "shuffle": False, "label_map": {3: 1}, "one_hot": True}
    for _, hot in tfshards.read(two["a"], augment=flip, **arguments).take(2):
        assert hot.shape[-1] == 3 and np.all(hot.numpy().sum(-1) == 1)


def test_padding_stays_the_ignore_label_through_a_map_and_a_cache(two, tmp_path):
    arguments = {"batch_size": 8, "image_dtype": "uint8", "shuffle": False, "pad_to": (12, 12)}
    for _ in range(2):  # the second read comes from the cache the first built
        read = tfshards.read(two["a"], label_map={3: 1}, cache=tmp_path, **arguments)
        masks = np.concatenate([m.numpy() for _, m in read])
        assert np.all(masks[:, 8:, :] == 255) and np.all(masks[:, :, 8:] == 255)
        assert set(np.unique(masks[:, :8, :8]).tolist()) <= {0, 1, 2}


def test_mixed_sizes_crops_resume_and_read_from_their_caches(two, tmp_path):
    large = _dataset(tmp_path / "big", "b", 10, side=16)
    sources = {"a": two["a"], "b": tfshards.Source(large, label_map={2: 1})}
    arguments = {"weights": [4, 1], "epoch_size": 50, "seed": 3, "crop_size": (6, 6)}
    first = [(i.numpy(), m.numpy()) for i, m in _mixed(sources, cache=tmp_path / "c", **arguments)]
    assert {e.state for e in tfshards.list_caches(tmp_path / "c")} == {"ready"}
    cached = _mixed(sources, cache=tmp_path / "c", start=(0, 1), **arguments)
    for (image, mask), (want_image, want_mask) in zip(cached, first[1:], strict=False):
        assert np.array_equal(image.numpy(), want_image)
        assert np.array_equal(mask.numpy(), want_mask)
    assert all(set(np.unique(m).tolist()) <= {0, 1, 2, 3} for _, m in first)


def test_weights_or_num_classes_without_their_counterpart_are_refused(two):
    with pytest.raises(OptionsError, match=r"weights= mixes several datasets"):
        tfshards.read(two["a"], weights=[1])
    with pytest.raises(OptionsError, match=r"num_classes= is the shared taxonomy's size"):
        tfshards.read(two["a"], num_classes=3)
    with pytest.raises(OptionsError, match=r"empty mapping"):
        tfshards.read({}, weights={})
    with pytest.raises(OptionsError, match=r"a path or tfshards.Source"):
        tfshards.read({"a": 3}, weights=[1])


# Found by trying to break the mix -------------------------------------------------------


def test_weights_near_the_float_maximum_keep_their_shares(two):
    report = tfshards.mix_exposure(two, weights=[1e308, 1e308], epoch_size=40)
    assert report.source_share.tolist() == [0.5, 0.5]  # their sum overflowed: all to b
    seen = _seen(_mixed(two, weights={"a": 1e308, "b": 1e308}, epoch_size=40, seed=0))
    assert sum(tag == 1 for tag, _ in seen) == 20


def test_unannotated_given_as_one_class_is_refused_naming_the_dataset(two):
    sources = {"a": two["a"], "b": tfshards.Source(two["b"], unannotated=1)}
    with pytest.raises(OptionsError, match=r"unannotated of dataset 'b' is a list"):
        tfshards.read(sources, weights=[1, 1])  # was a TypeError from list(1)


def test_a_dataset_of_weight_zero_has_no_cache_entry_and_the_mix_cache_gets_ready(two, tmp_path):
    weights = {"a": 1, "b": 0}
    first = _seen(_mixed(two, weights=weights, epoch_size=80, seed=0, cache=tmp_path))
    assert {tag for tag, _ in first} == {1}  # b is never read
    entries = tfshards.list_caches(tmp_path)  # was also b's, never filled: never ready
    assert [(e.info.records, e.state) for e in entries] == [(40, "ready")]
    again = _mixed(two, weights=weights, epoch_size=80, seed=0, cache=tmp_path)
    assert again._tfshards_reader.store.ready and _seen(again) == first


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda t: tfshards.class_weights(t, weights=[1, 1], label_map={1: 0}), "given to each"),
        (lambda t: tfshards.class_weights(t, weights=[1, 1], records=["000"]), "given to each"),
        (
            lambda t: tfshards.class_weights(t, weights=[1, 1], sampling=tfshards.ClassBalanced()),
            "given to each",
        ),
        (lambda t: tfshards.class_weights(t["a"], weights=[1]), "weights= mixes several"),
        (lambda t: tfshards.class_weights(t["a"], num_classes=6), "num_classes= is the shared"),
        (lambda t: tfshards.info(t["a"], num_classes=6), "num_classes= is the shared"),
        (lambda t: tfshards.info(t, label_map={1: 0}), r"info\(\) reads one dataset"),
    ],
)
def test_info_and_class_weights_refuse_what_read_refuses(two, call, match):
    with pytest.raises(OptionsError, match=match):  # were silently ignored (info: TypeError)
        call(two)


@pytest.mark.parametrize(
    ("other", "named"),
    [
        ({"weights": {"a": 0.5, "b": 0.5}}, "weights= differ"),
        ({"epoch_size": 48}, "epoch_size= differ"),
        ({"path": "swapped"}, "the datasets (their names, order, shards or splits) differ"),
        ({"path": "mapped"}, "label_map or unannotated (or num_classes=) differ"),
        ({"path": "subset"}, "a dataset's records= or sampling= differ"),
        ({"path": "alone"}, "made by a read of several datasets, this read reads one"),
    ],
)
def test_a_state_of_another_mix_is_refused_naming_what_differs(two, other, named):
    identity = _mixed(two, seed=0)._tfshards_reader.identity
    state = ReadState(**(identity | {"epoch": 1, "records_done": 8}))
    paths = {
        "swapped": {"b": two["b"], "a": two["a"]},
        "mapped": {"a": two["a"], "b": tfshards.Source(two["b"], label_map={2: 1})},
        "subset": {"a": two["a"], "b": tfshards.Source(two["b"], records=["000", "001"])},
    }
    path = paths.get(other.pop("path", None), two)
    with pytest.raises(ResumeError, match=re.escape(named)):  # was: two digests, no words
        if path is two and named.startswith("made by"):
            list(tfshards.read(two["a"], batch_size=8, seed=0, start=state))
        else:
            list(_mixed(path, seed=0, start=state, **other))


def test_the_report_and_pairs_refuse_a_mix_that_read_refuses(two, tmp_path, capsys):
    from tfshards.cli import main

    twice = {"a": two["a"], "again": two["a"]}
    with pytest.raises(OptionsError, match=r"'a' and 'again' are the same split"):
        tfshards.mix_exposure(twice, weights=[1, 1])  # was a report of 80 records
    with pytest.raises(OptionsError, match=r"'a' and 'again' are the same split"):
        tfshards.Pairs(twice, weights=[1, 1])
    gray = _dataset(tmp_path / "gray", "b", 6, channels=1)
    with pytest.raises(OptionsError, match=r"'a' and 'g' differ in image channels \(3 and 1\)"):
        tfshards.Pairs({"a": two["a"], "g": gray}, weights=[1, 1])  # pairs of two kinds
    command = ["inspect", f"a={two['a']}", f"b={two['b']}", "--weights", "1", "1"]
    assert main([*command, "--exclude", "0"]) == 2  # was ignored without a word
    assert "--exclude take one dataset" in capsys.readouterr().err
    assert main([*command[:2], f"again={two['a']}", "--weights", "1", "1"]) == 2
    assert "are the same split of one dataset" in capsys.readouterr().err


def test_a_missing_dataset_or_split_and_a_too_short_mix_are_named(two, tmp_path):
    from tfshards.errors import ManifestError

    missing = {"a": two["a"], "gone": tmp_path / "nothing"}
    other = {"a": two["a"], "v": tfshards.Source(two["b"], split="val")}
    for sources, match in ((missing, r"dataset 'gone': .*nothing"), (other, "dataset 'v': ")):
        with pytest.raises(ManifestError, match=match):  # was the bare path or split
            tfshards.read(sources, weights=[1, 1])
        with pytest.raises(ManifestError, match=match):
            tfshards.mix_exposure(sources, weights=[1, 1])
        with pytest.raises(ManifestError, match=match):
            tfshards.Pairs(sources, weights=[1, 1])
    with pytest.raises(OptionsError, match="dataset 'b': records="):
        tfshards.mix_exposure({"a": two["a"], "b": tfshards.Source(two["b"], records=["x"])},
                              weights=[1, 1])  # fmt: skip
    with pytest.raises(OptionsError, match=r"the epoch of the datasets 'a', 'b' mixed"):
        _mixed(two, weights=[1, 1], epoch_size=3, batch_size=8, drop_remainder=True)


def test_odd_weights_and_arguments_are_refused_not_a_python_error(two):
    for weights in ([10**400, 1], [True, 1], [1j, 1]):  # 10**400: was a TypeError
        with pytest.raises(OptionsError, match="'a' must be a finite number >= 0"):
            tfshards.mix_exposure(two, weights=weights)
    with pytest.raises(OptionsError, match="a mapping {name: path or tfshards.Source}"):
        tfshards.mix_exposure(two["a"], weights=[1])  # was an AttributeError
    with pytest.raises(OptionsError, match=r"path must be a folder path or URL.*\(Source\)"):
        tfshards.class_weights(tfshards.Source(two["a"], label_map={3: 1}))  # TypeError
    with pytest.raises(OptionsError, match=r"exposure\(\) reads one dataset"):
        tfshards.exposure(two, epoch_size=10)  # a TypeError from the path
    with pytest.raises(OptionsError, match=r"path must be a folder path or URL.*\(Source\)"):
        tfshards.exposure(tfshards.Source(two["a"]))


def test_the_reports_columns_line_up_with_long_names(two):
    long = {"cityscapes_fine": two["a"], "b": two["b"]}
    text = tfshards.mix_exposure(long, weights=[0.5, 0.5], epoch_size=20).describe()
    rows = text.splitlines()
    header, first, second = rows[1], rows[2], rows[3]  # were shifted by the long name
    assert len(header) == len(first) == len(second)
    assert header.index("records") + 7 == first.index("10.0") + 4 == second.index("10.0") + 4
    shares = rows[5:]
    assert len({len(row) for row in shares}) == 1


def test_mixed_pairs_prefetch_takes_indices_as_indexing_does(two):
    pairs = tfshards.Pairs(two, weights=[1, 1])
    pairs.prefetch([-1, -55, 0, 54])  # -1 was looked up in b as -41: an IndexError
    with pytest.raises(IndexError, match="out of range for 55 pairs"):
        pairs.prefetch([55])


def test_inspect_takes_a_folder_whose_path_holds_an_equals_sign(two, tmp_path, capsys):
    import shutil

    from tfshards.cli import main

    odd = tmp_path / "lr=0.1" / "shards"
    shutil.copytree(two["b"], odd)
    assert main(["inspect", f"a={two['a']}", str(odd), "--weights", "1", "1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)  # was read as dataset ".../lr", path "0.1/..."
    assert [d["name"] for d in shown["datasets"]] == ["a", str(odd)]
    assert main(["inspect", f"b={odd}", "--weights", "1"]) == 0


def test_a_state_of_one_dataset_or_an_older_mix_is_refused_by_a_mix_saying_so(two):
    identity = _mixed(two, seed=0)._tfshards_reader.identity
    older = identity | {"sampling": "d703d2b2d287fea2", "epoch": 0, "records_done": 8}
    with pytest.raises(ResumeError, match="not made by a mix of several datasets"):
        list(_mixed(two, seed=0, start=ReadState(**older)))  # was: "a read of one dataset"


def test_a_key_given_twice_in_records_is_named_as_a_key(two):
    sources = {"a": two["a"], "b": tfshards.Source(two["b"], records=["000", "004", "000"])}
    with pytest.raises(OptionsError, match=r"dataset 'b': records= names keys more than once "
                       r"\(\['000'\]\)"):  # fmt: skip
        tfshards.read(sources, weights=[1, 1])  # was "only 0s and 1s ... a mask of 0/1 integers?"


@pytest.mark.parametrize("classes", [4.0, "4", 0, -1, True])
def test_a_mixs_num_classes_is_checked_like_one_datasets(two, classes):
    match = rf"num_classes must be an integer >= 1, got {re.escape(repr(classes))}"
    with pytest.raises(OptionsError, match=match):  # 4.0 was read; "4" a NumPy error
        tfshards.read(two, weights=[1, 1], num_classes=classes)
    with pytest.raises(OptionsError, match=match):
        tfshards.mix_exposure(two, weights=[1, 1], num_classes=classes)


def test_a_dataset_of_weight_zero_does_not_lengthen_the_default_epoch(two):
    weights = {"a": 1, "b": 0}
    seen = _seen(_mixed(two, weights=weights, epoch_size=None, seed=0))
    assert sorted(seen) == [(1, i) for i in range(SIZES["a"])]  # was 55: 15 of a twice
    assert len(tfshards.Pairs(two, weights=weights, seed=0).epoch(0)) == SIZES["a"]
    assert tfshards.mix_exposure(two, weights=weights).epoch_records == SIZES["a"]


def test_an_edited_mix_state_is_refused_as_a_resume_error(two):
    identity = _mixed(two, seed=0)._tfshards_reader.identity
    edited = identity | {"sampling": "mix x weights", "epoch": 0, "records_done": 8}
    with pytest.raises(ResumeError, match="another mix: the datasets"):  # was a ValueError
        list(_mixed(two, seed=0, start=ReadState(**edited)))
