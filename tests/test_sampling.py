"""Subsets, weighted and class-balanced epochs (read(records=, sampling=, epoch_size=))."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tfshards
from tests.conftest import run_json_script
from tfshards.errors import OptionsError
from tfshards.readers.order import EpochOrder
from tfshards.readers.resume import ReadState, ResumeError
from tfshards.readers.sampling import ClassBalanced, SampledOrder, low_variance_counts
from tfshards.readers.selection import select
from tfshards.schemas.record_table import RecordTable, record_row

RECORDS = 100
RARE = 3  # in records 7 and 57: 2% of them


def _mask(index: int) -> np.ndarray:
    mask = np.zeros((8, 8), np.uint8)
    if index % 5 < 2:
        mask[:4, :4] = 1  # 40% of the records
    if index % 10 < 3:
        mask[4:, 4:] = 2  # 30%
    if index % 50 == 7:
        mask[6:, :2] = RARE
    return mask


@pytest.fixture(scope="module")
def rare(tmp_path_factory) -> Path:
    """100 pairs of 8x8 in 4 shards; each image's pixels are its index (to find it again)."""
    root = tmp_path_factory.mktemp("rare")
    (root / "images").mkdir()
    (root / "masks").mkdir()
    for index in range(RECORDS):
        image = np.full((8, 8, 3), index, np.uint8)
        Image.fromarray(image).save(root / "images" / f"{index:03d}.png")
        Image.fromarray(_mask(index)).save(root / "masks" / f"{index:03d}.png")
    options = tfshards.ConvertOptions(num_shards=4, encoding="raw", num_classes=4)
    tfshards.convert(root / "images", root / "masks", root / "out", options=options)
    return root / "out"


def _table() -> RecordTable:
    return RecordTable.from_rows((record_row(f"{i:03d}", _mask(i), None) for i in range(100)), 4)


def _pairs_read(dataset, **arguments) -> list[list[int]]:
    """Each batch's pairs, as the indices written into their images."""
    read = tfshards.read(dataset, batch_size=8, image_dtype="uint8", **arguments)
    return [image[:, 0, 0, 0].numpy().tolist() for image, _ in read]


def _key_order(dataset) -> list[int]:
    """Record index (manifest order) -> the pair index written into its image."""
    pairs = tfshards.Pairs(dataset)
    return [int(pairs[i][0][0, 0, 0]) for i in range(len(pairs))]


def test_a_subset_is_read_whole_once_per_epoch_with_its_cardinality(rare):
    keys = [f"{i:03d}" for i in range(0, RECORDS, 3)]  # 34 records
    read = tfshards.read(rare, batch_size=8, seed=2, records=keys, image_dtype="uint8")
    assert read.cardinality().numpy() == 5
    seen = [int(i) for image, _ in read for i in image[:, 0, 0, 0].numpy()]
    assert sorted(seen) == list(range(0, RECORDS, 3))
    again = [int(i) for image, _ in read for i in image[:, 0, 0, 0].numpy()]
    assert sorted(again) == sorted(seen) and again != seen  # another epoch, another order


@pytest.mark.parametrize("form", ["mask", "indices"])
def test_a_subset_as_a_mask_or_indices_reads_those_records(rare, form):
    order = _key_order(rare)
    wanted = np.zeros(RECORDS, bool)
    wanted[[3, 4, 50, 99]] = True
    records = wanted if form == "mask" else np.flatnonzero(wanted)
    seen = sum(_pairs_read(rare, seed=0, records=records), [])
    assert sorted(seen) == sorted(order[i] for i in np.flatnonzero(wanted))


def test_a_sampled_read_resumes_at_any_batch_exactly(rare):
    sampling = ClassBalanced()
    read = tfshards.read(
        rare, batch_size=8, image_dtype="uint8", seed=4, sampling=sampling, epoch_size=40
    )
    epochs = [[b[0][:, 0, 0, 0].numpy().tolist() for b in read] for _ in range(2)]
    assert epochs[0] != epochs[1]
    resumed = _pairs_read(rare, seed=4, sampling=sampling, epoch_size=40, start=(1, 2))
    assert resumed[:3] == epochs[1][2:]  # then epoch 2 (an iteration is one epoch long)


