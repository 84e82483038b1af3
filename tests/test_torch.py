"""tfshards.Pairs under PyTorch: DataLoader workers (fork and spawn), the CHW float
transform, and torchdata's StatefulDataLoader resuming exactly in a new process.

torch and torchdata come with the test extra: without them this module fails to import
(loudly), it is never skipped."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_json_script, write_pairs
from torch.utils.data import DataLoader

import tfshards

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch")
    images, masks = write_pairs(root / "data", count=37)
    out = root / "shards"
    tfshards.convert(images, masks, out, num_shards=4, encoding="deflate", progress=False)
    return out


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_dataloader_workers_give_each_pair_once_per_epoch(dataset: Path, start: str) -> None:
    pairs = tfshards.Pairs(dataset, with_keys=True)
    loader = DataLoader(
        pairs,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=start,
        persistent_workers=True,
    )
    expected = {pairs.key(i): pairs[i] for i in range(len(pairs))}
    orders = []
    for _ in range(2):
        keys = []
        for images, masks, batch_keys in loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == (24, 32, 3)
            assert masks.dtype == torch.uint8 and masks.shape[1:] == (24, 32, 1)
            for image, mask, key in zip(images, masks, batch_keys, strict=True):
                assert np.array_equal(image.numpy(), expected[key][0])
                assert np.array_equal(mask.numpy(), expected[key][1])
            keys += batch_keys
        assert sorted(keys) == sorted(expected)  # each pair once
        orders.append(keys)
    assert orders[0] != orders[1]  # shuffled again each epoch


def test_fork_workers_beside_a_validation_thread_on_the_same_pairs_never_hang(
    dataset: Path,
) -> None:
    """Workers forked each epoch while another thread reads the same ``Pairs``: a
    worker forked while that thread held the reader's lock once waited for ever."""
    pairs = tfshards.Pairs(dataset, with_keys=True)
    pairs.records.open_files = 1  # every change of shard closes and opens under the lock
    keys = sorted(pairs.key(i) for i in range(len(pairs)))
    loader = DataLoader(
        pairs,
        batch_size=4,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=False,
        timeout=120,  # a hung worker: an error after two minutes, not a hung test
    )
    stop = threading.Event()

    def validate() -> None:
        rng = np.random.default_rng(0)
        while not stop.is_set():
            pairs.__getitems__(rng.integers(0, len(pairs), 4).tolist())  # a shard change each

    thread = threading.Thread(target=validate)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the thread is often caught inside the lock at a fork
    thread.start()
    try:
        for _ in range(10):
            assert sorted(key for *_, batch in loader for key in batch) == keys
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)


def test_chw_float_transform_batches_for_a_loss(dataset: Path) -> None:
    loader = DataLoader(tfshards.Pairs(dataset, transform=tfshards.torch_pair), batch_size=5)
    images, masks = next(iter(loader))
    assert images.dtype == torch.float32 and images.shape == (5, 3, 24, 32)
    assert masks.dtype == torch.int64 and masks.shape == (5, 24, 32)
    assert images.min() >= 0.0 and images.max() <= 1.0
    logits = torch.zeros(5, 3, 24, 32)
    assert torch.nn.functional.cross_entropy(logits, masks).item() == pytest.approx(np.log(3))


def test_float_chw_transform_gives_reads_float32_values_bit_for_bit(dataset: Path) -> None:
    pairs = tfshards.Pairs(dataset, transform=tfshards.torch_pair)
    batches = tfshards.read(dataset, batch_size=len(pairs), shuffle=False, cache=False)
    expected_images, expected_masks = (t.numpy() for t in next(iter(batches)))
    for index in range(len(pairs)):
        image, mask = pairs[index]
        assert image.numpy().tobytes() == expected_images[index].transpose(2, 0, 1).tobytes()
        np.testing.assert_array_equal(mask.numpy(), expected_masks[index][:, :, 0])


_RUN = textwrap.dedent(
    """
    import json, sys, torch, tfshards
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset, state_file, mode = sys.argv[1:4]
    loader = StatefulDataLoader(
        tfshards.Pairs(dataset, with_keys=True), batch_size=4, shuffle=True,
        num_workers=2, generator=torch.Generator().manual_seed(7),
    )
    if mode == "resume":
        loader.load_state_dict(torch.load(state_file, weights_only=False))
    batches = []
    for number, (images, masks, keys) in enumerate(loader):
        batches.append([list(keys), int(images.sum()), int(masks.sum())])
        if mode == "interrupt" and number == 2:
            torch.save(loader.state_dict(), state_file)
            break
    print(json.dumps(batches))
    """
)


def _run(dataset: Path, state: Path, mode: str) -> list:
    return run_json_script(_RUN, dataset, state, mode)


def test_stateful_dataloader_resumes_exactly_in_a_new_process(
    dataset: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state.pt"
    whole = _run(dataset, state, "whole")
    first = _run(dataset, state, "interrupt")
    rest = _run(dataset, state, "resume")  # another process, from the saved state only
    assert len(whole) == 10 and first == whole[:3]
    assert rest == whole[3:]
    keys = [key for batch in first + rest for key in batch[0]]
    assert len(keys) == len(set(keys)) == 37
