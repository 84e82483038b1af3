"""Every read() path builds and reads with and without a global seed and op determinism
(issue 29 point 0: the cached path crashed after keras.utils.set_random_seed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_pairs

import tfshards

SCRIPT = """
import sys, keras, tensorflow as tf, tfshards
mode, path, variable, cache_root = sys.argv[1:5]
if mode in ("seed", "determinism"):
    keras.utils.set_random_seed(0)
if mode == "determinism":
    tf.config.experimental.enable_op_determinism()
reads = 0
for cache in (None, "memory", cache_root):
    for dtype in ("uint8", "float32"):
        for shuffle, seed in ((False, None), (True, None), (True, 0)):
            sizing = dict(pad_to=(24, 32)) if variable == "variable" else {}
            ds = tfshards.read(path, batch_size=3, image_dtype=dtype, cache=cache,
                               shuffle=shuffle, seed=seed, **sizing)
            for _ in range(2):  # the pass that builds a cache, then the one that reads it
                pairs = sum(int(image.shape[0]) for image, _ in ds)
                assert pairs == 10, (cache, dtype, shuffle, seed, pairs)
            reads += 1
print("reads", reads)
"""


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("global_seed")
    images, masks = write_pairs(root / "data", count=10, size=(24, 32))
    fixed = root / "fixed"
    tfshards.convert(images, masks, fixed, options=tfshards.ConvertOptions(num_shards=2))
    for index, size in enumerate([(20, 28), (24, 32), (16, 24)]):
        write_pairs(root / "mixed", count=1, size=size, seed=index)
        (root / "mixed" / "images" / "000.png").rename(root / "mixed" / "images" / f"s{index}.png")
        (root / "mixed" / "masks" / "000.png").rename(root / "mixed" / "masks" / f"s{index}.png")
    images, masks = write_pairs(root / "mixed", count=7, size=(24, 32), seed=9)
    variable = root / "variable"
    tfshards.convert(images, masks, variable, options=tfshards.ConvertOptions(num_shards=2))
    return {"fixed": fixed, "variable": variable}


@pytest.mark.parametrize("mode", ["none", "seed", "determinism"])
@pytest.mark.parametrize("kind", ["fixed", "variable"])
def test_every_read_path_under_a_global_seed(datasets, tmp_path, mode, kind):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    args = [sys.executable, "-c", SCRIPT, mode, str(datasets[kind]), kind, str(tmp_path / "c")]
    run = subprocess.run(args, capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "reads 18" in run.stdout
