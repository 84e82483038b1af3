"""tfshards.Pairs as a Grain source: global shuffle, worker processes, a checkpointable
iterator resumed in a new process, and Keras 3 ``fit`` trained on it.

grain comes with the test extra: without it this module fails to import (loudly), it is
never skipped."""

from __future__ import annotations

import textwrap
from pathlib import Path

import grain
import numpy as np
import pytest
from conftest import run_json_script, write_pairs

import tfshards

pytestmark = pytest.mark.timeout(300)
# Grain 0.2.18 reads an Abseil flag in its worker processes before any flags are parsed
# when JAX is installed (google/grain#1355, fixed after that release): scripts that do not
# start through absl.app mark the flags parsed, as docs/frameworks.md says.
_FLAGS_PARSED = "from absl import flags; flags.FLAGS.mark_as_parsed()"


@pytest.fixture(autouse=True, scope="module")
def _absl_flags_parsed() -> None:
    exec(_FLAGS_PARSED)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grain")
    images, masks = write_pairs(root / "data", count=30)
    out = root / "shards"
    tfshards.convert(images, masks, out, num_shards=3, encoding="raw", progress=False)
    return out


def test_shuffled_batches_hold_every_pair_once(dataset: Path) -> None:
    pairs = tfshards.Pairs(dataset, with_keys=True)
    batches = list(grain.MapDataset.source(pairs).shuffle(seed=1).batch(8))
    assert [len(b[2]) for b in batches] == [8, 8, 8, 6]
    keys = [str(k) for b in batches for k in b[2]]
    assert sorted(keys) == sorted(pairs.key(i) for i in range(30))
    assert keys != [pairs.key(i) for i in range(30)]
    images, masks, _ = batches[0]
    assert images.shape == (8, 24, 32, 3) and images.dtype == np.uint8
    assert masks.shape == (8, 24, 32, 1) and masks.dtype == np.uint8


def test_worker_processes_give_the_same_batches(dataset: Path) -> None:
    pairs = tfshards.Pairs(dataset, with_keys=True)
    ordered = grain.MapDataset.source(pairs).shuffle(seed=2).batch(5)
    parallel = ordered.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    expected = [list(map(str, keys)) for _, _, keys in ordered]
    assert [list(map(str, keys)) for _, _, keys in parallel] == expected


_RUN = textwrap.dedent(
    """
    import json, sys, grain, tfshards
    from absl import flags; flags.FLAGS.mark_as_parsed()

    dataset, state_file, mode = sys.argv[1:4]
    pairs = tfshards.Pairs(dataset, with_keys=True)
    ds = grain.MapDataset.source(pairs).shuffle(seed=4).repeat(2).batch(4)
    iterator = iter(ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    if mode == "resume":
        iterator.set_state(json.load(open(state_file)))
    batches = []
    for number, (images, masks, keys) in enumerate(iterator):
        batches.append([[str(k) for k in keys], int(images.sum()), int(masks.sum())])
        if mode == "interrupt" and number == 9:
            json.dump(iterator.get_state(), open(state_file, "w"))
            break
    print(json.dumps(batches))
    """
)


def _run(dataset: Path, state: Path, mode: str) -> list:
    return run_json_script(_RUN, dataset, state, mode)


def test_checkpointed_iterator_resumes_exactly_in_a_new_process(
    dataset: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    whole = _run(dataset, state, "whole")
    first = _run(dataset, state, "interrupt")  # stops inside the second epoch
    rest = _run(dataset, state, "resume")
    assert len(whole) == 15 and first == whole[:10]
    assert rest == whole[10:]


def test_keras_fit_trains_on_a_grain_dataset(dataset: Path) -> None:
    import keras

    pairs = tfshards.Pairs(dataset)
    batches = grain.MapDataset.source(pairs).shuffle(seed=5).batch(6, drop_remainder=True)
    model = keras.Sequential(
        [
            keras.Input((24, 32, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(3, 1, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    # Repeated, with steps_per_epoch: Keras knows the epoch's length (fed the finite
    # dataset it finds the end by running out, and counts one optimizer step more).
    history = model.fit(batches.repeat(), epochs=2, steps_per_epoch=len(batches), verbose=0)
    assert len(history.history["loss"]) == 2
    assert all(np.isfinite(history.history["loss"]))
    assert model.optimizer.iterations.numpy() == 2 * (30 // 6)
