from __future__ import annotations

from pathlib import Path

import pytest

from tfshards.converters.pairing import checked_pairs, pair_files
from tfshards.errors import OptionsError, PairingError


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_pairs_by_relative_path_without_extension_in_subfolders(tmp_path):
    for rel in ("a/001.jpg", "a/002.png", "b/c/003.jpeg", "004.png"):
        touch(tmp_path / "img" / rel)
    for rel in ("a/001.png", "a/002.png", "b/c/003.png", "004.png"):
        touch(tmp_path / "msk" / rel)
    report = pair_files(tmp_path / "img", tmp_path / "msk")
    assert [p.key for p in report.pairs] == ["004", "a/001", "a/002", "b/c/003"]
    assert report.pairs[1].image.name == "001.jpg" and report.pairs[1].mask.name == "001.png"
    assert report.problems == []


def test_one_folder_with_prefix_patterns(tmp_path):
    for key in ("x1", "x2"):
        touch(tmp_path / f"image_{key}.png")
        touch(tmp_path / f"mask_{key}.png")
    touch(tmp_path / "notes.txt")
    report = pair_files(
        tmp_path, None, image_pattern="image_{key}.png", mask_pattern="mask_{key}.png"
    )
    assert [(p.key, p.image.name, p.mask.name) for p in report.pairs] == [
        ("x1", "image_x1.png", "mask_x1.png"),
        ("x2", "image_x2.png", "mask_x2.png"),
    ]
    assert report.ignored_files == 1


def test_suffix_style_patterns(tmp_path):
    touch(tmp_path / "sub" / "cat.png")
    touch(tmp_path / "sub" / "cat_mask.png")
    report = pair_files(
        tmp_path, tmp_path, image_pattern="{key}.png", mask_pattern="{key}_mask.png"
    )
    # 'cat_mask.png' also matches '{key}.png' as key 'cat_mask' and stays unpaired
    assert [p.key for p in report.pairs] == ["sub/cat"]
    assert [p.name for p in report.unmatched_images] == ["cat_mask.png"]


def test_orphans_are_reported_with_counts_and_paths(tmp_path):
    for i in range(8):
        touch(tmp_path / "img" / f"{i}.png")
    for i in range(2, 9):
        touch(tmp_path / "msk" / f"{i}.png")
    report = pair_files(tmp_path / "img", tmp_path / "msk")
    assert len(report.pairs) == 6
    with pytest.raises(PairingError, match=r"2 images without a mask: .*0\.png.*1\.png"):
        checked_pairs(report, allow_unpaired=False, where="img")
    with pytest.raises(PairingError, match=r"1 masks without an image: .*8\.png"):
        checked_pairs(report, allow_unpaired=False, where="img")
    assert len(checked_pairs(report, allow_unpaired=True, where="img")) == 6


def test_duplicate_keys_are_reported(tmp_path):
    touch(tmp_path / "img" / "1.png")
    touch(tmp_path / "img" / "1.jpg")
    touch(tmp_path / "img" / "2.png")
    touch(tmp_path / "msk" / "1.png")
    touch(tmp_path / "msk" / "2.png")
    report = pair_files(tmp_path / "img", tmp_path / "msk")
    assert list(report.duplicate_keys) == ["1"]
    assert [p.key for p in report.pairs] == ["2"]
    with pytest.raises(PairingError, match="1 keys claimed by more than one file: '1'"):
        checked_pairs(report, allow_unpaired=False, where="img")


def test_non_image_and_hidden_files_are_ignored_and_counted(tmp_path):
    touch(tmp_path / "img" / "1.png")
    touch(tmp_path / "img" / "readme.md")
    touch(tmp_path / "img" / ".DS_Store")
    touch(tmp_path / "msk" / "1.png")
    report = pair_files(tmp_path / "img", tmp_path / "msk")
    assert len(report.pairs) == 1 and report.ignored_files == 2


def test_empty_input_says_so(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "msk").mkdir()
    report = pair_files(tmp_path / "img", tmp_path / "msk")
    with pytest.raises(PairingError, match="no image/mask pairs found"):
        checked_pairs(report, allow_unpaired=True, where="img")


def test_missing_folder_and_bad_patterns(tmp_path):
    with pytest.raises(OptionsError, match="not a folder"):
        pair_files(tmp_path / "nope", tmp_path)
    with pytest.raises(OptionsError, match="exactly once"):
        pair_files(tmp_path, tmp_path, image_pattern="img.png", mask_pattern="{key}.png")
    with pytest.raises(OptionsError, match="both --image-pattern and --mask-pattern"):
        pair_files(tmp_path, tmp_path, image_pattern="{key}.png")
    with pytest.raises(OptionsError, match="give --image-pattern"):
        pair_files(tmp_path, tmp_path)


def test_symlink_loop_does_not_hang(tmp_path):
    touch(tmp_path / "img" / "1.png")
    (tmp_path / "img" / "loop").symlink_to(tmp_path / "img")
    touch(tmp_path / "msk" / "1.png")
    report = pair_files(tmp_path / "img", tmp_path / "msk")
    assert [p.key for p in report.pairs] == ["1"]


def test_listing_streams_names_and_skips_hidden_folders_and_folder_links(tmp_path):
    from tfshards.converters.pairing import list_names

    for name in ("a/1.png", "a/b/2.png", ".hidden/3.png", "4.png", ".5.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "loop").symlink_to(tmp_path)
    names = list_names(str(tmp_path))
    assert iter(names) is names  # a generator: nothing is listed up front
    assert sorted(names) == [".5.png", "4.png", "a/1.png", "a/b/2.png"]