def test_sampled_epochs_are_the_same_in_another_process(rare):
    here = SampledOrder(
        EpochOrder((25, 25, 25, 25), True, 9, 2), select(_table(), None, ClassBalanced(), 64)
    )
    code = (
        "import json, sys; sys.path.insert(0, 'tests')\n"
        "from test_sampling import _table\n"
        "from tfshards.readers.order import EpochOrder\n"
        "from tfshards.readers.sampling import ClassBalanced, SampledOrder\n"
        "from tfshards.readers.selection import select\n"
        "o = SampledOrder(EpochOrder((25,) * 4, True, 9, 2), select(_table(), None, "
        "ClassBalanced(), 64))\n"
        "print(json.dumps([o.records(3).tolist(), o.classes(3).tolist()]))"
    )
    records, classes = run_json_script(code)
    assert records == here.records(3).tolist() and classes == here.classes(3).tolist()


def test_pipelines_read_equal_batches_that_make_up_the_epoch(rare):
    import tensorflow as tf

    arguments = dict(seed=1, sampling=np.linspace(0, 2, RECORDS), epoch_size=64)
    single = sum(_pairs_read(rare, **arguments), [])
    parts = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(2, pipeline, 1)
        parts.append(_pairs_read(rare, input_context=context, **arguments)[:])
    assert len(parts[0]) == len(parts[1]) == 4  # 64 records in rounds of 2 x 8
    rounds = [a + b for a, b in zip(parts[0], parts[1], strict=True)]
    assert sum(rounds, []) == single  # the same global order, cut per round


def test_weighted_counts_are_the_floor_or_ceiling_of_their_expectation():
    rng = np.random.Generator(np.random.PCG64(0))
    weights = np.array([0, 1, 2.5, 0.3, 7, 1e-9, 4])
    expected = weights / weights.sum() * 50
    for _ in range(200):
        counts = low_variance_counts(expected, 50, rng)
        assert counts.sum() == 50
        assert np.all(counts >= np.floor(expected)) and np.all(counts <= np.ceil(expected))
    assert low_variance_counts(expected, 50, rng)[0] == 0


def test_weights_decide_what_an_epoch_reads(rare):
    order = _key_order(rare)
    weights = np.zeros(RECORDS)
    weights[[10, 11]] = [1.0, 3.0]
    seen = sum(_pairs_read(rare, seed=0, sampling=weights, epoch_size=16), [])
    assert sorted(seen) == sorted([order[10]] * 4 + [order[11]] * 12)


def test_class_balance_by_default_shows_a_2_percent_class_in_over_15_percent(rare):
    order = _key_order(rare)
    holders = {order[i] for i in range(RECORDS) if _has_rare(rare, i)}
    assert len(holders) == 2
    for epoch_seed in range(3):
        seen = sum(_pairs_read(rare, seed=epoch_seed, sampling=ClassBalanced()), [])
        assert len(seen) == RECORDS  # epoch_size defaults to the records read
        share = sum(pair in holders for pair in seen) / len(seen)
        assert share >= 0.15, share


def _has_rare(dataset, index: int) -> bool:
    pairs = tfshards.Pairs(dataset)
    return bool((pairs[index][1] == RARE).any())


def test_repeat_factors_weight_records_by_their_rarest_class():
    table = _table()
    balanced = ClassBalanced(rule="repeat_factor", threshold=0.5)
    selection = select(table, None, balanced, None)
    rare = table.presence(RARE)
    assert np.allclose(selection.weights[rare], 5.0)  # sqrt(0.5 / 0.02)
    assert np.all(selection.drawn_class[rare] == RARE)
    only_background = ~table.presence(1) & ~table.presence(2) & ~rare
    assert np.allclose(selection.weights[only_background], 1.0)


