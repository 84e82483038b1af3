"""The Beam runner writes the same bytes as the local converter."""

from __future__ import annotations

import pytest
from conftest import convert_args, shard_bytes, write_pairs
from PIL import Image

from tfshards import convert
from tfshards.cli import main

pytest.importorskip("apache_beam")
from tfshards.converters.beam import beam_runner  # noqa: E402

BEAM_ARGS = "--runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_threading"


def test_beam_and_local_output_are_byte_identical(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 40)
    kwargs = dict(num_shards=4, val_fraction=0.2, num_classes=3, seed=5, progress=False)
    local = convert(images, masks, tmp_path / "local", workers=2, **kwargs)
    beam = convert(images, masks, tmp_path / "beam", runner=beam_runner(BEAM_ARGS), **kwargs)
    assert beam == local
    assert shard_bytes(tmp_path / "beam") == shard_bytes(tmp_path / "local")
    assert len(shard_bytes(tmp_path / "beam")) == 4 + 1 + 1 + 2  # shards, manifest, tables


def test_beam_conversion_error_names_the_pair_and_leaves_no_manifest(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 8)
    Image.new("L", (3, 3)).save(masks / "004.png")
    with pytest.raises(Exception, match=r"pair '004': mask file .*004.png: mask is 3x3"):
        convert(images, masks, tmp_path / "out", runner=beam_runner(BEAM_ARGS), progress=False)
    assert not (tmp_path / "out" / "tfshards.json").exists()


def test_cli_runner_beam(tmp_path, capsys):
    images, masks = write_pairs(tmp_path / "data", 10)
    flags = [f"--beam-option={flag}" for flag in BEAM_ARGS.split()]
    command = [
        *convert_args(images, masks, tmp_path / "out"),
        "--runner",
        "beam",
        *flags,
    ]
    assert main(command) == 0
    assert "10 pairs" in capsys.readouterr().out
