"""The stream matcher's per-pixel cap (`dcjax.matching.matcher`): the opening
of the pixels over it by a square."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dcjax.matching.matcher import opened


def _opened_by_loops(flags: np.ndarray, k: int) -> np.ndarray:
    """A flag survives when some k x k square inside the map holds it and only flags."""
    h, w = flags.shape
    out = np.zeros_like(flags)
    for y in range(h - k + 1):
        for x in range(w - k + 1):
            if flags[y : y + k, x : x + k].all():
                out[y : y + k, x : x + k] = True
    return out


@settings(max_examples=40, deadline=None)
@given(
    flags=hnp.arrays(bool, st.tuples(st.integers(1, 9), st.integers(1, 9))),
    k=st.integers(1, 4),
)
def test_opened_keeps_exactly_the_flags_inside_a_full_square(flags, k):
    np.testing.assert_array_equal(np.asarray(opened(flags, k)), _opened_by_loops(flags, k))


def test_opened_drops_isolated_pixels_and_lines_and_keeps_blobs():
    flags = np.zeros((8, 10), bool)
    flags[1, 1] = True  # an isolated pixel
    flags[5, 2:9] = True  # a line one pixel thick
    flags[1:4, 5:8] = True  # a 3x3 blob
    got = np.asarray(opened(flags, 2))
    want = np.zeros_like(flags)
    want[1:4, 5:8] = True
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(opened(flags, 1)), flags)