def test_class_uniform_draws_each_record_for_a_class_it_holds():
    table = _table()
    balanced = ClassBalanced(exclude=[0], ratios={RARE: 2.0})
    order = SampledOrder(EpochOrder((50, 50), True, 0, 1), select(table, None, balanced, 400))
    records, classes = order.records(0), order.classes(0)
    assert set(classes.tolist()) == {1, 2, RARE}
    assert np.bincount(classes)[RARE] == 200  # ratio 2 of 1 + 1 + 2
    for record, klass in zip(records, classes, strict=True):
        assert table.presence(int(klass))[record]


def test_a_subset_composes_with_class_balance():
    table = _table()
    subset = np.arange(50)  # holds record 7, not 57
    order = SampledOrder(
        EpochOrder((50, 50), True, 0, 1), select(table, subset, ClassBalanced(), None)
    )
    records = order.records(0)
    assert len(records) == 50 and set(records.tolist()) <= set(range(50))
    assert 7 in records.tolist()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"records": ["000", "nope", "also-not"]}, r"2 keys are not in this split: 'nope'"),
        ({"records": []}, "selects no record"),
        ({"records": "000"}, "not one string"),
        ({"records": [1, 1, 2]}, r"more than once \(\[1\]\)"),
        ({"records": [0, 100]}, r"outside the split's 100 records .*\[100\]"),
        ({"records": np.ones(99, bool)}, r"one value per record of the split \(100\), got 99"),
        ({"records": [0.5]}, "got values of type float"),
        ({"records": ["000", 2]}, "one kind at a time; got values of type int, str"),
        ({"records": np.array([0, 1, 1, 0] * 25, np.uint8)}, r"astype\(bool\)"),
        ({"records": [10**30]}, "an index beyond any split"),
        ({"sampling": np.full(100, 1e308), "epoch_size": 0}, "epoch_size"),
        ({"sampling": ["1"] * 100}, "got values of type <U1"),
        ({"sampling": [10**400] * 100}, "one weight per record"),
        ({"sampling": np.ones(99)}, r"one weight per record of the split \(100\)"),
        ({"sampling": np.r_[-1.0, np.ones(99)]}, r"negative at records \[0\]"),
        ({"sampling": np.r_[np.nan, np.ones(99)]}, r"not finite at records \[0\]"),
        ({"sampling": np.zeros(100)}, "all zero"),
        ({"sampling": "heavy"}, "one weight per record"),
        ({"sampling": np.ones(100), "epoch_size": 0}, "epoch_size"),
        ({"sampling": np.ones(100), "epoch_size": 10**12}, r"epoch_size must be an integer in"),
        ({"sampling": ClassBalanced(exclude=[0, 1, 2, 3])}, "leaves no class to draw for"),
        ({"sampling": ClassBalanced(ratios={9: 1.0})}, "names class 9, but the dataset has 4"),
    ],
)
def test_bad_selections_are_refused_before_the_first_batch(rare, arguments, message):
    with pytest.raises(OptionsError, match=message):
        tfshards.read(rare, batch_size=4, **arguments)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"rule": "lvis"}, "rule must be one of"),
        ({"ratios": {1: -1}}, r"ratios\[1\] must be a finite number >= 0"),
        ({"exclude": [-1]}, "exclude takes class indices"),
        ({"threshold": 0}, "threshold must be in"),
        ({"crop_fraction": 1.5}, "crop_fraction must be in"),
    ],
)
def test_bad_class_balance_arguments_are_refused(arguments, message):
    with pytest.raises(OptionsError, match=message):
        ClassBalanced(**arguments)


def test_sampling_with_the_data_service_is_refused(rare):
    with pytest.raises(OptionsError, match="sampling= and service cannot be combined"):
        tfshards.read(rare, sampling=ClassBalanced(), service="grpc://127.0.0.1:1")


