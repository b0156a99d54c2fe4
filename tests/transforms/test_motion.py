"""The frame's context (`dcjax.transforms.motion.FrameContext`): the rows of a
refresh band at each layer's stride, and what a frame may reuse."""

from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.transforms.motion import FrameContext
from dcjax.transforms.spatial import Spatial


def _sig(size, stride):
    return Spatial(axes=(0, 1), size=size, stride=(Fraction(stride), Fraction(stride)))


def _ctx(start, stop):
    band = (jnp.int32(start), jnp.int32(stop))
    return FrameContext(jnp.zeros((2,), jnp.int32), "exact", band=band)


@pytest.mark.parametrize(
    ("size", "stride", "start", "stop", "rows"),
    [
        ((24, 5), 1, 8, 16, range(8, 16)),  # the input: the band's rows
        ((12, 5), 2, 8, 16, range(4, 8)),  # position i covers rows 2i, 2i + 1
        ((12, 5), 2, 7, 15, range(3, 8)),  # an odd edge takes the position it meets
        ((6, 5), 4, 0, 8, range(0, 2)),
        ((48, 5), Fraction(1, 2), 8, 16, range(16, 32)),  # upsampled: two per row
        ((24, 5), 1, 0, 0, ()),  # a frame without a band
    ],
)  # fmt: skip
def test_the_band_at_a_stride_covers_the_positions_over_its_rows(size, stride, start, stop, rows):
    ctx = _ctx(start, stop)
    sig = _sig(size, stride)
    want = np.zeros(size, bool)
    want[list(rows)] = True
    np.testing.assert_array_equal(np.asarray(ctx.banded(sig)), want)
    np.testing.assert_array_equal(np.asarray(ctx.unforced(sig)), ~want)


def test_without_bands_nothing_is_banded_and_unforced_is_the_guard_alone():
    ctx = FrameContext(jnp.zeros((2,), jnp.int32), "exact")
    assert ctx.banded(_sig((8, 8), 1)) is False
    assert ctx.unforced(_sig((8, 8), 1)) is True  # no guard either
