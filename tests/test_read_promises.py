"""What read() promises beyond streaming: the pixels conversion checked, the dtypes asked
for, arguments checked by tfshards, manifests that agree with their records (issue 28)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write_pairs

import tfshards
from tfshards import OptionsError, convert

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("promises")
    images, masks = write_pairs(root / "data", 10, size=(16, 12))
    convert(images, masks, root / "shards", num_shards=2, workers=1, progress=False)
    return root / "shards"


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"cache": ""}, r"cache='' is neither 'memory' nor a folder"),
        ({"cache": "Memory"}, r"cache='Memory' is neither 'memory' nor a folder"),
        ({"cache": "disk"}, r"cache='disk' is neither"),
        ({"image_size": 20}, r"image_size must be \(height, width\), two positive .*got 20"),
        ({"image_size": (20, 0)}, r"image_size must be .*got \(20, 0\)"),
        ({"crop_size": 16}, r"crop_size must be \(height, width\), two positive .*got 16"),
        ({"pad_to": (16.5, 12)}, r"pad_to must be .*got \(16.5, 12\)"),
        ({"batch_size": 2.5}, r"batch_size must be an integer of at least 1, got 2.5"),
        ({"batch_size": True}, r"batch_size must be an integer of at least 1, got True"),
        ({"seed": 1.5}, r"seed must be an integer or None, got 1.5"),
        ({"seed": "1"}, r"seed must be an integer or None, got '1'"),
    ],
)
def test_bad_arguments_are_refused_by_tfshards(small, tmp_path, monkeypatch, arguments, match):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptionsError, match=match):
        tfshards.read(small, **arguments)
    assert list(tmp_path.iterdir()) == [], "nothing is written into the current folder"


def test_numpy_integers_and_a_folder_named_like_a_keyword_are_accepted(small, tmp_path):
    ds = tfshards.read(small, batch_size=np.int64(4), seed=np.int32(1), image_size=(8, 8))
    assert next(iter(ds))[0].shape == (4, 8, 8, 3)
    tfshards.read(small, batch_size=4, cache=tmp_path / "Memory")  # a Path is a folder


def test_pad_to_smaller_than_fixed_size_records_says_so_at_read(small):
    with pytest.raises(OptionsError, match=r"a record is larger than pad_to=\(8, 12\).*16x12"):
        tfshards.read(small, pad_to=(8, 12))
    images, _ = next(iter(tfshards.read(small, pad_to=(20, 12), batch_size=2)))
    assert images.shape == (2, 20, 12, 3)