def test_a_state_of_another_selection_is_refused(rare):
    read = tfshards.read(rare, batch_size=4, seed=0, records=np.arange(40))
    state = read._tfshards_reader.identity | {"epoch": 0, "records_done": 8}
    assert state["records"] == 40 and state["sampling"]
    other = tfshards.read(rare, batch_size=4, seed=0, records=np.arange(1, 41))
    with pytest.raises(ResumeError, match="made with sampling="):
        list(
            tfshards.read(
                rare, batch_size=4, seed=0, records=np.arange(1, 41), start=ReadState(**state)
            )
        )
    assert other.cardinality().numpy() == 10
    resumed = tfshards.read(
        rare, batch_size=4, seed=0, records=np.arange(40), start=ReadState(**state)
    )
    assert resumed.cardinality().numpy() == 10


def test_a_cached_subset_holds_only_its_records_and_serves_the_next_epoch(rare, tmp_path):
    cache = tmp_path / "cache"
    read = tfshards.read(
        rare, batch_size=8, seed=0, records=np.arange(20), cache=cache, image_dtype="uint8"
    )
    first = sorted(int(i) for image, _ in read for i in image[:, 0, 0, 0].numpy())
    (entry,) = [e for e in tfshards.list_caches(cache) if e.state == "ready"]
    assert entry.info.records == 20
    files = {p.name: p.stat().st_size for p in Path(entry.path).rglob("pairs.image")}
    assert list(files.values()) == [20 * 8 * 8 * 3]
    second = sorted(int(i) for image, _ in read for i in image[:, 0, 0, 0].numpy())
    assert second == first
    other = tfshards.read(rare, batch_size=8, seed=0, records=np.arange(10), cache=cache)
    list(other)
    assert len([e for e in tfshards.list_caches(cache) if e.state == "ready"]) == 2


def test_pairs_take_a_subset(rare):
    pairs = tfshards.Pairs(rare, with_keys=True, records=["005", "001", "090"])
    assert len(pairs) == 3
    keys = sorted(pairs[i][2] for i in range(3))
    assert keys == ["001", "005", "090"]
    assert pairs.record_index(-1) == max(pairs.selected)
    with pytest.raises(IndexError):
        pairs[3]
    with pytest.raises(OptionsError, match="not in this split: 'x'"):
        tfshards.Pairs(rare, records=["x"])


def test_folds_put_each_record_in_one_validation_fold_and_spread_a_rare_class():
    table = _table()
    folds = tfshards.folds(table, 5, seed=3)
    validation = np.concatenate([val for _, val in folds])
    assert sorted(validation.tolist()) == list(range(RECORDS))
    for train, val in folds:
        assert not set(train.tolist()) & set(val.tolist())
        assert len(val) == 20
    rare_folds = [f for f, (_, val) in enumerate(folds) if table.presence(RARE)[val].any()]
    assert len(rare_folds) == 2  # its 2 records in 2 folds
    with pytest.raises(OptionsError, match="k must be"):
        tfshards.folds(table, 1)


def test_digests_differ_for_every_selection():
    table = _table()
    digests = {
        select(table, np.arange(10), None, None).digest,
        select(table, np.arange(11), None, None).digest,
        select(table, None, np.ones(100), None).digest,
        select(table, None, np.ones(100), 50).digest,
        select(table, None, ClassBalanced(), None).digest,
        select(table, None, ClassBalanced(rule="repeat_factor"), None).digest,
    }
    assert len(digests) == 6 and "" not in digests
    assert select(table, None, None, None).digest == ""
    assert hashlib.sha256  # digests are sha256 prefixes: 16 hex digits
    assert all(len(d) == 16 for d in digests)


