"""Crop placement (readers/crops.py): pure NumPy, keyed by (seed, epoch, batch, position)."""

from __future__ import annotations

import numpy as np

from tfshards.readers.crops import crop_boxes, crop_corners, cut, pad_boxes, uniform_draws


def test_draws_are_keyed_by_seed_epoch_batch_and_position_alone():
    draws = uniform_draws(1, 2, 3, np.arange(8))
    assert draws.shape == (8, 3) and np.all((draws >= 0) & (draws < 1))
    # A position's draws do not depend on the others asked with it, nor their order.
    assert np.array_equal(uniform_draws(1, 2, 3, np.array([5, 2]))[0], draws[5])
    for other in [(0, 2, 3), (1, 0, 3), (1, 2, 0)]:
        assert not np.array_equal(uniform_draws(*other, np.arange(8)), draws)
    assert len({tuple(row) for row in draws}) == 8


def test_uniform_corners_lie_inside_and_reach_every_place():
    heights, widths = np.full(4000, 12), np.full(4000, 300)
    draws = uniform_draws(0, 0, 0, np.arange(4000))[:, 1:]
    corners = crop_corners(heights, widths, (10, 256), draws)
    assert corners[:, 0].min() == 0 and corners[:, 0].max() == 2
    assert corners[:, 1].min() == 0 and corners[:, 1].max() == 44
    assert np.all(np.bincount(corners[:, 0]) > 1000)


def test_smaller_records_get_corner_zero_and_centres_are_clamped():
    heights, widths = np.array([8, 300, 300, 300]), np.array([8, 300, 300, 300])
    draws = np.full((4, 2), 0.999)
    centres = np.array([[4, 4], [150, 150], [np.nan, 3.0], [-1, -1]], float)
    corners = crop_corners(heights, widths, (256, 256), draws, centres)
    assert corners.tolist() == [[0, 0], [22, 22], [44, 44], [44, 44]]
    corners = crop_corners(heights, widths, (256, 256), draws, np.array([[0, 0]] + [[299, 0]] * 3))
    assert corners[1:].tolist() == [[44, 0]] * 3


def test_scaled_boxes_and_pads():
    draws = np.array([[0.0, 0.5, 0.5], [0.999999, 0.0, 0.0]])
    boxes = crop_boxes(np.array([100, 100]), np.array([40, 40]), (32, 32), draws, (0.5, 2.0))
    assert boxes.tolist() == [[50, 20, 9, 0], [200, 80, 0, 0]]
    assert pad_boxes(np.array([3]), np.array([4])).tolist() == [[3, 4, 0, 0]]


def test_cut_copies_each_crop_and_pads_smaller_records():
    big = np.arange(6 * 7 * 2, dtype=np.uint8).reshape(6, 7, 2)
    small = np.full((2, 3, 2), 9, np.uint8)
    images = [big, small]
    masks = [big[:, :, :1] + 1, small[:, :, :1] + 1]
    boxes = np.array([[6, 7, 6, 7, 2, 3], [2, 3, 2, 3, 0, 0]])
    out_images = np.full((2, 4, 4, 2), 77, np.uint8)  # whatever was there before
    out_masks = np.full((2, 4, 4, 1), 77, np.int32)
    cut(images, masks, boxes, out_images, out_masks, fill_label=255)
    assert np.array_equal(out_images[0], big[2:6, 3:7])
    assert np.array_equal(out_masks[0], big[2:6, 3:7, :1] + 1)
    assert np.array_equal(out_images[1, :2, :3], small) and not out_images[1, 2:].any()
    assert not out_images[1, :2, 3:].any()
    assert np.all(out_masks[1, :2, :3] == 10) and np.all(out_masks[1, 2:] == 255)
    assert np.all(out_masks[1, :2, 3:] == 255)
