"""Step 5: merged rectangles are disjoint, cover exactly the mask, and merge."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dcjax.matching import match, rectangles
from tests.matching.frames import photo, shifted_pair


def _paint(shape, rects):
    """Count how many rectangles cover each pixel."""
    cover = np.zeros(shape, int)
    for y, x, h, w in rects:
        assert h > 0 and w > 0
        cover[y : y + h, x : x + w] += 1
    return cover


@settings(max_examples=50, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 12), st.integers(1, 12))))
def test_rectangles_partition_any_mask(mask):
    rects = rectangles(mask)
    np.testing.assert_array_equal(_paint(mask.shape, rects), mask.astype(int))
    # Vertically merged: no rectangle could extend into the one right below it.
    ends = {(y + h, x, w) for y, x, h, w in rects}
    assert not any((y, x, w) in ends for y, x, h, w in rects)


@settings(max_examples=30, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 5), st.integers(1, 5))), st.integers(1, 4))
def test_block_masks_merge_into_at_most_one_rectangle_per_block(blocks, bs):
    mask = np.kron(blocks, np.ones((bs, bs), bool))
    rects = rectangles(mask)
    np.testing.assert_array_equal(_paint(mask.shape, rects), mask.astype(int))
    assert len(rects) <= blocks.sum()
    # Every corner lies on the block grid: blocks are merged whole.
    assert all(y % bs == 0 and x % bs == 0 and h % bs == 0 and w % bs == 0 for y, x, h, w in rects)


def test_examples():
    full = np.ones((30, 40), bool)
    assert rectangles(full) == [(0, 0, 30, 40)]
    assert rectangles(np.zeros((5, 5), bool)) == []
    l_shape = np.zeros((4, 4), bool)
    l_shape[:, 0] = True
    l_shape[3, :] = True
    assert rectangles(l_shape) == [(0, 0, 3, 1), (3, 0, 1, 4)]


def test_rectangles_of_a_match_map_to_matching_content():
    motion = (2, -3)
    prev, cur = shifted_pair(photo("astronaut"), motion)
    m = match(prev, cur)
    rects = rectangles(m)
    assert len(rects) < int(np.asarray(m.mask)[::10, ::10].sum())  # blocks did merge
    for y, x, h, w in rects:
        a = cur[y : y + h, x : x + w]
        b = prev[y + motion[0] : y + motion[0] + h, x + motion[1] : x + motion[1] + w]
        np.testing.assert_array_equal(a, b)


def test_batched_mask_is_rejected():
    with pytest.raises(ValueError, match="one"):
        rectangles(np.zeros((2, 4, 4), bool))