def test_exposure_is_what_sampled_epochs_show_on_average():
    from tfshards.checks.exposure import exposure_of

    table = _table()
    selection = select(table, None, ClassBalanced(exclude=[0]), 60)
    report = exposure_of(table, selection)
    order = SampledOrder(EpochOrder((50, 50), True, 1, 1), selection)
    pixels = np.asarray(table.class_pixels)
    shown = sum(pixels[order.records(e)].sum(axis=0) for e in range(300)) / 300
    assert np.allclose(report.pixels, shown, rtol=0.03)
    held = sum((pixels[order.records(e)] > 0).mean(axis=0) for e in range(300)) / 300
    assert np.allclose(report.record_share, held, atol=0.01)
    assert report.uniform_record_share[RARE] == pytest.approx(0.02)
    assert report.record_share[RARE] > 0.3  # a third of the draws are for it
    assert np.allclose(report.uniform_pixels, pixels.sum(axis=0))


def test_class_weights_follow_the_sampled_exposure(rare):
    plain = tfshards.class_weights(rare)
    sampled = tfshards.class_weights(rare, sampling=ClassBalanced(exclude=[0]))
    shown = tfshards.exposure(rare, sampling=ClassBalanced(exclude=[0])).pixels
    median = float(np.median(shown[shown > 0]))
    assert sampled == pytest.approx({c: median / shown[c] for c in range(4)})
    assert sampled[RARE] < plain[RARE]  # shown more often: weighted less


def test_inspect_prints_a_sampled_epochs_shares(rare, capsys):
    from tfshards.cli import main

    assert main(["inspect", str(rare), "--sampling", "class_uniform", "--exclude", "0"]) == 0
    out = capsys.readouterr().out
    assert "one epoch of 100 records, sampled vs every record once" in out
    report = out.split("sampled vs every record once")[1]
    row = next(line for line in report.splitlines() if line.strip().startswith(f"{RARE} "))
    assert row.split()[-1] == "2.00%"  # every record once: 2 of 100 hold it


def test_keys_of_any_length_are_found_by_value():
    keys = ["a", "bb", "b\x00", "é", "zz", "a1", "", "bb2", "x\udcff"]  # \udcff: not UTF-8
    rows = [record_row(key, np.zeros((2, 2), np.uint8), None) for key in keys]
    table = RecordTable.from_rows(rows, 1)
    asked = ["zz", "a", "é", "bb2", "", "b\x00", "x\udcff"]
    assert table.keys.positions(asked).tolist() == [keys.index(k) for k in asked]
    with pytest.raises(Exception, match=r"1 keys are not in this split: 'q'"):
        table.keys.positions(["q", "a"])


def test_records_outside_a_subset_are_never_read(rare, tmp_path):
    """A flipped byte in a record outside the subset: the subset reads (each record read
    is CRC-checked), the whole split does not."""
    import shutil

    from tfshards import Manifest
    from tfshards.schemas.offsets import scan_offsets

    dataset = tmp_path / "copy"
    shutil.copytree(rare, dataset)
    first = Manifest.load(dataset).splits["train"].shards[0]
    offsets = scan_offsets(dataset / first.file)
    with open(dataset / first.file, "r+b") as shard:  # record 0's data, mid-way
        shard.seek(int(offsets.starts[0] + offsets.lengths[0] // 2))
        byte = shard.read(1)
        shard.seek(-1, 1)
        shard.write(bytes([byte[0] ^ 0xFF]))
    subset = np.arange(1, RECORDS)
    assert len(sum(_pairs_read(dataset, seed=0, records=subset), [])) == RECORDS - 1
    assert len(tfshards.Pairs(dataset, records=subset)[0]) == 2
    with pytest.raises(Exception, match="CRC|crc|checksum"):
        _pairs_read(dataset, seed=0)


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> Path:
    """40 pairs of 128x128: class 1 in stripes, class 3 an 8x8 square in 8 of them, at a
    different place in each."""
    root = tmp_path_factory.mktemp("large")
    (root / "images").mkdir()
    (root / "masks").mkdir()
    rng = np.random.default_rng(5)
    for index in range(40):
        mask = np.zeros((128, 128), np.uint8)
        mask[::16] = 1
        if index % 5 == 0:
            top, left = rng.integers(0, 120, 2)
            mask[top : top + 8, left : left + 8] = RARE
        image = np.full((128, 128, 3), index, np.uint8)
        Image.fromarray(image).save(root / "images" / f"{index:03d}.png")
        Image.fromarray(mask).save(root / "masks" / f"{index:03d}.png")
    options = tfshards.ConvertOptions(num_shards=2, encoding="raw", num_classes=4)
    tfshards.convert(root / "images", root / "masks", root / "out", options=options)
    return root / "out"


def _crops(dataset, fraction: float, **arguments) -> list[np.ndarray]:
    balanced = ClassBalanced(exclude=[0, 1], crop_fraction=fraction)
    read = tfshards.read(
        dataset, batch_size=8, crop_size=(32, 32), sampling=balanced, image_dtype="uint8",
        **arguments,
    )  # fmt: skip
    return [mask.numpy() for _, mask in read]


def test_class_balanced_crops_find_the_class_they_were_drawn_for(large):
    for seed in range(3):
        masks = np.concatenate(_crops(large, 1.0, seed=seed))
        assert len(masks) == 40
        assert all((m == RARE).any() for m in masks), "a crop drawn for class 3 missed it"
    uniform = np.concatenate(_crops(large, 0.0, seed=0))
    assert np.mean([(m == RARE).any() for m in uniform]) < 0.5


def test_class_balanced_crops_resume_exactly(large):
    read = tfshards.read(
        large, batch_size=8, crop_size=(32, 32), sampling=ClassBalanced(exclude=[0, 1]),
        image_dtype="uint8", seed=3,
    )  # fmt: skip
    epochs = [[mask.numpy() for _, mask in read] for _ in range(2)]
    resumed = _crops(large, 1.0, seed=3, start=(1, 2))
    for mine, theirs in zip(resumed, epochs[1][2:], strict=False):
        np.testing.assert_array_equal(mine, theirs)


def test_huge_and_tiny_weights_draw_as_their_ratios_say():
    table = _table()
    for scale in (1e308, 1e-320):
        order = SampledOrder(EpochOrder((50, 50), True, 0, 1),
                             select(table, None, np.full(100, scale), None))  # fmt: skip
        assert sorted(order.records(0).tolist()) == list(range(100))  # each once


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"ratios": [1, 1, 1, 5]}, r"ratios is a mapping \{class: ratio\}"),
        ({"exclude": 0}, r"exclude is a list of classes"),
        ({"crop_fraction": True}, "crop_fraction must be in"),
        ({"ratios": {3: True}}, r"ratios\[3\] must be a finite number"),
    ],
)
def test_class_balance_arguments_of_the_wrong_shape_are_refused(arguments, message):
    with pytest.raises(OptionsError, match=message):
        ClassBalanced(**arguments)


def test_equal_class_balances_are_one_selection():
    assert ClassBalanced(exclude=[0, 0]) == ClassBalanced(exclude=[0])
    assert hash(ClassBalanced(ratios={1: 2})) == hash(ClassBalanced(ratios={1: 2.0}))
    table = _table()
    same = {  # threshold is not used by class_uniform: it does not change the digest
        select(table, None, ClassBalanced(threshold=0.5), None).digest,
        select(table, None, ClassBalanced(), None).digest,
    }
    assert len(same) == 1


def test_tables_folds_and_inspect_refuse_what_they_cannot_take(rare, capsys):
    from tfshards.cli import main
    from tfshards.errors import RecordTableError

    table = tfshards.records(rare)
    with pytest.raises(RecordTableError, match="class 9 is not one of this table's 4"):
        table.presence(9)
    with pytest.raises(OptionsError, match="folds\\(\\) takes a split's table"):
        tfshards.folds(str(rare), 3)
    with pytest.raises(OptionsError, match="records= takes keys"):
        tfshards.read(rare, records=table)
    assert main(["inspect", str(rare), "--exclude", "0"]) == 2
    assert "go with --sampling" in capsys.readouterr().err
